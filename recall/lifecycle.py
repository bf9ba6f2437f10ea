"""The data lifecycle: forget a conversation, erase a user, tombstones, receipts, retention.

On disk (see docs/CONTRACTS.md):

    DATA_DIR/<user hash>/tombstones.json   {"erased": <time> | null, "conversations": {id: time}}
    DATA_DIR/_receipts/<user hash>.jsonl   one receipt a line; outside the user directory, so
                                           an erasure's receipt outlives what it erased

Guarantees, and why they hold:

- Forget: under the conversation's lock (the one every writer takes) the tombstone is made
  durable first, then the source is deleted; then, with the user's index slot held (no index run
  meanwhile), the engine removes the rows. A post racing the forget either ran before it (and its
  file is deleted) or after it (and meets the tombstone).
- Tombstones: a later post of a forgotten conversation stores only its turns stamped after the
  forget time, renumbered from 0; when none are, it is refused with 410 and nothing is written.
  The same holds for every conversation of an erased user, against the erasure time.
- Erase: the user's directory is renamed aside (one step), replaced by a directory holding only
  the erasure tombstone, then the old one is deleted. Posts of that user wait while it happens.
- Receipts name what was removed (counts, ids, times), never text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from recall import audit
from recall.concurrency import run_in
from recall.conversations import (
    CONVERSATION_ID,
    SOURCE_SUFFIX,
    Conversation,
    InvalidConversation,
    Limits,
    _text,
    conversation_lock,
    fsync_dir,
    read_source,
    source_files,
)
from recall.engines.base import Engine, ForgetWindows
from recall.scheduler import IndexScheduler

log = logging.getLogger("recall.lifecycle")

TOMBSTONES = "tombstones.json"
RECEIPTS_DIR = "_receipts"  # not a user directory: user directories are 24 hex characters
EVERYTHING = "*"  # what an erasure's window hides: not a conversation id (those are [A-Za-z0-9_-])


class Forgotten(Exception):
    """A post that holds nothing stamped after its conversation's tombstone (or the erasure)."""


