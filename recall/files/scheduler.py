"""Debounced, per-user index runs, off the request path, bounded across users.

A burst of writes gives one run; a write during a run earns exactly one more; one user never
has two runs at once; at most `concurrency` runs at once across users (each run loads a model),
given out first come, first served in the order users became due. State lives in this process,
so run one server process per data directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from recall.files.engines.base import Engine
from recall.files.layout import private_file, source_files
from recall.logs import user_fields

log = logging.getLogger("recall.index")

IndexFn = Callable[[Path], Awaitable[None]]


@dataclass
class _UserState:
    dirty: bool = False
    task: asyncio.Task[None] | None = None
    waiting_since: float | None = None  # monotonic time the first write not yet in a run came


class IndexScheduler:
    def __init__(self, index: IndexFn, debounce: float, concurrency: int = 2) -> None:
        self._index = index
        self._debounce = debounce
        # asyncio's semaphore wakes its waiters in arrival order: the user due first runs first.
        # A user has one task, so she waits in this queue at most once however often she posts.
        self._runs = asyncio.Semaphore(concurrency)
        self._users: dict[Path, _UserState] = {}  # strong refs: the loop only keeps weak ones
        self._slots: dict[Path, asyncio.Lock] = {}  # a user's index slot: runs, forgets, erases

    def schedule(self, home: Path) -> None:
        state = self._users.setdefault(home, _UserState())
        state.dirty = True
        if state.waiting_since is None:
            state.waiting_since = time.monotonic()
        if state.task is None or state.task.done():
            state.task = asyncio.create_task(self._run(home, state))

    def ensure(self, home: Path) -> None:
        """A run for this user unless one is already waiting or going on (it covers the need)."""
        state = self._users.get(home)
        if state is None or state.task is None or state.task.done():
            self.schedule(home)

    def pending(self) -> int:
        """Users with an index run due or going on: 0 once every write so far went through a run."""
        return sum(1 for state in self._users.values() if state.task and not state.task.done())

    def due(self, home: Path) -> bool:
        """Whether this user has an index run due or going on (a write not in the index yet)."""
        state = self._users.get(home)
        return state is not None and state.task is not None and not state.task.done()

    def waiting(self) -> tuple[int, float]:
        """Users with writes that no run has started on yet (in the debounce or queued for a run
        slot), and how many seconds the oldest of those writes has waited (0 when none): how far
        indexing lags behind ingest."""
        since = [s.waiting_since for s in self._users.values() if s.waiting_since is not None]
        return len(since), (time.monotonic() - min(since)) if since else 0.0

    async def _run(self, home: Path, state: _UserState) -> None:
        while state.dirty:
            await asyncio.sleep(self._debounce)
            async with self._runs, self._slot(home):
                state.dirty = False  # a write while queued is covered by this run
                state.waiting_since = None
                try:
                    await self._index(home)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # logged; retried at the next write or failed recall
                    log.warning(
                        "index run failed for user %s: %s", home.name, exc, extra=user_fields(home)
                    )

    def _slot(self, home: Path) -> asyncio.Lock:
        return self._slots.setdefault(home, asyncio.Lock())

    @asynccontextmanager
    async def exclusive(self, home: Path) -> AsyncIterator[None]:
        """Hold this user's index slot (and a run slot: a funes forget is an index run): no index
        run of theirs goes on meanwhile. Taken in the same order as a run takes them."""
        async with self._runs, self._slot(home):
            yield

    async def close(self) -> None:
        tasks = [s.task for s in self._users.values() if s.task and not s.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --- what was indexed: a fingerprint of the sources, written after each successful run ---


def sources_fingerprint(home: Path) -> str:
    """Changes whenever a source file is added, removed or rewritten."""
    digest = hashlib.sha256()
    for path in source_files(home):
        stat = path.stat()
        digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _marker(home: Path, engine: str) -> Path:
    return home / f"indexed-{engine}.json"


async def index_and_mark(engine: Engine, home: Path) -> None:
    """One index run; on success, record which sources it covered."""
    fingerprint = sources_fingerprint(home)  # taken first: a write during the run re-runs
    await engine.index(home)
    mark_indexed(home, engine.name, fingerprint)


def mark_indexed(home: Path, engine: str, fingerprint: str) -> None:
    marker = _marker(home, engine)
    tmp = marker.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8", opener=private_file) as handle:
        handle.write(json.dumps({"sources": fingerprint}))
    tmp.replace(marker)


def indexed_before(home: Path, engine: str) -> bool:
    """Whether a run of ``engine`` ever finished for this user (its marker is there)."""
    return _marker(home, engine).is_file()


def needs_index(home: Path, engine: str) -> bool:
    try:
        recorded = json.loads(_marker(home, engine).read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return bool(source_files(home))
    return recorded != sources_fingerprint(home)


def index_stale(engine: Engine, home: Path) -> bool:
    """Whether a run is due: the sources changed since the last good one, or the index itself is
    gone, unreadable or built by another version of the engine while there are sources (the
    marker, outside the index, cannot tell)."""
    if needs_index(home, engine.name):
        return True
    if not engine.has_memory(home) or engine.index_outdated(home):
        return bool(source_files(home))
    return False
