"""The write path's domain: validate a posted conversation, lay it out on disk in funes format.

On-disk layout (the contract both engines read, see docs/CONTRACTS.md):

    DATA_DIR/<first 24 hex of sha256(user)>/src/<conversation_id>.funes.jsonl

One file per conversation, the whole conversation, rewritten atomically on every post.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HARNESS = "gateway"  # funes wants [a-z0-9_-]; names the producer of these transcripts
SOURCE_SUFFIX = ".funes.jsonl"
ROLES = frozenset({"user", "assistant", "system", "tool"})

CONVERSATION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
SAFE_TURN_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # funes refuses ':'; we also keep ids path-safe
# RFC 3339 with a mandatory offset or Z; fromisoformat alone would accept naive local times.
RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})"
)


class InvalidConversation(ValueError):
    """A refused body; the message starts with the offending field, e.g. ``turns[2].ts: ...``."""


@dataclass(frozen=True)
class Limits:
    max_turns: int = 5_000
    max_text_chars: int = 200_000
    max_user_chars: int = 256


@dataclass(frozen=True)
class Conversation:
    user: str
    conversation_id: str
    lines: list[dict[str, Any]]  # funes format 1 turns, ready to serialise

    def to_jsonl(self) -> str:
        return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in self.lines)


def user_dir_name(user: str) -> str:
    """Directory name for a user: a hash, so no user id ever appears on disk or in logs."""
    return hashlib.sha256(user.encode("utf-8")).hexdigest()[:24]


def _text(value: Any, field: str, *, max_chars: int, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidConversation(f"{field}: must be a string")
    if not allow_empty and not value.strip():
        raise InvalidConversation(f"{field}: must not be empty")
    if len(value) > max_chars:
        raise InvalidConversation(f"{field}: longer than {max_chars} characters")
    if "\x00" in value:
        raise InvalidConversation(f"{field}: contains a NUL character")
    return value


def _utc_timestamp(value: Any, field: str) -> str:
    if not isinstance(value, str) or not RFC3339.fullmatch(value):
        raise InvalidConversation(f"{field}: must be an RFC 3339 timestamp with Z or an offset")
    try:
        moment = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidConversation(f"{field}: not a valid date and time") from exc
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    for seq, turn in enumerate(turns):
        where = f"turns[{seq}]"
        if not isinstance(turn, dict):
            raise InvalidConversation(f"{where}: must be an object")
        role = turn.get("role")
        if role not in ROLES:
            raise InvalidConversation(f"{where}.role: must be one of {', '.join(sorted(ROLES))}")
        text = _text(
            turn.get("text"), f"{where}.text", max_chars=limits.max_text_chars, allow_empty=True
        )
        ts = _utc_timestamp(turn.get("ts"), f"{where}.ts")
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
                "blocks": [{"block_type": "text", "text": text}],
            }
        )
    return Conversation(user=user, conversation_id=cid, lines=lines)


def write_conversation(home: Path, conversation: Conversation) -> Path:
    """Write the whole conversation durably and atomically; returns the source file.

    A unique temporary name (never ending in .jsonl, so no engine reads it) makes concurrent
    posts of one conversation safe: each rename installs one complete file, the last one wins.
    """
    src = home / "src"
    created = [d for d in (home, src) if not d.exists()]
    src.mkdir(parents=True, exist_ok=True)
    target = src / f"{conversation.conversation_id}{SOURCE_SUFFIX}"
    tmp = src / f".{conversation.conversation_id}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(conversation.to_jsonl())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(src)  # the rename
    for directory in created:  # a new user or src directory: its own entry must be durable too
        _fsync_dir(directory.parent)
    return target


def _fsync_dir(path: Path) -> None:
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
