"""The one seam every search engine sits behind: index a user's sources; recall a query.

A user's *home* is ``DATA_DIR/<hash>``; the sources are ``home/src/*.funes.jsonl`` (the truth),
everything else an engine keeps under ``home`` is a disposable index it can rebuild from them.
The server owns the bounds (timeout, concurrency, character cap) and the fail-soft messages;
an engine only searches, and raises when it cannot.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

# What the agent reads when there is nothing to say. One place, so every engine says the same.
NO_MEMORY = "No earlier conversations are stored for this user yet."
NOTHING_FOUND = "Nothing relevant found in earlier conversations."
UNAVAILABLE = "Conversation memory is unavailable right now; continue without it."
# Stored, but the first index run has not finished yet (not a failure: it is on its way).
NOT_YET = (
    "Earlier conversations are not searchable yet: they are still being indexed. Try again in a "
    "few seconds."
)
# Searchable, and nothing matched, while an index run is due or going (recent conversations
# not in the index yet): no negative said as fact.
NOTHING_YET = (
    "Nothing found so far, but recent conversations are still being indexed: search again in a "
    "few seconds before concluding that it was never discussed."
)
# The answer's own lines beside its passages (the embedded ranking's; docs/CONTRACTS.md).
# The query names identifiers that no stored conversation holds (as written, "P-7"):
NEVER_MENTIONED = "No earlier conversation mentions {}."
# ... as far as the index goes, while a run is due or going (the server's, see still_indexing):
NEVER_MENTIONED_YET = (
    "No conversation indexed so far mentions {}, and recent ones are still being indexed: search "
    "again in a few seconds before concluding that it was never mentioned."
)
# ... and the passages that follow are only the closest to the rest of the query:
NEAR_MISSES = "Not a match: the passages closest to the rest of the query, none of them about {}:"
# Clearly more passages match than are shown (the last line):
MORE_MATCH = (
    "At least {} more passages match as well as these and are not shown: ask narrower queries "
    "(add a name, a place, a date or an identifier) to see them."
)


class EngineError(Exception):
    """An index run or a recall failed; the message names the cause, never user text."""


@dataclass(frozen=True)
class Passage:
    """Where one hit of an answer comes from, told by the engine that found it (never parsed
    back out of the text, which holds the user's own words): its conversation and turn, the
    turn's time and role, and the span of the answer's text that shows it. For the audit and
    the memory page; the agent sees only the text."""

    conversation_id: str
    turn_id: str
    ts: str  # the turn's time in UTC as stored, ...Z
    role: str | None  # None where the engine does not say (funes prints no role)
    start: int
    end: int


@dataclass(frozen=True)
class Recalled:
    """A recall's answer: the text for the agent ("" when nothing matched), and its passages
    in the order they appear in it."""

    text: str
    passages: tuple[Passage, ...] = ()

    def cut(self, max_chars: int) -> Recalled:
        """The first ``max_chars`` characters, with the passages that still show in them."""
        if len(self.text) <= max_chars:
            return self
        kept = tuple(
            replace(p, end=min(p.end, max_chars)) for p in self.passages if p.start < max_chars
        )
        return Recalled(self.text[:max_chars], kept)


# The fixed answers by name: the outcome of a recall in the audit and in /metrics.
OUTCOMES = {
    NO_MEMORY: "no_memory",
    NOTHING_FOUND: "nothing_found",
    UNAVAILABLE: "unavailable",
    NOT_YET: "not_yet",
    NOTHING_YET: "not_yet",
}


def outcome(answer: Recalled) -> str:
    """A fixed answer's name; else "passages" when it shows any, "nothing_found" when it only
    says which identifiers no conversation mentions."""
    return OUTCOMES.get(answer.text) or ("passages" if answer.passages else "nothing_found")


def still_indexing(answer: Recalled) -> Recalled:
    """``answer`` for a user whose index is behind the stored conversations (an index run due
    or going): nothing found, or an identifier no indexed conversation mentions, is told as
    "not yet" rather than as a fact the run may prove wrong. Passages stay as they are."""
    if not answer.text or answer.text == NOTHING_FOUND:
        return Recalled(NOTHING_YET)
    first, newline, rest = answer.text.partition("\n")
    head, tail = NEVER_MENTIONED.split("{}")
    if not (first.startswith(head) and first.endswith(tail)):
        return answer
    line = NEVER_MENTIONED_YET.format(first[len(head) : len(first) - len(tail)])
    moved = len(line) - len(first)
    shifted = (replace(p, start=p.start + moved, end=p.end + moved) for p in answer.passages)
    return Recalled(line + newline + rest, tuple(shifted))


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

    async def recall(self, home: Path, query: str) -> Recalled:
        """Passages for ``query``: the text for the agent ("" when nothing matches) and where
        each passage comes from.

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
