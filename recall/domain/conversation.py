"""What a conversation is, wherever it is stored: a posted conversation checked and converted to
funes format 1 turns, the recalled mark, the references the agent reads by, and the rules every
store applies to a re-post (`stored_holds`). Pure: no files, no SQL (docs/CONTRACTS.md).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from recall.domain.errors import InvalidConversation
from recall.redaction import Redactor

Turn = dict[str, Any]  # one stored line, funes format 1

HARNESS = "gateway"  # funes wants [a-z0-9_-]; names the producer of these transcripts
# The name of a conversation's source in funes format; both stores order conversations by it.
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


def conversation_named(user: str, ref: str, conversation_ids: Iterable[str]) -> str | None:
    """The conversation of ``conversation_ids`` (the user's own) that ``ref`` names; None when
    none does, or ``ref`` is no reference at all."""
    if not REF.fullmatch(ref):
        return None
    return next((c for c in conversation_ids if conversation_ref(user, c) == ref), None)


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


def parse_request(body: Any, limits: Limits, *, conversation: bool) -> tuple[str, str]:
    """(user, conversation_id or "") of a /forget, /erase or /receipts body; InvalidConversation
    names the field."""
    if not isinstance(body, dict):
        raise InvalidConversation("body: must be a JSON object")
    user = _text(body.get("user"), "user", max_chars=limits.max_user_chars)
    if not conversation:
        return user, ""
    cid = body.get("conversation_id")
    if not isinstance(cid, str) or not CONVERSATION_ID.fullmatch(cid):
        raise InvalidConversation("conversation_id: must match [A-Za-z0-9_-]{1,128}")
    return user, cid


def stored_holds(stored: bytes, data: bytes, lines: list[dict[str, Any]]) -> bool:
    """Whether a stored conversation's bytes already hold this post (``data``, the serialised
    ``lines``): byte for byte the same, or a longer version whose first len(lines) lines have the
    same turn_uuid, role, ts and blocks (the text), in order. Every store decides with it, under
    the conversation's lock."""
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


def readable_lines(stored: bytes) -> list[Turn]:
    """The turns of a stored conversation's bytes that can be read, skipping a line that cannot
    (the digests of a forget are taken from these: a damaged line must not keep the rest from
    its tombstone)."""
    turns = []
    for raw in stored.splitlines():
        with suppress(ValueError):  # not UTF-8 or not JSON
            turn = json.loads(raw)
            if isinstance(turn, dict):
                turns.append(turn)
    return turns
