"""What the tools and the memory page's search answer, and how each answer fails soft.

One sequence for every call: the store's mark (so that an erase during the call can be told),
the user's memory state, the bounded and timed recall or read, the check that no erase came
since the mark, and for a tool call the line in the user's own audit. Whatever goes wrong (the
store down, the engine failing, the timeout), the agent gets one of the fixed soft answers
(recall/engines/base.py) and the conversation goes on; the cause goes to the log only, the
outcome to /metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from fastmcp.server.auth import AccessToken

from recall import reading
from recall.auth import client_of, user_from_token
from recall.concurrency import BoundedRuns
from recall.domain.answers import (
    NO_MEMORY,
    NOT_YET,
    NOTHING_FOUND,
    UNAVAILABLE,
    Recalled,
    still_indexing,
)
from recall.domain.conversation import LONE_SURROGATE, user_dir_name
from recall.domain.errors import EngineError, StoreUnavailable
from recall.logs import user_fields
from recall.metrics import Metrics, recall_timed_out
from recall.store import AuditLine, Mark, Store

log = logging.getLogger("recall")

MAX_QUERY_CHARS = 500  # a query is a few words; the cap bounds what one call can make us scan

Answer = Callable[[str, Mark], Awaitable[Recalled]]  # a call's work, for a user since a mark
AuditEntry = Callable[[str | None, Recalled], AuditLine]  # its audit line: client, answer


def search_query(query: str) -> str:
    """What a query searches, from the tool and the memory page alike: trimmed, a cut character
    (a lone UTF-16 surrogate, which the page's JSON may carry) made U+FFFD, at most
    MAX_QUERY_CHARS."""
    return LONE_SURROGATE.sub("\ufffd", query.strip())[:MAX_QUERY_CHARS]


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
        self.search: Callable[[str, str, Mark], Awaitable[Recalled]] = metrics.recall(self._search)

    async def for_caller(
        self, token: AccessToken | None, answer: Answer, audit_line: AuditEntry
    ) -> str:
        """A tool call for the user the verified token names (never an argument): its answer,
        recorded in that user's own audit."""
        user = user_from_token(token, self.user_claim)
        if user is None:
            log.warning("tool call refused: token has no %s claim", self.user_claim)
            return UNAVAILABLE
        user_hash = user_dir_name(user)  # from the verified token, never from an argument
        try:
            mark = await self.store.mark(user_hash)
        except StoreUnavailable:
            return UNAVAILABLE
        found = await answer(user_hash, mark)
        # The user's own audit: who looked up what, which passages; none when an erase overlapped.
        line = audit_line(client_of(token, user), found)
        try:
            await self.store.append_audit(user_hash, line, mark)
        except (OSError, StoreUnavailable) as exc:  # fail soft: the answer still goes out
            log.warning("audit for user %s not written: %s", user_hash, type(exc).__name__)
        return found.text

    async def page_search(self, user: str, query: str) -> Recalled:
        """The memory page's search: the tool's own (bounds, fail-soft), not audited."""
        try:
            mark = await self.store.mark(user)
        except StoreUnavailable:
            return Recalled(UNAVAILABLE)
        return await self.search(user, query, mark)

    async def read(
        self, user: str, ref: str, from_turn: int, to_turn: int | None, mark: Mark
    ) -> Recalled:
        """The read tool's answer, in the search's slots, timeout and fail-soft answers."""
        try:
            found = await self.recalls.run(lambda: reading.find(self.store, user, ref))
        except Exception as exc:
            return self.failed_soft(user, "read", exc)
        answer = (
            Recalled(reading.NOT_FOUND)
            if found is None
            else reading.Reading(ref, *found, from_turn, to_turn).render(self.max_result_chars)
        )
        return await self.unless_erased(user, mark, answer, Recalled(reading.NOT_FOUND))

    async def _search(self, user: str, query: str, mark: Mark) -> Recalled:
        found = await self.search_memory(user, query)
        return await self.unless_erased(user, mark, found, Recalled(NO_MEMORY))

    async def unless_erased(
        self, user: str, mark: Mark, found: Recalled, erased: Recalled
    ) -> Recalled:
        """``found``, or ``erased`` when an erase came since ``mark``: a call that overlapped
        an erase may have read what it erased, and none of it goes out."""
        try:
            return erased if await self.store.erased_since(user, mark) else found
        except StoreUnavailable:
            return Recalled(UNAVAILABLE)

    def failed_soft(self, user: str, what: str, exc: Exception) -> Recalled:
        """What a tool answers when its work failed: the cause to the log, never to the agent;
        whatever went wrong, the conversation goes on."""
        log.warning("%s failed for user %s: %s", what, user, describe(exc), extra=user_fields(user))
        if isinstance(exc, TimeoutError):  # the same answer; another outcome in /metrics
            recall_timed_out()
        if isinstance(exc, EngineError):
            self.store.repair(user)  # an unreadable index is rebuilt, not waited on
        return Recalled(UNAVAILABLE)

    async def search_memory(self, user: str, query: str) -> Recalled:
        """The search's answer by the user's memory state: passages, or the soft answer that
        says why there are none."""
        started = time.monotonic()
        try:
            state = await self.store.state(user)
            if state == "none":
                return Recalled(NO_MEMORY)
            if state == "pending":  # the first index run is not done: no loss, say it as it is
                self.store.repair(user)  # see that the run is due: the user is waiting for it
                return Recalled(NOT_YET)
            if state == "unindexed":
                # Conversations stored, and the index built for them lost (deleted, corrupt).
                log.warning(
                    "recall for user %s: no readable index; rebuilding",
                    user,
                    extra=user_fields(user),
                )
                self.store.repair(user)
                return Recalled(UNAVAILABLE)
            if not query:
                return Recalled(NOTHING_FOUND)
            found = await self.recalls.run(lambda: self.store.recall(user, query))
        except Exception as exc:  # fail soft
            return self.failed_soft(user, "recall", exc)
        seconds = time.monotonic() - started
        log.info("recall for user %s in %.3fs", user, seconds, extra=user_fields(user, seconds))
        if state == "behind":  # what the due run has not read yet is no "nothing" as a fact
            found = still_indexing(found)
        found = found.cut(self.max_result_chars)
        return found if found.text else Recalled(NOTHING_FOUND)
