"""What a recall answers, whichever store and engine found it: the fixed answers (one place, so
every engine says the same), the answer with its passages (`Recalled`), and its outcome's name
for the audit and /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
# ... as far as the index goes, while a run is due or going (the store tells the renderer):
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
