"""The store seam: a user's memory, addressed by the user's hash (never a path, never the id).

Two implementations, chosen by STORE: `files` (recall/files/store.py: one directory per user,
today's layout, the default; search by funes or the embedded engine) and `postgres`
(recall/pg/: every replica shares one database; search by the embedded ranking over it). Each
implements both halves below; the server knows only these methods.

- **Store**, the truth: conversations, tombstones, receipts, the audit, the index queue.
- **Search**, the engine: is there something to search, and recall.

A tool call reads once and checks once: `search` (or `locate`) reads the memory state and the
answer together with a mark, then `settle` checks that nothing was erased (or, for a search,
forgotten) since that mark and appends the call's audit line: on PostgreSQL two transactions.

Every method may raise StoreUnavailable (recall/domain/errors.py) when the store cannot be reached
(the database is down): the write routes answer 503 with Retry-After, the tool fails soft,
nothing is acknowledged. What is stored and the rules both stores apply are recall/domain/'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from recall.domain.answers import Recalled
from recall.domain.conversation import Conversation, Turn

Receipt = dict[str, Any]
AuditLine = dict[str, Any]
Mark = Any  # what a search or a read was read under, for `settle`: opaque to the server
MemoryState = Literal["none", "pending", "unindexed", "behind", "ready"]
SEARCHABLE: tuple[MemoryState, ...] = ("behind", "ready")  # the states a search recalls in
# What `settle` found since a mark: nothing that matters ("kept"; "unaudited" when the audit line
# could not be written), an erase, or a forget (a search's mark only: the search runs again).
Settled = Literal["kept", "unaudited", "erased", "forgotten"]


@dataclass(frozen=True)
class Searched:
    """A search read in one go: the user's memory state, the engine's answer (``Recalled("")``
    unless the state is searchable and the query is not empty), and the mark both were read
    under."""

    state: MemoryState
    found: Recalled
    mark: Mark


@dataclass
class Marked:
    """Where a read leaves the mark of its erase check as soon as it has one (the files store:
    before anything it reads; PostgreSQL: once its snapshot read the user's row), for a read
    that then fails or times out: the call's "unavailable" audit line is settled against it, as
    every other line is. None while the read has not reached the user's data."""

    mark: Mark = None


def leave_mark(marked: Marked | None, mark: Mark) -> None:
    """Leave ``mark`` in ``marked``, when the read's caller handed it one."""
    if marked is not None:
        marked.mark = mark


@dataclass(frozen=True)
class Located:
    """A read tool's lookup: the conversation a ref names, with its stored turns (None when the
    user has none by that ref), and the mark it was read under."""

    found: tuple[str, list[Turn]] | None
    mark: Mark


class Store(Protocol):
    name: str  # "files" or "postgres": /healthz, /readyz, the log
    engine_name: str  # what searches: "embedded" or "funes"

    def describe(self) -> str:
        """What serves and where the data is, for the start-up line "serving with the ..."
        (never a password)."""
        ...

    async def start(self) -> None:
        """Open what the store keeps (a pool, background loops); ConfigError when it cannot
        serve (an unknown schema version, a table owner as the server's role)."""
        ...

    async def close(self) -> None: ...

    async def refused(self) -> str:
        """Waits until the store refuses to serve for good after its start (the database came
        back with a role or schema this server must not serve from); why, in one line. The files
        store never does."""
        ...

    async def ready(self) -> str | None:
        """None when requests can succeed, else the failing check's name ("data_dir",
        "database", "engine", ...) for GET /readyz."""
        ...

    async def indexing(self) -> int:
        """Users with an index run due or going on (0 once every write went through a run)."""
        ...

    async def index_lag(self) -> tuple[int, float]:
        """Users with writes no run has started on yet, and the oldest such write's age in
        seconds (0 when none): the same on every replica of a shared store."""
        ...

    # --- the write path ------------------------------------------------------------------

    async def put(self, user: str, conversation: Conversation) -> bool:
        """Store the whole conversation, durably (committed) before returning, then schedule
        the user's index run. The tombstones decide what of it may be stored (Forgotten when
        nothing may); a stale re-post (an older snapshot of what is stored) writes nothing:
        False. Two writers of one conversation, on any replicas, end with one whole version."""
        ...

    # --- what the memory page reads -------------------------------------------------------

    async def conversation_ids(self, user: str) -> list[str]: ...

    async def conversations(self, user: str) -> dict[str, list[Turn]]:
        """Every stored conversation's lines by id, read at once (the memory page's list); one
        that cannot be read is left out, with a warning in the log."""
        ...

    async def turns(self, user: str, conversation_id: str) -> list[Turn] | None:
        """One conversation's stored lines in order; None when there is no such conversation."""
        ...

    # --- the lifecycle -------------------------------------------------------------------

    async def forget(
        self,
        user: str,
        conversation_id: str,
        reason: str,
        only_if: Callable[[list[Turn]], bool] | None = None,
    ) -> Receipt:
        """Tombstone and remove one conversation, from the truth and the index; its receipt
        (the earlier one when it was already forgotten). NotFound when it was never stored;
        NotDue when ``only_if`` (checked on the stored turns, under the conversation's lock)
        says no. Once it returns, no recall on any replica returns the conversation's text."""
        ...

    async def erase(self, user: str) -> Receipt:
        """Tombstone every turn of the user, remove everything else of theirs; the receipt."""
        ...

    async def receipts(self, user: str) -> list[Receipt]: ...

    async def sweep(self, retention_days: float) -> int:
        """Forget every conversation whose last turn is older than the retention, and prune the
        audit lines as old; how many conversations went."""
        ...

    # --- a tool call: one read, then one check (and the audit line) -------------------------

    async def search(self, user: str, query: str, marked: Marked | None = None) -> Searched:
        """The memory state and, when it is searchable and ``query`` is not empty, the engine's
        answer, read together (on PostgreSQL in one snapshot), with the mark they were read
        under. EngineError when the index cannot be searched; safe to cancel. ``marked`` gets
        the erase check's mark before the read can fail after it."""
        ...

    async def locate(self, user: str, ref: str, marked: Marked | None = None) -> Located:
        """The conversation with reference ``ref`` (recall/reading.py) and its turns, read now
        (no cache: a forget on any replica is honoured at once), with the mark (in ``marked``
        too, as soon as it is taken)."""
        ...

    async def settle(self, user: str, mark: Mark, line: AuditLine | None) -> Settled:
        """One check after a search or a lookup, and for a tool call (``line``) its audit line,
        appended only when the check found nothing (and the user has data): "erased" when an
        erase came since ``mark``; "forgotten" when a forget came since a search's mark (its
        answer may hold what went: the caller searches again). A read that failed settles with
        the mark it left in ``Marked``; None (it failed before reaching the user's data): no
        check. A search's passages go out only after a "kept" or
        "unaudited"; then none of a conversation forgotten, on any replica, before the call
        returned."""
        ...

    # --- the steps one at a time (tools and tests; the server calls the three above) ---------

    async def mark(self, user: str) -> Mark:
        """Taken before a recall; `erased_since` tells whether an erasure came since."""
        ...

    async def erased_since(self, user: str, mark: Mark) -> bool: ...

    async def append_audit(self, user: str, line: AuditLine, mark: Mark) -> None:
        """Append one audit line, unless the user was erased since ``mark`` or has no data."""
        ...

    async def audit(self, user: str, since: str | None = None) -> list[AuditLine]:
        """The audit lines, oldest first, those at or after ``since`` (a UTC ...Z time)."""
        ...

    async def audit_page(
        self, user: str, limit: int, before: int | None = None
    ) -> tuple[list[AuditLine], int | None]:
        """Up to ``limit`` lines, newest first, of those before cursor ``before`` (None: the
        end); and the next page's cursor (None: no more)."""
        ...

    # --- search -----------------------------------------------------------------------------

    async def state(self, user: str) -> MemoryState:
        """ "none": nothing stored; "pending": stored, and no index run has finished yet (the
        first is on its way); "unindexed": stored, but the index that was built cannot be read
        (gone, corrupt, built by another model): a loss; "behind": searchable, and an index run
        is due or going (the latest writes may not be searchable yet); "ready"."""
        ...

    async def recall(self, user: str, query: str) -> Recalled:
        """The engine's answer (text "" when nothing matches); EngineError when it cannot
        search. Safe to cancel. Never returns a passage of a conversation forgotten (on any
        replica) before the call returned."""
        ...

    def repair(self, user: str) -> None:
        """A recall found the index unreadable: see that it is rebuilt (no wait)."""
        ...
