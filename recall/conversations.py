"""The write path's domain: validate a posted conversation, lay it out on disk in funes format.

On-disk layout (the contract both engines read, see docs/CONTRACTS.md):

    DATA_DIR/<first 24 hex of sha256(user)>/src/<conversation_id>.funes.jsonl

One file per conversation, the whole conversation, rewritten atomically on every post that
changes it; a post that the stored file already holds (the same version, or an older snapshot of a
longer one) writes nothing. Writers of one conversation take its lock, src/.<conversation_id>.lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from recall.redaction import Redactor

HARNESS = "gateway"  # funes wants [a-z0-9_-]; names the producer of these transcripts
SOURCE_SUFFIX = ".funes.jsonl"
ROLES = frozenset({"user", "assistant", "system", "tool"})
# A turn the gateway marks "recalled": true (the agent used our tool while producing it) is kept,
# so the conversation stays whole, but no engine returns it as a passage: a wrong answer built
# from memory must not become a memory. funes format 1 allows no field of our own, so the mark
# is the block's type: our gateway's turns are "text" blocks, a recalled one a "tool_result"
# block naming our tool (docs/CONTRACTS.md).
RECALLED_BLOCK_TYPE = "tool_result"
RECALLED_TOOL_NAME = "recall_my_conversations"

CONVERSATION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
REF_CHARS = 12  # a conversation's reference: 48 bits, no two of one user's conversations share one
REF = re.compile(rf"[0-9a-f]{{{REF_CHARS}}}")
SAFE_TURN_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # funes refuses ':'; we also keep ids path-safe
# RFC 3339 with a mandatory offset or Z; fromisoformat alone would accept naive local times.
RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})"
)
# A turn's time is the gateway's; a clock a little ahead is skew, but a turn stamped days ahead
# (or in year 9999) is a bug upstream and would sort first in every answer: refused beyond this.
MAX_HOURS_AHEAD = 24
# JSON may escape half of a UTF-16 pair on its own ("\ud83d": a gateway that cut a string inside
# an emoji); Python decodes it to a lone surrogate, which UTF-8 cannot encode. A pair decodes whole.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Everything under DATA_DIR is the owner's only (conversations, indexes, tombstones, receipts,
# keys): explicit modes where we create things, and this umask for what libraries create
# (SQLite's database and WAL files, funes' memory, index worker processes, which inherit it).
PRIVATE_UMASK = 0o077
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


class InvalidConversation(ValueError):
    """A refused body; the message starts with the offending field, e.g. ``turns[2].ts: ...``."""


@dataclass(frozen=True)
class Limits:
    max_turns: int = 5_000
    max_text_chars: int = 200_000
    max_user_chars: int = 256
    # Credentials in turn text become [REDACTED:<kind>] before anything is written.
    redactor: Redactor = field(default_factory=Redactor)


@dataclass(frozen=True)
class Conversation:
    user: str
    conversation_id: str
    lines: list[dict[str, Any]]  # funes format 1 turns, ready to serialise
    # How many of each kind of credential were redacted (kinds and counts only: for the log).
    redactions: Counter[str] = field(default_factory=Counter)

    def redaction_summary(self) -> str:
        """``jwt=2, aws_access_key=1``: safe to log, it names no value."""
        return ", ".join(f"{kind}={n}" for kind, n in sorted(self.redactions.items()))

    def to_jsonl(self) -> str:
        return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in self.lines)


def user_dir_name(user: str) -> str:
    """Directory name for a user: a hash, so no user id ever appears on disk or in logs."""
    return hashlib.sha256(user.encode("utf-8")).hexdigest()[:24]


def conversation_ref(user: str, conversation_id: str) -> str:
    """The reference by which the agent reads one of a user's conversations (``user`` is the
    user's hash; recall/reading.py): derived, never stored, so the same after a restart and on
    every replica; it names neither the gateway's id nor a path."""
    return hashlib.sha256(f"{user}/{conversation_id}".encode()).hexdigest()[:REF_CHARS]


