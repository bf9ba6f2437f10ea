"""The forgetting rules as values, whichever store keeps them: what a tombstone is (keyed digests
of the forgotten turns, `turn_digest`), what of a post it admits (`admitted`), when a
conversation has expired (retention), and what a receipt says. Pure: every store applies them
under its own locks (the files store: recall/files/lifecycle.py; PostgreSQL: recall/pg/store.py).

A digest is the first 16 bytes (hex) of HMAC-SHA256, under the server's tombstone key, of one
stored turn's role, time and text: what the turn is, not when it was posted, so neither the
gateway's clock nor the recalled mark decides what stays forgotten. Without the key a digest does
not confirm a guessed text. Receipts name what was removed (counts, ids, times), never text.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from recall.domain.conversation import Conversation, Turn
from recall.domain.errors import Forgotten

EVERYTHING = "*"  # what an erasure's window hides: not a conversation id (those are [A-Za-z0-9_-])
DIGEST_BYTES = 16  # 128 bits: no two turns of a user meet by chance


def now_utc() -> datetime:
    return datetime.now(UTC)


def stamp(at: datetime) -> str:
    """A moment as receipts and the audit write it: UTC, microseconds, ...Z."""
    return at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def moment(text: str) -> datetime:
    """The moment of a stored ...Z time."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def forgotten_message(receipts: list[dict[str, Any]], conversation_id: str) -> str:
    """The 410 of a post whose every turn was forgotten, naming the operation that did it: the
    last receipt that covers the conversation (an erase covers all; a forget, by request or by
    retention, its own). Fixed texts only: no id, time or value, so it can be logged as is."""
    covering = [
        receipt
        for receipt in receipts
        if receipt.get("operation") == "erase"
        or (receipt.get("operation"), receipt.get("conversation_id")) == ("forget", conversation_id)
    ]
    last = covering[-1] if covering else {}
    if last.get("operation") == "erase":
        done, by = "erased", "an erase of this user"
    elif last.get("reason") == "retention":
        done, by = "forgotten", "the retention sweep (RETENTION_DAYS)"
    else:
        done, by = "forgotten", "a forget of this conversation"
    return (
        f"conversation_id: every turn of this post was {done} by {by}, and is never stored "
        "again (new turns are); nothing was written"
    )


def turn_digest(key: bytes, turn: Turn) -> str:
    """What a stored turn is, keyed: its role, its time as stored and its text as stored (after
    redaction; the blocks' texts joined). Not its id, seq or recalled mark: a re-post that changes
    those is still the same turn."""
    blocks = turn.get("blocks")
    if not isinstance(blocks, list):  # a damaged line: its role and time still count
        blocks = []
    texts = [block.get("text") for block in blocks if isinstance(block, dict)]
    text = "\n".join(t for t in texts if isinstance(t, str))
    canonical = json.dumps([turn.get("role"), turn.get("ts"), text], separators=(",", ":"))
    return hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()[: 2 * DIGEST_BYTES]


@dataclass(frozen=True)
class Forgetting:
    """What one conversation's tombstones forget, wherever they are kept: digests of its turns,
    by the key that made them (a store may hold digests of several keys, e.g. imported ones),
    and the time rule of tombstones from before digests."""

    digests: dict[bytes, frozenset[str]] = field(default_factory=dict)
    before: datetime | None = None


def admitted(conversation: Conversation, forgetting: Forgetting) -> Conversation:
    """What of a post may be stored: every turn that is not a forgotten one, renumbered
    densely; Forgotten when none is. Pure: every store decides with it, under its own lock."""
    digests = {key: found for key, found in forgetting.digests.items() if found}
    before = forgetting.before
    if not digests and before is None:
        return conversation

    def forgotten(turn: Turn) -> bool:
        if before is not None and moment(turn["ts"]) <= before:
            return True
        return any(turn_digest(key, turn) in found for key, found in digests.items())

    kept = [turn for turn in conversation.lines if not forgotten(turn)]
    if not kept:
        raise Forgotten
    lines = [{**turn, "seq": seq} for seq, turn in enumerate(kept)]
    return replace(conversation, lines=lines)


def expired(turns: list[Turn], cutoff: datetime) -> bool:
    """Whether a conversation's last turn is older than ``cutoff`` (no, when a time is
    unreadable)."""
    try:
        return max(moment(turn["ts"]) for turn in turns) < cutoff
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def new_receipt(user_hash: str, operation: str, at: datetime, **details: Any) -> dict[str, Any]:
    """A receipt of ``operation`` ("forget", "erase") done at ``at``: what went, by ``details``
    (counts, ids, times), never text; each store keeps it its own way."""
    return {
        "receipt": uuid.uuid4().hex,
        "operation": operation,
        "user": user_hash,
        "at": stamp(at),
        **details,
    }