def now_utc() -> datetime:
    return datetime.now(UTC)


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _moment(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


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


# --- tombstones ------------------------------------------------------------------------------


def read_tombstones(home: Path) -> dict[str, Any]:
    try:
        stored = json.loads((home / TOMBSTONES).read_text())
    except FileNotFoundError:
        stored = {}
    return {"erased": stored.get("erased"), "conversations": stored.get("conversations", {})}


def _write_json_durably(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(value, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def forgotten_before(home: Path, conversation_id: str) -> datetime | None:
    """The moment before which nothing of this conversation may be stored again, if any."""
    tombstones = read_tombstones(home)
    stamps = [tombstones["erased"], tombstones["conversations"].get(conversation_id)]
    moments = [_moment(s) for s in stamps if s]
    return max(moments) if moments else None


def admit(home: Path, conversation: Conversation) -> Conversation:
    """What of a post may be stored, given the tombstones (called under the conversation's
    lock): the turns stamped after the forget, renumbered densely; Forgotten when none are."""
    cutoff = forgotten_before(home, conversation.conversation_id)
    if cutoff is None:
        return conversation
    kept = [line for line in conversation.lines if _moment(line["ts"]) > cutoff]
    if not kept:
        raise Forgotten
    lines = [{**line, "seq": seq} for seq, line in enumerate(kept)]
    return replace(conversation, lines=lines)


# --- forget ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceRemoved:
    turns: int


ALREADY_FORGOTTEN = "already forgotten"


def remove_source(home: Path, conversation_id: str, at: datetime) -> SourceRemoved | str | None:
    """Tombstone, then delete, one conversation's source, under its lock. SourceRemoved; or
    ALREADY_FORGOTTEN when there is no source but a tombstone; or None when it is unknown."""
    src = home / "src"
    if not src.is_dir():
        return ALREADY_FORGOTTEN if forgotten_before(home, conversation_id) else None
    with conversation_lock(home, conversation_id):
        source = src / f"{conversation_id}{SOURCE_SUFFIX}"
        try:
            turns = len(read_source(source))
        except FileNotFoundError:
            return ALREADY_FORGOTTEN if forgotten_before(home, conversation_id) else None
        except (OSError, ValueError):
            turns = 0  # unreadable: it goes all the same
        tombstones = read_tombstones(home)
        tombstones["conversations"][conversation_id] = _stamp(at)
        _write_json_durably(home / TOMBSTONES, tombstones)  # before the delete: never neither
        source.unlink()
        fsync_dir(src)
    return SourceRemoved(turns)


# --- receipts --------------------------------------------------------------------------------


def _receipts_file(data_dir: Path, user_hash: str) -> Path:
    return data_dir / RECEIPTS_DIR / f"{user_hash}.jsonl"


def add_receipt(data_dir: Path, user_hash: str, receipt: dict[str, Any]) -> None:
    path = _receipts_file(data_dir, user_hash)
    path.parent.mkdir(exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(receipt) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def list_receipts(data_dir: Path, user_hash: str) -> list[dict[str, Any]]:
    try:
        text = _receipts_file(data_dir, user_hash).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _last_forget_receipt(
    data_dir: Path, user_hash: str, conversation_id: str
) -> dict[str, Any] | None:
    forgets = [
        receipt
        for receipt in list_receipts(data_dir, user_hash)
        if (receipt.get("operation"), receipt.get("conversation_id")) == ("forget", conversation_id)
    ]
    return forgets[-1] if forgets else None


def _receipt(user_hash: str, operation: str, at: datetime, **details: Any) -> dict[str, Any]:
    return {
        "receipt": uuid.uuid4().hex,
        "operation": operation,
        "user": user_hash,
        "at": _stamp(at),
        **details,
    }


# --- erase -----------------------------------------------------------------------------------


def erase_home(home: Path, at: datetime) -> dict[str, int]:
    """Replace the user's directory by one holding only the erasure tombstone; what went."""
    conversations = source_files(home)
    turns = 0
    for path in conversations:
        with suppress(OSError, ValueError):
            turns += len(read_source(path))
    fresh = home.with_name(f".{home.name}.{uuid.uuid4().hex}.new")
    fresh.mkdir()
    _write_json_durably(fresh / TOMBSTONES, {"erased": _stamp(at), "conversations": {}})
    aside = home.with_name(f".{home.name}.{uuid.uuid4().hex}.erased")
    if home.exists():
        os.rename(home, aside)
    os.rename(fresh, home)
    fsync_dir(home.parent)
    shutil.rmtree(aside, ignore_errors=True)
    return {"conversations": len(conversations), "turns": turns}


# --- retention -------------------------------------------------------------------------------


def expired_conversations(home: Path, cutoff: datetime) -> list[str]:
    """Conversations whose last turn is older than ``cutoff``."""
    expired = []
    for path in source_files(home):
        try:
            turns = read_source(path)
            last = max(_moment(turn["ts"]) for turn in turns)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if last < cutoff:
            expired.append(path.name[: -len(SOURCE_SUFFIX)])
    return expired


def user_homes(data_dir: Path) -> list[Path]:
    return sorted(p for p in data_dir.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


# --- the operations, as the routes and the sweep run them -----------------------------------


class UserGates:
    """Posts of a user share the gate; an erase of that user holds it alone (in this process)."""

    def __init__(self) -> None:
        self._posts: dict[Path, int] = {}
        self._erasing: set[Path] = set()
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def post(self, home: Path) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: home not in self._erasing)
            self._posts[home] = self._posts.get(home, 0) + 1
        try:
            yield
        finally:
            async with self._changed:
                self._posts[home] -= 1
                if not self._posts[home]:
                    del self._posts[home]
                self._changed.notify_all()

    @asynccontextmanager
    async def erase(self, home: Path) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: home not in self._erasing)
            self._erasing.add(home)  # new posts wait from here on
            await self._changed.wait_for(lambda: not self._posts.get(home))
        try:
            yield
        finally:
            async with self._changed:
                self._erasing.discard(home)
                self._changed.notify_all()


class NotFound(Exception):
    """No such conversation was ever stored (or it was never forgotten)."""


@dataclass
class Lifecycle:
    data_dir: Path
    engine: Engine
    scheduler: IndexScheduler
    writes: Executor
    gates: UserGates
    # The erasures under way or recently done, for the recalls that overlapped one (see
    # erased_since), as the engines keep the forgets' for theirs.
    erasures: ForgetWindows = field(default_factory=ForgetWindows)

    def erased_since(self, home: Path, started: float) -> bool:
        """Whether an erasure of ``home`` overlapped a recall that began at ``started``
        (monotonic) and ends now: that recall may have read what the erasure removed."""
        return bool(self.erasures.hidden(home, started))

    async def forget(self, home: Path, conversation_id: str, reason: str) -> dict[str, Any]:
        """The receipt of the forget (the earlier one when it was already forgotten)."""
        at = now_utc()
        async with self.scheduler.exclusive(home):
            removed = await run_in(self.writes, remove_source, home, conversation_id, at)
            if removed is None:
                raise NotFound
            if removed == ALREADY_FORGOTTEN:
                earlier = await run_in(
                    self.writes, _last_forget_receipt, self.data_dir, home.name, conversation_id
                )
                if earlier is not None:
                    return earlier
                removed = SourceRemoved(0)  # the engine failed last time: try it again
            assert isinstance(removed, SourceRemoved)
            rows = await self.engine.forget(home, conversation_id)
            receipt = _receipt(
                home.name,
                "forget",
                at,
                reason=reason,
                conversation_id=conversation_id,
                removed={"conversations": 1, "turns": removed.turns, "index_rows": rows},
            )
            await run_in(self.writes, add_receipt, self.data_dir, home.name, receipt)
        self.scheduler.schedule(home)  # the index marker follows the sources again
        log.info("user %s: forgot a conversation (%s)", home.name, reason)
        return receipt

    async def erase(self, home: Path) -> dict[str, Any]:
        at = now_utc()
        window = self.erasures.open(home, EVERYTHING)
        try:
            async with self.gates.erase(home), self.scheduler.exclusive(home):
                removed = await run_in(self.writes, erase_home, home, at)
                receipt = _receipt(home.name, "erase", at, removed={**removed, "index_rows": None})
                await run_in(self.writes, add_receipt, self.data_dir, home.name, receipt)
        finally:
            self.erasures.close(window)
        log.info("user %s: erased", home.name)
        return receipt

    async def sweep(self, retention_days: float) -> int:
        """Forget every conversation whose last turn is older than the retention; how many."""
        cutoff = now_utc() - timedelta(days=retention_days)
        forgotten = 0
        for home in await run_in(self.writes, user_homes, self.data_dir):
            for conversation_id in await run_in(self.writes, expired_conversations, home, cutoff):
                with suppress(NotFound):  # forgotten meanwhile
                    await self.forget(home, conversation_id, "retention")
                    forgotten += 1
            # The recall audit is the user's data too: its old lines go with the same retention.
            await run_in(self.writes, audit.prune, home, _stamp(cutoff))
        return forgotten

    async def sweep_forever(self, retention_days: float, interval: float) -> None:
        while True:
            try:
                if count := await self.sweep(retention_days):
                    log.info("retention sweep forgot %d conversations", count)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # logged; the next sweep tries again
                log.warning("retention sweep failed: %s", type(exc).__name__)
            await asyncio.sleep(interval)


def admit_for(home: Path) -> Callable[[Conversation], Conversation]:
    return lambda conversation: admit(home, conversation)