def place(user: str, conversation_id: str, seq: int) -> str:
    """What a passage header ends with: where `read_my_conversation` reads the passage's turn
    (turns numbered from 1)."""
    return f"ref {conversation_ref(user, conversation_id)} turn {seq + 1}"


def _text(
    value: Any, field: str, *, max_chars: int, allow_empty: bool = False, repair: bool = False
) -> str:
    """A checked string; `repair` turns lone surrogates into U+FFFD instead of refusing them."""
    if not isinstance(value, str):
        raise InvalidConversation(f"{field}: must be a string")
    if LONE_SURROGATE.search(value):
        if not repair:
            raise InvalidConversation(f"{field}: contains a lone UTF-16 surrogate")
        value = LONE_SURROGATE.sub("\ufffd", value)
    if not allow_empty and not value.strip():
        raise InvalidConversation(f"{field}: must not be empty")
    if len(value) > max_chars:
        raise InvalidConversation(f"{field}: longer than {max_chars} characters")
    if "\x00" in value:
        raise InvalidConversation(f"{field}: contains a NUL character")
    return value


def _utc_moment(value: Any, field: str) -> datetime:
    if not isinstance(value, str) or not RFC3339.fullmatch(value):
        raise InvalidConversation(f"{field}: must be an RFC 3339 timestamp with Z or an offset")
    try:
        moment = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidConversation(f"{field}: not a valid date and time") from exc
    try:
        return moment.astimezone(UTC)
    except OverflowError as exc:  # 0001-01-01T00:30:00+01:00 is in year 0 in UTC
        raise InvalidConversation(f"{field}: outside the years 0001 to 9999 in UTC") from exc


def _utc_text(moment: datetime) -> str:
    """``...Z`` to the second, as stored. isoformat, not strftime: strftime("%Y") drops the
    zeros of years before 1000 on Linux."""
    return moment.replace(tzinfo=None, microsecond=0).isoformat() + "Z"


def _utc_timestamp(value: Any, field: str) -> str:
    return _utc_text(_utc_moment(value, field))


def safe_turn_id(raw: str) -> str:
    """The id funes will see: the gateway's own when safe, else a stable hash of it."""
    if SAFE_TURN_ID.fullmatch(raw):
        return raw
    return "h-" + hashlib.sha256(raw.encode("utf-8")).hexdigest()[:24]


def parse_conversation(body: Any, limits: Limits = Limits()) -> Conversation:
    """Validate a ``POST /turns`` body and convert it; InvalidConversation names the field."""
    if not isinstance(body, dict):
        raise InvalidConversation("body: must be a JSON object")
    user = _text(body.get("user"), "user", max_chars=limits.max_user_chars)
    cid = body.get("conversation_id")
    if not isinstance(cid, str) or not CONVERSATION_ID.fullmatch(cid):
        raise InvalidConversation("conversation_id: must match [A-Za-z0-9_-]{1,128}")
    turns = body.get("turns")
    if not isinstance(turns, list) or not turns:
        raise InvalidConversation("turns: must be a non-empty list")
    if len(turns) > limits.max_turns:
        raise InvalidConversation(f"turns: more than {limits.max_turns} turns")

    lines: list[dict[str, Any]] = []
    seen: set[str] = set()
    redactions: Counter[str] = Counter()
    horizon = datetime.now(UTC) + timedelta(hours=MAX_HOURS_AHEAD)
    for seq, turn in enumerate(turns):
        where = f"turns[{seq}]"
        if not isinstance(turn, dict):
            raise InvalidConversation(f"{where}: must be an object")
        role = turn.get("role")
        if not isinstance(role, str) or role not in ROLES:  # a list or object is unhashable
            raise InvalidConversation(f"{where}.role: must be one of {', '.join(sorted(ROLES))}")
        text = _text(  # a cut character in text becomes U+FFFD: the conversation keeps flowing
            turn.get("text"),
            f"{where}.text",
            max_chars=limits.max_text_chars,
            allow_empty=True,
            repair=True,
        )
        text, found = limits.redactor.redact(text)  # before any byte of it reaches disk
        redactions.update(found)
        moment = _utc_moment(turn.get("ts"), f"{where}.ts")
        if moment > horizon:
            raise InvalidConversation(
                f"{where}.ts: more than {MAX_HOURS_AHEAD} hours ahead of the server's clock"
            )
        ts = _utc_text(moment)
        recalled = turn.get("recalled", False)
        if not isinstance(recalled, bool):
            raise InvalidConversation(f"{where}.recalled: must be true or false")
        raw_id = turn.get("id")
        if raw_id is None:
            turn_id = f"{cid}-{seq}"
        else:
            turn_id = safe_turn_id(_text(raw_id, f"{where}.id", max_chars=256))
        if turn_id in seen:
            raise InvalidConversation(f"{where}.id: duplicate turn id in this conversation")
        seen.add(turn_id)
        lines.append(
            {
                "format": 1,
                "session_id": cid,
                "turn_uuid": turn_id,
                "seq": seq,
                "ts": ts,
                "role": role,
                "harness": HARNESS,
                "blocks": [
                    recalled_block(text) if recalled else {"block_type": "text", "text": text}
                ],
            }
        )
    return Conversation(user=user, conversation_id=cid, lines=lines, redactions=redactions)


