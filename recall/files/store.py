"""The files store (STORE=files, the default): one directory per user under DATA_DIR, one server
process. The rules are recall/domain/'s; the layout is that of layout.py (the write path),
lifecycle.py (forget, erase, tombstones, receipts, retention), audit_file.py and scheduler.py
(debounced index runs in this process), beside this module in recall/files/; search is funes or
the embedded engine over the user's directory. This module only maps a user hash to that
directory and runs the file work on the server's write threads.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from recall.concurrency import run_in
from recall.domain.answers import Recalled
from recall.domain.conversation import (
    CONVERSATION_ID,
    SOURCE_SUFFIX,
    Conversation,
    conversation_named,
)
from recall.files import audit_file
from recall.files.engines.base import Engine
from recall.files.layout import (
    PRIVATE_DIR,
    read_source,
    remove_leftovers,
    source_files,
    write_conversation,
)
from recall.files.lifecycle import Lifecycle, UserGates, admit_for, list_receipts, user_homes
from recall.files.scheduler import IndexScheduler, index_and_mark, index_stale, indexed_before
from recall.logs import user_fields
from recall.metrics import data_dir_writable
from recall.settings import ConfigError
from recall.store import (
    SEARCHABLE,
    AuditLine,
    Located,
    Mark,
    Marked,
    MemoryState,
    Receipt,
    Searched,
    Settled,
    Turn,
    leave_mark,
)

log = logging.getLogger("recall")


def prepare_data_dir(data_dir: Path) -> None:
    """DATA_DIR made if missing; ConfigError, one line, when it cannot hold the store (a file by
    that name, a parent that is a file, no permission, a read-only mount)."""
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError(f"DATA_DIR {data_dir}: is a file, not a directory")
    try:
        data_dir.mkdir(PRIVATE_DIR, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"DATA_DIR {data_dir}: cannot be created ({exc.strerror})") from exc
    if not data_dir_writable(data_dir):
        raise ConfigError(f"DATA_DIR {data_dir}: cannot be written by this user")


# One owner per DATA_DIR: the index queue, the debounce and the user gates live in one process,
# so a second server or a backfill beside it would run index runs and forgets under its feet.
DATA_DIR_LOCK = ".recall-server.lock"  # a dot: no user directory (lifecycle.user_homes)


class DataDirTaken(ConfigError):
    """Another recall-server process (a server or a backfill) holds DATA_DIR."""


def hold_data_dir(data_dir: Path, what: str) -> int:
    """Take DATA_DIR for this process (``what``: "server" or "backfill") until it exits: an
    exclusive lock on DATA_DIR/.recall-server.lock, which the kernel lets go with the process,
    so a crash leaves nothing to clean up. The descriptor to keep open; DataDirTaken, one line,
    when another holds it; ConfigError as prepare_data_dir."""
    prepare_data_dir(data_dir)
    path = data_dir / DATA_DIR_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigError(
            f"DATA_DIR {data_dir}: cannot open {DATA_DIR_LOCK} ({exc.strerror})"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").split()
        os.close(fd)
        who = f" (a {holder[0]}, pid {holder[1]})" if len(holder) == 2 else ""
        raise DataDirTaken(
            f"DATA_DIR {data_dir} is in use by another recall-server{who}: one server (or "
            "backfill) per data directory; stop it first, or give this one another DATA_DIR"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{what} {os.getpid()}\n".encode(), 0)
    return fd


class FilesStore:
    name = "files"

    def __init__(
        self,
        data_dir: Path,
        engine: Engine,
        writes: Executor,
        *,
        debounce: float,
        index_concurrency: int,
        measure_index: Callable[[Callable[[Path], object]], Callable[[Path], object]] = (
            lambda run: run
        ),
    ) -> None:
        prepare_data_dir(data_dir)  # before serving: at start a bad DATA_DIR was a traceback
        self.data_dir = data_dir
        self.engine = engine
        self.writes = writes

        async def index_user(home: Path) -> None:
            started = time.monotonic()
            await index_and_mark(engine, home)
            seconds = time.monotonic() - started
            log.info(
                "indexed user %s in %.2fs", home.name, seconds, extra=user_fields(home, seconds)
            )

        self.scheduler = IndexScheduler(
            measure_index(index_user),  # type: ignore[arg-type]
            debounce,
            index_concurrency,
        )
        self.gates = UserGates()
        self.lifecycle = Lifecycle(data_dir, engine, self.scheduler, writes, self.gates)

    @property
    def engine_name(self) -> str:
        return self.engine.name

    def describe(self) -> str:
        return f"{self.engine.name} engine on the files store, data in {self.data_dir}"

    def home(self, user: str) -> Path:
        """The user's directory: DATA_DIR/<user hash>."""
        return self.data_dir / user

    async def start(self) -> None:
        self.data_dir.mkdir(PRIVATE_DIR, parents=True, exist_ok=True)
        # Catch up on whatever changed while we were down, and rebuild any index that is gone
        # or unreadable: a restart or a crash loses nothing, and leaves nothing half-written.
        for home in user_homes(self.data_dir):
            if removed := remove_leftovers(home):
                log.info("user %s: removed %d files of cut-off writes", home.name, removed)
            if index_stale(self.engine, home):
                self.scheduler.schedule(home)

    async def close(self) -> None:
        await self.scheduler.close()
        await self.engine.close()

    async def refused(self) -> str:
        await asyncio.Event().wait()  # DATA_DIR was checked at start: nothing refuses later
        raise AssertionError("unreachable")

    async def ready(self) -> str | None:
        # Can requests succeed: DATA_DIR takes a file, the engine can answer. Off the loop (disk).
        if not await run_in(self.writes, data_dir_writable, self.data_dir):
            return "data_dir"
        return self.engine.ready()

    async def indexing(self) -> int:
        return self.scheduler.pending()

    async def index_lag(self) -> tuple[int, float]:
        return self.scheduler.waiting()

    async def put(self, user: str, conversation: Conversation) -> bool:
        home = self.home(user)
        # Tombstones: a forgotten (or erased) turn is never stored again; new turns are.
        async with self.gates.post(home):
            written = await run_in(
                self.writes, write_conversation, home, conversation, admit_for(home)
            )
        self.scheduler.schedule(home)
        return written

    async def conversation_ids(self, user: str) -> list[str]:
        return await run_in(self.writes, conversation_ids, self.home(user))

    async def conversations(self, user: str) -> dict[str, list[Turn]]:
        return await run_in(self.writes, _read_all, self.home(user))

    async def turns(self, user: str, conversation_id: str) -> list[Turn] | None:
        return await run_in(self.writes, _read_turns, self.home(user), conversation_id)

    async def forget(
        self,
        user: str,
        conversation_id: str,
        reason: str,
        only_if: Callable[[list[Turn]], bool] | None = None,
    ) -> Receipt:
        return await self.lifecycle.forget(self.home(user), conversation_id, reason, only_if)

    async def erase(self, user: str) -> Receipt:
        return await self.lifecycle.erase(self.home(user))

    async def receipts(self, user: str) -> list[Receipt]:
        return await run_in(self.writes, list_receipts, self.data_dir, user)

    async def sweep(self, retention_days: float) -> int:
        return await self.lifecycle.sweep(retention_days)

    async def mark(self, user: str) -> Mark:
        return time.monotonic()

    async def erased_since(self, user: str, mark: Mark) -> bool:
        return self._erased(self.home(user), mark)

    async def append_audit(self, user: str, line: AuditLine, mark: Mark) -> None:
        if await self.settle(user, mark, line) == "unaudited":
            raise OSError("audit line not written")

    async def settle(self, user: str, mark: Mark, line: AuditLine | None) -> Settled:
        """The erasures since ``mark`` (the engines keep a recall clear of forgets themselves:
        never "forgotten"), and the line, under the user's gate, which an erase holds alone: a
        call that overlapped an erase leaves no line in what is left."""
        home = self.home(user)
        if line is None:
            return "erased" if self._erased(home, mark) else "kept"
        async with self.gates.post(home):
            if self._erased(home, mark):
                return "erased"
            if not home.is_dir():
                return "kept"  # no data of the user: no audit to keep
            try:
                await run_in(self.writes, audit_file.append, home, line)
            except OSError:
                return "unaudited"
        return "kept"

    def _erased(self, home: Path, mark: Mark) -> bool:
        return mark is not None and self.lifecycle.erased_since(home, mark)

    async def audit(self, user: str, since: str | None = None) -> list[AuditLine]:
        return await run_in(self.writes, audit_file.read, self.home(user), since)

    async def audit_page(
        self, user: str, limit: int, before: int | None = None
    ) -> tuple[list[AuditLine], int | None]:
        return await run_in(self.writes, audit_file.page, self.home(user), limit, before)

    async def state(self, user: str) -> MemoryState:
        home = self.home(user)
        if self.engine.has_memory(home):
            return "behind" if self.scheduler.due(home) else "ready"
        if not source_files(home):
            return "none"
        # No run has ever finished for this engine: the first is on its way, nothing is lost.
        return "unindexed" if indexed_before(home, self.engine.name) else "pending"

    async def recall(self, user: str, query: str) -> Recalled:
        return await self.engine.recall(self.home(user), query)

    async def search(self, user: str, query: str, marked: Marked | None = None) -> Searched:
        mark = await self.mark(user)  # first: an erase from here on is settle's to tell
        leave_mark(marked, mark)
        state = await self.state(user)
        if state not in SEARCHABLE or not query.strip():
            return Searched(state, Recalled(""), mark)
        behind = state == "behind"  # the renderer words what the due run may change as "not yet"
        found = await self.engine.recall(self.home(user), query, still_indexing=behind)
        return Searched(state, found, mark)

    async def locate(self, user: str, ref: str, marked: Marked | None = None) -> Located:
        mark = await self.mark(user)
        leave_mark(marked, mark)
        conversation_id = conversation_named(user, ref, await self.conversation_ids(user))
        turns = None if conversation_id is None else await self.turns(user, conversation_id)
        found = None if conversation_id is None or turns is None else (conversation_id, turns)
        return Located(found, mark)

    def repair(self, user: str) -> None:
        self.scheduler.ensure(self.home(user))  # an unreadable index is rebuilt, not waited on


def conversation_ids(home: Path) -> list[str]:
    src = home / "src"
    if not src.is_dir():
        return []
    return sorted(p.name[: -len(SOURCE_SUFFIX)] for p in src.glob(f"*{SOURCE_SUFFIX}"))


def _read_all(home: Path) -> dict[str, list[Turn]]:
    found = {}
    for conversation_id in conversation_ids(home):
        try:
            found[conversation_id] = read_source(home / "src" / f"{conversation_id}{SOURCE_SUFFIX}")
        except FileNotFoundError:  # forgotten since the listing
            continue
        except (OSError, ValueError):  # unreadable: the list goes on without it
            log.warning("user %s: a conversation could not be read for the list", home.name)
    return found


def _read_turns(home: Path, conversation_id: str) -> list[Turn] | None:
    if not CONVERSATION_ID.fullmatch(conversation_id):  # it names a file: only a safe id
        return None
    try:
        return read_source(home / "src" / f"{conversation_id}{SOURCE_SUFFIX}")
    except FileNotFoundError:
        return None
