"""The one seam every search engine sits behind: index a user's sources; recall a query.

A user's *home* is ``DATA_DIR/<hash>``; the sources are ``home/src/*.funes.jsonl`` (the truth),
everything else an engine keeps under ``home`` is a disposable index it can rebuild from them.
The server owns the bounds (timeout, concurrency, character cap) and the fail-soft messages;
an engine only searches, and raises when it cannot.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from recall.domain.answers import Recalled


class Engine(Protocol):
    """A search engine over one user's conversation sources."""

    name: str

    def has_memory(self, home: Path) -> bool:
        """True once an index run has produced something recall can read."""
        ...

    def index_outdated(self, home: Path) -> bool:
        """True when the index was built by another version of this engine (another layout or
        model) and must be rebuilt; checked for every user when the server starts."""
        ...

    def ready(self) -> str | None:
        """None when this engine can answer, else the name of the check that fails (GET /readyz
        reports it). Called on every readiness probe: cheap, and never loads anything."""
        ...

    async def index(self, home: Path) -> None:
        """Bring the index in ``home`` up to date with ``home/src``; EngineError on failure."""
        ...

    async def recall(self, home: Path, query: str, *, still_indexing: bool = False) -> Recalled:
        """Passages for ``query``: the text for the agent ("" when nothing matches) and where
        each passage comes from. ``still_indexing``: an index run is due or going, so a line
        that says what no conversation holds says "not yet" (recall/ranking/render.py).

        Raise EngineError when the memory cannot be searched. Must be safe to cancel
        (the server cancels it on timeout) and to run while an index run is going on.
        """
        ...

    async def forget(self, home: Path, conversation_id: str) -> int | None:
        """Remove every indexed row of a conversation whose source is already gone; the number
        of rows removed, or None when the engine cannot count them. The server runs it with the
        user's index slot held (no index run at the same time). Once it returns, no recall,
        not even one that started before it, returns that conversation's text."""
        ...

    async def close(self) -> None:
        """Stop whatever the engine keeps running between calls (worker processes); called once,
        when the server stops."""
        ...


# How long a finished forget keeps hiding its conversation from recalls that started before it
# ended: far longer than any recall may run (the server cancels them at RECALL_TIMEOUT).
FORGET_WINDOW_KEPT = 3600.0


@dataclass
class _Forgetting:
    home: Path
    conversation_id: str
    started: float
    ended: float | None = None


class ForgetWindows:
    """The conversations being forgotten, and when, for the engines' recall filters.

    A recall that overlapped a forget in time (it ended after the forget began and began before
    the forget ended) drops that conversation's passages: it may have read the index before the
    rows were gone. A recall that starts after the forget has ended reads an index without them,
    so a conversation posted again after its forget is found again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: list[_Forgetting] = []

    def open(self, home: Path, conversation_id: str) -> _Forgetting:
        window = _Forgetting(home, conversation_id, time.monotonic())
        with self._lock:
            self._windows.append(window)
        return window

    def close(self, window: _Forgetting) -> None:
        with self._lock:
            window.ended = time.monotonic()

    def hidden(self, home: Path, recall_started: float) -> set[str]:
        """Conversation ids a recall of ``home`` that began at ``recall_started`` (monotonic)
        and ends now must not return."""
        now = time.monotonic()
        with self._lock:
            self._windows = [
                w for w in self._windows if w.ended is None or now - w.ended < FORGET_WINDOW_KEPT
            ]
            return {
                w.conversation_id
                for w in self._windows
                if w.home == home and (w.ended is None or w.ended >= recall_started)
            }
