"""What the tools and the memory page's search answer, and how each answer fails soft.

One sequence for every call (Answers.answer): one read from the store, bounded and timed (the
search's memory state and answer, or the read tool's conversation, with the mark they were read
under), then one settle: the check that no erase (for a search, no forget) came since that mark,
and for a tool call the line in the user's own audit. On PostgreSQL that is two transactions. A
forget in between runs the search again. Whatever goes wrong (the store down, the engine
failing, the timeout), the agent gets one of the fixed soft answers (recall/domain/answers.py)
and the conversation goes on; the cause goes to the log only, the outcome to /metrics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import ClassVar

from fastmcp.server.auth import AccessToken

from recall import reading
from recall.auth import client_of, user_from_token
from recall.concurrency import BoundedRuns
from recall.domain import audit
from recall.domain.answers import (
    NO_MEMORY,
    NOT_YET,
    NOTHING_FOUND,
    NOTHING_YET,
    UNAVAILABLE,
    Recalled,
)
from recall.domain.conversation import LONE_SURROGATE, user_dir_name
from recall.domain.errors import EngineError, StoreUnavailable
from recall.logs import user_fields
from recall.metrics import Metrics, recall_timed_out
from recall.store import AuditLine, Located, Mark, Marked, Searched, Store

log = logging.getLogger("recall")

MAX_QUERY_CHARS = 500  # a query is a few words; the cap bounds what one call can make us scan
# A search runs again when a forget committed while it read; past this many tries in a row (a
# user forgetting without pause) it answers unavailable.
MAX_TRIES = 5


def search_query(query: str) -> str:
    """What a query searches, from the tool and the memory page alike: trimmed, a cut character
    (a lone UTF-16 surrogate, which the page's JSON may carry) made U+FFFD, at most
    MAX_QUERY_CHARS."""
    return LONE_SURROGATE.sub("\ufffd", query.strip())[:MAX_QUERY_CHARS]


@dataclass(frozen=True)
class Search:
    """A search: the tool's (audited) or the memory page's; ``query`` as search_query made it."""

    query: str
    erased: ClassVar[Recalled] = Recalled(NO_MEMORY)  # the answer when an erase overlapped it

    def audit_line(self, client: str | None, answer: Recalled) -> AuditLine:
        return audit.entry(client, self.query, answer)


@dataclass(frozen=True)
class Read:
    """A call of the read tool, its turns checked (reading.checked_turns)."""

    ref: str
    from_turn: int
    to_turn: int | None
    erased: ClassVar[Recalled] = Recalled(reading.NOT_FOUND)

    def audit_line(self, client: str | None, answer: Recalled) -> AuditLine:
        return reading.entry(client, self.ref, self.from_turn, self.to_turn, answer)


Call = Search | Read


def describe(exc: Exception) -> str:
    """A failure's cause for the log: our own messages hold no user text; others by type only."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) if isinstance(exc, EngineError) else type(exc).__name__


class Answers:
    """The search and the read over one store, in the recall slots (``recalls``: concurrency
    and timeout), cut to ``max_result_chars``; none of its methods raises."""

    def __init__(
        self,
        store: Store,
        recalls: BoundedRuns,
        metrics: Metrics,
        max_result_chars: int,
        user_claim: str,
    ) -> None:
        self.store = store
        self.recalls = recalls
        self.max_result_chars = max_result_chars
        self.user_claim = user_claim  # JWT_USER_CLAIM: where a token names its user
        # Counted and timed by outcome in /metrics: the tool's search and the page's alike.
        self._measured_search = metrics.recall(self.answer)

    async def for_caller(self, token: AccessToken | None, call: Call) -> str:
        """A tool call for the user the verified token names (never an argument): its answer,
        recorded in that user's own audit."""
        user = user_from_token(token, self.user_claim)
        if user is None:
            log.warning("tool call refused: token has no %s claim", self.user_claim)
            return UNAVAILABLE
        user_hash = user_dir_name(user)  # from the verified token, never from an argument
        client = client_of(token, user)
        if isinstance(call, Search):
            return (await self._measured_search(user_hash, call, True, client)).text
        return (await self.answer(user_hash, call, True, client)).text

    async def page_search(self, user: str, query: str) -> Recalled:
        """The memory page's search: the tool's own (bounds, fail-soft), not audited."""
        return await self._measured_search(user, Search(query), False, None)

    async def answer(self, user: str, call: Call, audited: bool, client: str | None) -> Recalled:
        """The one sequence: read once, then settle once (the check since the read's mark, and
        the audit line when ``audited``); an erase since -> the call's erased answer; a forget
        since a search's read -> read again, up to MAX_TRIES."""
        for _ in range(MAX_TRIES):
            found, mark = await self._read(user, call)
            line = call.audit_line(client, found) if audited else None
            try:
                settled = await self.store.settle(user, mark, line)
            except (OSError, StoreUnavailable):  # not checked: nothing read may go out
                return Recalled(UNAVAILABLE)
            if settled == "unaudited":  # fail soft: the answer still goes out
                log.warning("audit for user %s not written", user, extra=user_fields(user))
            if settled == "erased":
                return call.erased
            if settled != "forgotten":
                return found
        log.warning(
            "recall for user %s overlapped a forget on every try", user, extra=user_fields(user)
        )
        return Recalled(UNAVAILABLE)

    async def _read(self, user: str, call: Call) -> tuple[Recalled, Mark]:
        """The call's one read from the store, in the recall slots: its answer, and the mark it
        was read under; when it failed (its fail-soft answer holds nothing read), the mark it
        left before failing, so that its audit line meets the same erase check as any other."""
        started = time.monotonic()
        marked = Marked()
        try:
            if isinstance(call, Search):
                searched = await self.recalls.run(
                    lambda: self.store.search(user, call.query, marked)
                )
                return self.searched(user, call.query, searched, started), searched.mark
            located = await self.recalls.run(lambda: self.store.locate(user, call.ref, marked))
            return self.located(call, located), located.mark
        except Exception as exc:  # fail soft
            what = "recall" if isinstance(call, Search) else "read"
            return self.failed_soft(user, what, exc), marked.mark

    def located(self, call: Read, located: Located) -> Recalled:
        """The read tool's answer: the turns asked for, or that no conversation has the ref."""
        if located.found is None:
            return Recalled(reading.NOT_FOUND)
        conversation_id, turns = located.found
        shown = reading.Reading(call.ref, conversation_id, turns, call.from_turn, call.to_turn)
        return shown.render(self.max_result_chars)

    def failed_soft(self, user: str, what: str, exc: Exception) -> Recalled:
        """What a tool answers when its work failed: the cause to the log, never to the agent;
        whatever went wrong, the conversation goes on."""
        log.warning("%s failed for user %s: %s", what, user, describe(exc), extra=user_fields(user))
        if isinstance(exc, TimeoutError):  # the same answer; another outcome in /metrics
            recall_timed_out()
        if isinstance(exc, EngineError):
            self.store.repair(user)  # an unreadable index is rebuilt, not waited on
        return Recalled(UNAVAILABLE)

    def searched(self, user: str, query: str, searched: Searched, started: float) -> Recalled:
        """The search's answer by the user's memory state: passages, or the soft answer that
        says why there are none."""
        state = searched.state
        if state == "none":
            return Recalled(NO_MEMORY)
        if state == "pending":  # the first index run is not done: no loss, say it as it is
            self.store.repair(user)  # see that the run is due: the user is waiting for it
            return Recalled(NOT_YET)
        if state == "unindexed":
            # Conversations stored, and the index built for them lost (deleted, corrupt).
            log.warning(
                "recall for user %s: no readable index; rebuilding", user, extra=user_fields(user)
            )
            self.store.repair(user)
            return Recalled(UNAVAILABLE)
        if not query:
            return Recalled(NOTHING_FOUND)
        seconds = time.monotonic() - started
        log.info("recall for user %s in %.3fs", user, seconds, extra=user_fields(user, seconds))
        found = searched.found.cut(self.max_result_chars)
        if found.text:  # its own lines already worded by the state (the store told the renderer)
            return found
        # What the due run has not read yet is no "nothing" as a fact.
        return Recalled(NOTHING_YET if state == "behind" else NOTHING_FOUND)