def parse_audit_request(body: Any, limits: Limits = Limits()) -> tuple[str, str | None]:
    """``POST /audit``'s body: the user, and ``since`` as a UTC ...Z time when given."""
    if not isinstance(body, dict):
        raise InvalidConversation("body: must be a JSON object")
    user = _text(body.get("user"), "user", max_chars=limits.max_user_chars)
    since = body.get("since")
    return user, None if since is None else _utc_timestamp(since, "since")


def recalled_block(text: str) -> dict[str, str]:
    return {"block_type": RECALLED_BLOCK_TYPE, "tool_name": RECALLED_TOOL_NAME, "text": text}


def is_recalled(turn: dict[str, Any]) -> bool:
    """Whether a stored turn is an answer the agent built with recall (never a passage)."""
    blocks = turn.get("blocks")
    return isinstance(blocks, list) and any(
        isinstance(b, dict) and b.get("block_type") == RECALLED_BLOCK_TYPE for b in blocks
    )


def write_conversation(
    home: Path,
    conversation: Conversation,
    admit: Callable[[Conversation], Conversation] | None = None,
) -> bool:
    """Store the whole conversation durably and atomically; returns whether the file was written.

    Nothing is written when the stored file already holds this post: byte for byte, or as a longer
    version this post is a strict prefix of (see `_holds`), so a delayed retry of an older
    snapshot cannot shorten the conversation. Any other change replaces the file. The
    conversation's lock makes reading, deciding and replacing one step against every other
    writer, in this process or another (the backfill command); a unique temporary name (never
    .jsonl, so no engine reads it) and a rename install one complete file. ``admit``, called
    under the lock, decides what of the post may be stored (the tombstones, recall/lifecycle.py)
    and may raise to store nothing.
    """
    data = conversation.to_jsonl().encode("utf-8")  # fails before any mkdir, leaving nothing
    src = home / "src"
    target = src / f"{conversation.conversation_id}{SOURCE_SUFFIX}"
    created = [d for d in (home, src) if not d.exists()]
    try:
        home.mkdir(PRIVATE_DIR, parents=True, exist_ok=True)
        src.mkdir(PRIVATE_DIR, exist_ok=True)
        with conversation_lock(home, conversation.conversation_id):
            if admit is not None:
                conversation = admit(conversation)
                data = conversation.to_jsonl().encode("utf-8")
            if _holds(target, data, conversation.lines):
                # Acknowledged as stored, so make sure it is durable even if its writer died
                # between its rename and its fsyncs.
                _fsync_file(target)
                for directory in (src, home, home.parent):
                    fsync_dir(directory)
                return False
            tmp = src / f".{conversation.conversation_id}.{uuid.uuid4().hex}.tmp"
            try:
                with open(tmp, "wb", opener=private_file) as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            fsync_dir(src)  # the rename
            for directory in created:  # a new user or src directory: its entry must be durable
                fsync_dir(directory.parent)
    except BaseException:
        for directory in reversed(created):  # a failed write leaves no directory behind
            with contextlib.suppress(OSError):  # not empty: another writer is using it
                directory.rmdir()
        raise
    return True


