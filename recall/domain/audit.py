"""A recall audit line, as both stores keep it: when, which client (the token's `azp`/`client_id`,
never the user), the query searched, the outcome, and where each served passage came from (its
conversation and turn, the turn's time and role), never their text. Where the lines are kept:
recall/files/audit_file.py (the files store), the audit table (recall/pg/).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from recall.domain.answers import Passage, Recalled, outcome


def now() -> str:
    """The current time as the audit writes it (and `since` is compared with)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def served(passage: Passage) -> dict[str, str]:
    """Where a served passage came from, as the audit (and the memory page) names it: its
    conversation and turn, the turn's time, and its role when the engine says."""
    where = {"conversation_id": passage.conversation_id, "turn": passage.turn_id, "ts": passage.ts}
    return where | ({"role": passage.role} if passage.role else {})


def entry(client: str | None, query: str, answer: Recalled) -> dict[str, Any]:
    """One audit line for a tool call that searched ``query`` and answered ``answer`` (a
    fail-soft answer holds no passages)."""
    return {
        "at": now(),
        "client": client,
        "query": query,
        "outcome": outcome(answer),
        "served": [served(passage) for passage in answer.passages],
    }
