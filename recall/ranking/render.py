"""The passage format: what the agent reads. A contract (docs/CONTRACTS.md), pinned byte for byte
by tests/test_render.py; change it only on purpose.

Each hit, best first, is one block:

    [2026-10-08 14:05 UTC] user · ref 5d1c0a9e3b7f turn 3
    <the passage, whole, or an excerpt around the query's identifier when it must be cut>
      ~ before (user): <two turns before, on one line, whole where it fits>
      ~ before (assistant): <the turn before>
      ~ after (assistant): <the turn after>
      ~ after (user): <two turns after>
    ---

- The header is the turn's time in UTC, its role, and where `read_my_conversation` reads it whole:
  the conversation's reference and the turn's number (recall/reading.py); no conversation ids,
  chunk ids or paths.
- The answer's notes (search.Notes), when there are any, come before the first block (the
  identifiers no conversation mentions; the near-miss label) and after the last (clearly more
  passages match than are shown), each on a line of its own; the blocks share what they leave.
  While the user's index is behind (a run due or going), the identifiers are those no *indexed*
  conversation mentions, and their line says so (NEVER_MENTIONED_YET): the run may prove it wrong.
- The whole answer is at most ``max_chars`` characters. Each of the first SHARES hits gets a fair
  share of what the ones before it left, as in an answer of SHARES hits (or of fewer, when
  fewer are found); each later one what is left, so a larger k never shortens the first blocks.
  A hit that cannot fit a useful line is left out.
- Up to NEIGHBOURS turns before and after the hit's follow it, in conversation order.
- Within a block the passage comes first: an adjacent turn keeps up to NEIGHBOUR_MIN characters
  (whole when shorter) unless the passage alone would not fit. A passage that must be cut keeps in
  view the first query term it contains (the query's identifiers before its other words): when
  that term is not near the start, the excerpt starts with an ellipsis a little before it.
  Whatever is shortened ends with an ellipsis, at a word where that loses little. The neighbours
  share what is left, nearest first (then shortest first), each on one line; one that cannot
  keep 20 characters is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from recall.domain.answers import (
    MORE_MATCH,
    NEAR_MISSES,
    NEVER_MENTIONED,
    NEVER_MENTIONED_YET,
    Passage,
    Recalled,
)
from recall.domain.conversation import place
from recall.ranking.search import Hit, Notes
from recall.ranking.text import Query

NEIGHBOURS = 4  # turns shown before and after each hit, nearest first when room is short
# The first hits get the room they get in an answer of this many (the default RECALL_K), at any
# k: a larger k adds passages after them, never shortens theirs (issue 34: k=8 with fair shares
# of MAX_RESULT_CHARS cut the neighbours that held k=3's answers). An answer of fewer hits shares
# the room among those it has.
SHARES = 3
NEIGHBOUR_MIN = 160  # chars a neighbour keeps before the passage itself is shortened
ELLIPSIS = "…"
NO_NOTES = Notes()


RECALLED_ROLE = "{role}, answered from recall"  # how a recalled neighbour is labelled


class Neighbour(NamedTuple):
    """A turn near a hit's: ``offset`` turns after it (negative: before); its pieces joined;
    ``role`` says when the turn was answered from recall (RECALLED_ROLE)."""

    offset: int
    role: str
    text: str

    @property
    def where(self) -> str:
        return "before" if self.offset < 0 else "after"


def gather_neighbours(
    seq: int, pieces: Iterable[tuple[int, str, str, bool | int]]
) -> list[Neighbour]:
    """The neighbours of turn ``seq`` from the pieces of the turns around it, (seq, role, text,
    recalled) in conversation order: each turn's pieces joined, a recalled turn labelled."""
    parts: dict[int, tuple[str, list[str]]] = {}
    for turn_seq, role, text, recalled in pieces:
        label = RECALLED_ROLE.format(role=role) if recalled else role
        parts.setdefault(turn_seq, (label, []))[1].append(text)
    return [
        Neighbour(at - seq, role, " ".join(texts)) for at, (role, texts) in sorted(parts.items())
    ]


