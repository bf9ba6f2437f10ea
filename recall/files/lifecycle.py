"""The data lifecycle: forget a conversation, erase a user, tombstones, receipts, retention.

On disk (see docs/CONTRACTS.md):

    DATA_DIR/<user hash>/tombstones.json   {"turns": {id: [digest, ...]},
                                            "erased": <time> | null, "conversations": {id: time}}
    DATA_DIR/_receipts/<user hash>.jsonl   one receipt a line; outside the user directory, so
                                           an erasure's receipt outlives what it erased
    DATA_DIR/_keys/tombstone.key           the key of the digests (64 hex digits), made once

The digests, what a tombstone admits, expiry and receipts are values of recall/domain/
forgetting.py; this module keeps them on disk and runs the operations under the files' locks.
"erased" and "conversations" are times, written by
versions before digests and never added to since: what they forgot stays forgotten by their rule
(the turns stamped at or before that time).

Guarantees, and why they hold:

- Forget: under the conversation's lock (the one every writer takes) the tombstone is made
  durable first, then the source is deleted; then, with the user's index slot held (no index run
  meanwhile), the engine removes the rows. A post racing the forget either ran before it (and its
  file is deleted) or after it (and meets the tombstone).
- Tombstones: a later post of a forgotten conversation stores every posted turn whose digest is
  not in its tombstone, whatever its time, renumbered from 0; when every turn is, it is refused
  with 410 and nothing is written. Only a forgotten turn is ever left out: the same role, second
  and text. An erasure tombstones every turn of every conversation of the user the same way.
- Erase: the user's directory is renamed aside (one step), replaced by a directory holding only
  the erasure tombstone, then the old one is deleted. Posts of that user wait while it happens.
- Retention forgets a conversation only if it is still expired under its lock: a conversation
  resumed after the sweep listed it stays, with no receipt.
- Receipts name what was removed (counts, ids, times), never text. They are appended under an
  flock; a line cut by a crash is skipped when read and never written onto.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import json
import logging
import os
import secrets
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from recall.concurrency import run_in
from recall.domain.conversation import SOURCE_SUFFIX, Conversation, Turn, readable_lines
from recall.domain.errors import NotDue, NotFound
from recall.domain.forgetting import (
    EVERYTHING,
    Forgetting,
    admitted,
    expired,
    moment,
    new_receipt,
    now_utc,
    stamp,
    turn_digest,
)
from recall.files import audit_file
from recall.files.engines.base import Engine, ForgetWindows
from recall.files.layout import (
    PRIVATE_DIR,
    conversation_lock,
    fsync_dir,
    private_file,
    source_files,
)
from recall.files.scheduler import IndexScheduler

log = logging.getLogger("recall.files.lifecycle")

TOMBSTONES = "tombstones.json"
RECEIPTS_DIR = "_receipts"  # not a user directory: user directories are 24 hex characters
KEYS_DIR = "_keys"
TOMBSTONE_KEY = "tombstone.key"


# --- the tombstone key: the one place it is kept (another store may keep it elsewhere) --------


_keys: dict[Path, bytes] = {}  # read once per DATA_DIR: a post of a forgotten conversation needs it


def tombstone_key(data_dir: Path) -> bytes:
    """The server's key for tombstone digests: DATA_DIR/_keys/tombstone.key, made on first need.

    Made durably and atomically: a complete file is linked into place, which never replaces one,
    so when the server and the backfill command race, the first link wins and both read its key.
    Lost, it cannot be made again: the digests it made would match nothing (back it up with
    DATA_DIR). Once read it never changes, so each process reads it once."""
    path = data_dir / KEYS_DIR / TOMBSTONE_KEY
    if (known := _keys.get(path)) is not None:
        return known
    if not path.exists():
        path.parent.mkdir(PRIVATE_DIR, exist_ok=True)
        tmp = path.with_name(f".{TOMBSTONE_KEY}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "x", encoding="ascii", opener=private_file) as handle:
                handle.write(secrets.token_hex(32))
                handle.flush()
                os.fsync(handle.fileno())
            with suppress(FileExistsError):  # another process made it first: use its key
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(path.parent)
        fsync_dir(data_dir)
    key = bytes.fromhex(path.read_text(encoding="ascii").strip())
    if len(key) != 32:
        raise ValueError(f"{KEYS_DIR}/{TOMBSTONE_KEY}: not 64 hex digits")
    _keys[path] = key
    return key


# --- tombstones ------------------------------------------------------------------------------


def read_tombstones(home: Path) -> dict[str, Any]:
    try:
        stored = json.loads((home / TOMBSTONES).read_text())
    except FileNotFoundError:
        stored = {}
    return {
        "turns": stored.get("turns", {}),
        # before digests (kept with their time rule, never added to)
        "erased": stored.get("erased"),
        "conversations": stored.get("conversations", {}),
    }


def _with_turns(home: Path, forgotten: dict[str, list[Turn]]) -> dict[str, Any]:
    """The user's tombstones with these conversations' turns added (not yet written)."""
    tombstones = read_tombstones(home)
    key = tombstone_key(home.parent)
    for conversation_id, turns in forgotten.items():
        digests = set(tombstones["turns"].get(conversation_id, []))
        digests.update(turn_digest(key, turn) for turn in turns)
        tombstones["turns"][conversation_id] = sorted(digests)
    return tombstones


def _write_json_durably(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8", opener=private_file) as handle:
        json.dump(value, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _tombstoned(home: Path, conversation_id: str) -> bool:
    tombstones = read_tombstones(home)
    return bool(
        conversation_id in tombstones["turns"]
        or conversation_id in tombstones["conversations"]
        or tombstones["erased"]
    )


def time_rule(tombstones: dict[str, Any], conversation_id: str) -> datetime | None:
    """A tombstone from before digests: the time at or before which nothing may come back."""
    stamps = [tombstones["erased"], tombstones["conversations"].get(conversation_id)]
    moments = [moment(s) for s in stamps if s]
    return max(moments) if moments else None


def admit(home: Path, conversation: Conversation) -> Conversation:
    """What of a post may be stored, given the tombstones in ``home`` (called under the
    conversation's lock): see `admitted`."""
    tombstones = read_tombstones(home)
    digests = frozenset(tombstones["turns"].get(conversation.conversation_id, []))
    before = time_rule(tombstones, conversation.conversation_id)
    keyed = {tombstone_key(home.parent): digests} if digests else {}  # the key on first need
    return admitted(conversation, Forgetting(keyed, before))


def readable_turns(path: Path) -> list[Turn]:
    """The turns of a source that can be read, skipping a line that cannot (the digests of a
    forget are taken from these: a damaged line must not keep the rest from its tombstone)."""
    return readable_lines(path.read_bytes())


# --- forget ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceRemoved:
    turns: int


ALREADY_FORGOTTEN = "already forgotten"


def remove_source(
    home: Path, conversation_id: str, only_if: Callable[[list[Turn]], bool] | None = None
) -> SourceRemoved | str | None:
    """Tombstone, then delete, one conversation's source, under its lock. SourceRemoved; or
    ALREADY_FORGOTTEN when there is no source but a tombstone; or None when it is unknown.
    NotDue when ``only_if`` (checked under the lock, on the stored turns) says no: nothing is
    removed."""
    src = home / "src"
    if not src.is_dir():
        return ALREADY_FORGOTTEN if _tombstoned(home, conversation_id) else None
    with conversation_lock(home, conversation_id):
        source = src / f"{conversation_id}{SOURCE_SUFFIX}"
        try:
            turns = readable_turns(source)
        except FileNotFoundError:
            return ALREADY_FORGOTTEN if _tombstoned(home, conversation_id) else None
        if only_if is not None and not only_if(turns):
            raise NotDue
        tombstones = _with_turns(home, {conversation_id: turns})
        _write_json_durably(home / TOMBSTONES, tombstones)  # before the delete: never neither
        source.unlink()
        fsync_dir(src)
    return SourceRemoved(len(turns))


# --- receipts --------------------------------------------------------------------------------


def _receipts_file(data_dir: Path, user_hash: str) -> Path:
    return data_dir / RECEIPTS_DIR / f"{user_hash}.jsonl"


def add_receipt(data_dir: Path, user_hash: str, receipt: dict[str, Any]) -> None:
    """Append one receipt durably, on a line of its own: under an exclusive flock (two
    processes never mix their lines), after dropping a last line a crash cut short."""
    path = _receipts_file(data_dir, user_hash)
    path.parent.mkdir(PRIVATE_DIR, exist_ok=True)
    with open(path, "a+b", opener=private_file) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        handle.seek(0)
        stored = handle.read()
        if stored and not stored.endswith(b"\n"):  # torn: unreadable, so never appended onto
            handle.truncate(stored.rfind(b"\n") + 1)
        handle.write(json.dumps(receipt).encode() + b"\n")  # "a": always at the end
        handle.flush()
        os.fsync(handle.fileno())


def list_receipts(data_dir: Path, user_hash: str) -> list[dict[str, Any]]:
    """The user's receipts, oldest first; a line cut short by a crash is skipped."""
    try:
        text = _receipts_file(data_dir, user_hash).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    receipts = []
    for line in text.splitlines():
        with suppress(ValueError):
            receipt = json.loads(line)
            if isinstance(receipt, dict):
                receipts.append(receipt)
    return receipts


def _last_forget_receipt(
    data_dir: Path, user_hash: str, conversation_id: str
) -> dict[str, Any] | None:
    forgets = [
        receipt
        for receipt in list_receipts(data_dir, user_hash)
        if (receipt.get("operation"), receipt.get("conversation_id")) == ("forget", conversation_id)
    ]
    return forgets[-1] if forgets else None


# --- erase -----------------------------------------------------------------------------------


def erase_home(home: Path) -> dict[str, int]:
    """Replace the user's directory by one holding only the erasure tombstone (the digests of
    every stored turn, added to the tombstones already there); what went."""
    conversations = source_files(home)
    erased = {}
    for path in conversations:
        with suppress(OSError):  # gone or unreadable: it goes all the same
            erased[path.name[: -len(SOURCE_SUFFIX)]] = readable_turns(path)
    tombstones = _with_turns(home, erased)
    fresh = home.with_name(f".{home.name}.{uuid.uuid4().hex}.new")
    fresh.mkdir(PRIVATE_DIR)
    _write_json_durably(fresh / TOMBSTONES, tombstones)
    aside = home.with_name(f".{home.name}.{uuid.uuid4().hex}.erased")
    if home.exists():
        os.rename(home, aside)
    os.rename(fresh, home)
    fsync_dir(home.parent)
    shutil.rmtree(aside, ignore_errors=True)
    return {"conversations": len(conversations), "turns": sum(map(len, erased.values()))}


# --- retention -------------------------------------------------------------------------------


def expired_conversations(home: Path, cutoff: datetime) -> list[str]:
    """Conversations whose last turn is older than ``cutoff``."""
    names = []
    for path in source_files(home):
        with suppress(OSError):
            if expired(readable_turns(path), cutoff):
                names.append(path.name[: -len(SOURCE_SUFFIX)])
    return names


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

    async def forget(
        self,
        home: Path,
        conversation_id: str,
        reason: str,
        only_if: Callable[[list[Turn]], bool] | None = None,
    ) -> dict[str, Any]:
        """The receipt of the forget (the earlier one when it was already forgotten). With
        ``only_if``, only when it holds for the stored turns at the moment of removal (NotDue)."""
        at = now_utc()
        async with self.scheduler.exclusive(home):
            removed = await run_in(self.writes, remove_source, home, conversation_id, only_if)
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
            receipt = new_receipt(
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
                removed = await run_in(self.writes, erase_home, home)
                receipt = new_receipt(
                    home.name, "erase", at, removed={**removed, "index_rows": None}
                )
                await run_in(self.writes, add_receipt, self.data_dir, home.name, receipt)
        finally:
            self.erasures.close(window)
        log.info("user %s: erased", home.name)
        return receipt

    async def sweep(self, retention_days: float) -> int:
        """Forget every conversation whose last turn is older than the retention; how many."""
        cutoff = now_utc() - timedelta(days=retention_days)
        still_expired = functools.partial(expired, cutoff=cutoff)  # a post may resume it
        forgotten = 0
        for home in await run_in(self.writes, user_homes, self.data_dir):
            for conversation_id in await run_in(self.writes, expired_conversations, home, cutoff):
                with suppress(NotFound, NotDue):  # forgotten, or resumed, meanwhile
                    await self.forget(home, conversation_id, "retention", still_expired)
                    forgotten += 1
            # The recall audit is the user's data too: its old lines go with the same retention.
            await run_in(self.writes, audit_file.prune, home, stamp(cutoff))
        return forgotten


class Sweeps(Protocol):
    async def sweep(self, retention_days: float) -> int: ...


async def sweep_forever(store: Sweeps, retention_days: float, interval: float) -> None:
    """The retention sweep, every ``interval`` seconds, until cancelled."""
    while True:
        try:
            if count := await store.sweep(retention_days):
                log.info("retention sweep forgot %d conversations", count)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logged; the next sweep tries again
            log.warning("retention sweep failed: %s", type(exc).__name__)
        await asyncio.sleep(interval)


def admit_for(home: Path) -> Callable[[Conversation], Conversation]:
    return lambda conversation: admit(home, conversation)
