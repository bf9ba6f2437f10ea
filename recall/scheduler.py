"""Debounced, per-user index runs, off the request path.

A burst of writes gives one run; a write during a run earns exactly one more; one user never
has two runs at once; different users run in parallel. State lives in this process, so run one
server process per data directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from recall.conversations import source_files
from recall.engines.base import Engine

log = logging.getLogger("recall.index")

IndexFn = Callable[[Path], Awaitable[None]]


@dataclass
class _UserState:
    dirty: bool = False
    task: asyncio.Task[None] | None = None


class IndexScheduler:
    def __init__(self, index: IndexFn, debounce: float) -> None:
        self._index = index
        self._debounce = debounce
        self._users: dict[Path, _UserState] = {}  # strong refs: the loop only keeps weak ones

    def schedule(self, home: Path) -> None:
        state = self._users.setdefault(home, _UserState())
        state.dirty = True
        if state.task is None or state.task.done():
            state.task = asyncio.create_task(self._run(home, state))

    async def _run(self, home: Path, state: _UserState) -> None:
        while state.dirty:
            await asyncio.sleep(self._debounce)
            state.dirty = False
            try:
                await self._index(home)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # logged, retried at the next write
                log.warning("index run failed for user %s: %s", home.name, exc)

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
    tmp.write_text(json.dumps({"sources": fingerprint}))
    tmp.replace(marker)


def needs_index(home: Path, engine: str) -> bool:
    try:
        recorded = json.loads(_marker(home, engine).read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return bool(source_files(home))
    return recorded != sources_fingerprint(home)