def _holds(target: Path, data: bytes, lines: list[dict[str, Any]]) -> bool:
    """Whether the stored file already holds this post (`data`, the serialised `lines`).

    True when it is byte for byte the same, or when it has more lines and its first len(lines)
    lines have the same turn_uuid, role, ts and blocks (the text), in order, as `lines`.
    A missing or unreadable stored file holds nothing.
    """
    try:
        stored = target.read_bytes()
    except FileNotFoundError:
        return False
    return stored_holds(stored, data, lines)


def stored_holds(stored: bytes, data: bytes, lines: list[dict[str, Any]]) -> bool:
    """Whether a stored conversation's bytes already hold this post (see `_holds`). Pure: every
    store decides with it, under the conversation's lock."""
    if stored == data:
        return True
    stored_lines = stored.splitlines()
    if len(stored_lines) <= len(lines):
        return False
    try:
        return all(
            _turn_identity(json.loads(raw)) == _turn_identity(line)
            for raw, line in zip(stored_lines, lines, strict=False)
        )
    except ValueError:  # not JSON: replace it
        return False


def _turn_identity(line: Any) -> tuple[Any, ...] | None:
    if not isinstance(line, dict):
        return None
    return tuple(line.get(key) for key in ("turn_uuid", "role", "ts", "blocks"))


@contextlib.contextmanager
def conversation_lock(home: Path, conversation_id: str, wait: bool = True) -> Iterator[None]:
    """Hold the write lock of one conversation, across threads and processes.

    An flock (per open file, so threads of one process exclude each other too, unlike POSIX
    record locks) on src/.<conversation_id>.lock, which needs src to exist. The holder removes
    the file before releasing it, so no lock files pile up; a waiter that then gets the lock of
    the removed file sees that the path no longer leads to it and locks the new one instead.
    With ``wait=False``, BlockingIOError when another writer holds it.
    """
    path = home / "src" / f".{conversation_id}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _is_open_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # while still locked: see the docstring
        os.close(fd)


def remove_leftovers(home: Path) -> int:
    """Remove what writers killed mid-write left in src (their temporary and lock files), so
    that only conversations remain where the engines read; returns how many files went.

    Each conversation's leftovers go under its lock, so a live writer's (the backfill command
    in another process) are left alone: its lock is held, or its temporary file is its own.
    """
    src = home / "src"
    leftovers: dict[str, list[Path]] = {}
    for path in src.glob(".*") if src.is_dir() else []:
        if path.suffix in (".tmp", ".lock"):  # .<conversation_id>[.<rand>].tmp|lock
            leftovers.setdefault(path.name[1:].split(".", 1)[0], []).append(path)
    removed = 0
    for conversation_id, paths in leftovers.items():
        try:
            # Taking the lock replaces a stale lock file, and releasing it removes the file.
            with conversation_lock(home, conversation_id, wait=False):
                for path in paths:
                    if path.suffix == ".tmp":
                        path.unlink(missing_ok=True)
        except BlockingIOError:
            continue  # a writer is at work on it: its own finally removes its temporary file
        removed += len(paths)
    if removed:
        fsync_dir(src)
    return removed


def private_file(path: str | os.PathLike[str], flags: int) -> int:
    """An ``opener`` for ``open()``: a file it creates is the owner's only (0600), whatever the
    umask; an existing one keeps its mode."""
    return os.open(path, flags | os.O_CLOEXEC, PRIVATE_FILE)


def _is_open_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_source(path: Path) -> list[dict[str, Any]]:
    """The turns of one source file, in order (shared by the engines and the tools)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def source_files(home: Path) -> list[Path]:
    src = home / "src"
    return sorted(src.glob(f"*{SOURCE_SUFFIX}")) if src.is_dir() else []
