"""The one seam every search engine sits behind: index a user's sources; recall a query.

A user's *home* is ``DATA_DIR/<hash>``; the sources are ``home/src/*.funes.jsonl`` (the truth),
everything else an engine keeps under ``home`` is a disposable index it can rebuild from them.
The server owns the bounds (timeout, concurrency, character cap) and the fail-soft messages;
an engine only searches, and raises when it cannot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

# What the agent reads when there is nothing to say. One place, so every engine says the same.
NO_MEMORY = "No earlier conversations are stored for this user yet."
NOTHING_FOUND = "Nothing relevant found in earlier conversations."
UNAVAILABLE = "Conversation memory is unavailable right now; continue without it."


class EngineError(Exception):
    """An index run or a recall failed; the message names the cause, never user text."""


class Engine(Protocol):
    """A search engine over one user's conversation sources."""

    name: str

    def has_memory(self, home: Path) -> bool:
        """True once an index run has produced something recall can read."""
        ...

    async def index(self, home: Path) -> None:
        """Bring the index in ``home`` up to date with ``home/src``; EngineError on failure."""
        ...

    async def recall(self, home: Path, query: str) -> str:
        """Passages for ``query`` as text for the agent, or "" when nothing matches.

        Raise EngineError when the memory cannot be searched. Must be safe to cancel
        (the server cancels it on timeout) and to run while an index run is going on.
        """
        ...