def render(
    hits: list[tuple[Hit, list[Neighbour]]],
    query: Query,
    max_chars: int,
    user: str,
    notes: Notes = NO_NOTES,
    *,
    still_indexing: bool = False,
) -> Recalled:
    """The hits in order, each given its share of what the ones before it left, between the
    notes' lines; each shown hit is a passage, its span its block. ``user`` (the user's hash)
    makes the references; ``still_indexing`` (the user's index is behind) words the identifiers
    no conversation mentions as "not yet"."""
    lead, tail = _note_lines(notes, bool(hits), still_indexing)
    out: list[str] = [lead]
    shown: list[Passage] = []
    remaining = max_chars - len(lead) - len(tail)
    for n, (hit, neighbours) in enumerate(hits):
        where = place(user, hit.conv, hit.seq)
        share = remaining // max(min(SHARES, len(hits)) - n, 1)
        block = _render_hit(hit, where, neighbours, query.focus, share)
        if block:
            start = len("".join(out))
            shown.append(Passage(hit.conv, hit.turn, hit.ts, hit.role, start, start + len(block)))
        out.append(block)
        remaining -= len(block)
    if not shown:  # no passage (or none fitted): only what no conversation mentions, if any
        return Recalled(_note_lines(notes, False, still_indexing)[0].rstrip("\n"))
    out.append(tail)
    return Recalled("".join(out), tuple(shown)).cut(max_chars)


def _note_lines(notes: Notes, any_hits: bool, still_indexing: bool) -> tuple[str, str]:
    """The lines before the first block and after the last."""
    named = " or ".join(", ".join(notes.unknown).rsplit(", ", 1))
    never = NEVER_MENTIONED_YET if still_indexing else NEVER_MENTIONED
    lead = never.format(named) + "\n" if notes.unknown else ""
    if notes.near_misses and any_hits:
        lead += NEAR_MISSES.format(named) + "\n"
    tail = MORE_MATCH.format(notes.more) + "\n" if notes.more else ""
    return lead, tail


def _render_hit(
    hit: Hit, where: str, neighbours: list[Neighbour], terms: Sequence[str], budget: int
) -> str:
    """One hit as a block of at most ``budget`` chars; "" when not even a useful line fits."""
    when = datetime.fromisoformat(hit.ts.replace("Z", "+00:00")).astimezone(UTC)
    header = f"[{when:%Y-%m-%d %H:%M} UTC] {hit.role} · {where}\n"
    footer = "---\n"
    room = budget - len(header) - len(footer)
    if room < 40:
        return ""
    around = [(f"  ~ {n.where} ({n.role}): ", " ".join(n.text.split())) for n in neighbours]
    distance = [abs(n.offset) for n in neighbours]
    # The passage comes first; the adjacent turns keep a little room (whole when short) unless
    # the passage alone would not fit.
    reserve = sum(
        min(len(lbl) + len(txt), len(lbl) + NEIGHBOUR_MIN) + 1
        for (lbl, txt), far in zip(around, distance, strict=True)
        if far == 1
    )
    limit = max(room - reserve, min(room, 200)) - 1
    passage = _excerpt(hit.text.strip(), terms, limit) + "\n"
    room -= len(passage)
    # Share what is left between the neighbours, nearest first, and within one distance the
    # shortest first, so a short one leaves its unused share to the next.
    lines: dict[int, str] = {}
    order = sorted(range(len(around)), key=lambda i: (distance[i], len(around[i][1])))
    for n, i in enumerate(order):
        label, text = around[i]
        same_distance = sum(1 for j in order[n:] if distance[j] == distance[i])
        share = room // same_distance - len(label) - 1
        if share < 20:
            continue
        line = label + _shorten(text, share) + "\n"
        lines[i] = line
        room -= len(line)
    return header + passage + "".join(lines[i] for i in sorted(lines)) + footer


def _excerpt(text: str, terms: Sequence[str], limit: int) -> str:
    """``text`` cut to ``limit`` chars, around the first query term when the start lacks it."""
    if len(text) <= limit:
        return text
    lower = text.lower()
    for term in terms:
        at = lower.find(term)
        if at == -1:
            continue
        if at + len(term) <= limit * 0.75:
            break  # already near the start: a plain cut keeps it
        start = text.find(" ", max(at - limit // 4, 0), at)  # begin at a word
        start = at if start == -1 else start + 1
        return ELLIPSIS + _shorten(text[start:], limit - len(ELLIPSIS))
    return _shorten(text, limit)


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return ""
    cut = text[: limit - len(ELLIPSIS)]
    space = cut.rfind(" ")
    if space > limit * 0.6:  # end at a word when that loses little
        cut = cut[:space]
    return cut.rstrip() + ELLIPSIS
