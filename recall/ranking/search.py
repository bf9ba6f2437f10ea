"""Ranking stages: the two legs (BM25, exact cosine), their fusion, recency, the top k. They
are composed in one place, pipeline.rank, over a source each store implements.

    query -> lexical leg (BM25, re-ordered by rarity-weighted coverage, then meaning)
          + dense leg (cosine over the matrix)
          -> nothing relevant? (weak on both legs; or no identifier asked for is in the history
             and the rest of the query is weak too) -> no hits
          -> weighted reciprocal rank fusion of legs of fixed depth -> optional recency,
             month named, ids held -> (RECALL_CANDIDATES beyond: the dense leg's next rows)
          -> top k hits, the first PLACES never two adjacent turns (the second is the
             first's neighbour): a prefix of one ranked list, whatever k
          -> notes: the identifiers no conversation holds, whether the hits are near misses,
             how many more passages match as fully as those shown (render.py words them)

The knobs below were measured on the benchmark; their figures are recorded once, in
benchmark/README.md, "What moved the numbers". Change one only with a run of that benchmark.
Everything here is pure: it ranks candidates a store has read (the BM25 pool with its term
counts, cosines, the candidate rows), never a connection. pipeline.py composes the stages, over
the SQLite engine (engines/embedded/source.py) and PostgreSQL (pg/source.py) alike; bm25.py
holds FTS5's formula for a store that has no FTS5.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from recall.ranking.text import (
    ID_COVERAGE,
    NON_WORD,
    WORD,
    Query,
    common_count,
    coverage,
    identifiers,
    is_common,
    names_month,
)

# Fusion: ranks, not scores, are fused (BM25 and cosine live on different scales); 60 is the usual
# reciprocal-rank constant. The dense leg at half weight: a passage only the model finds cannot
# push out a lexical hit; the model reorders the lexical pool and lifts what both legs found.
RRF_K = 60
LEXICAL_WEIGHT = 1.0
DENSE_WEIGHT = 0.5
# The fused legs' depths are fixed, never the settings': a larger RECALL_K or RECALL_CANDIDATES
# then ranks the very same list and takes more of it (issue 34: with the depths set by
# RECALL_CANDIDATES, 30 re-fused the legs and lost hits the default found). RECALL_CANDIDATES
# beyond DENSE_DEPTH only appends the dense leg's next rows after the fused ones (pipeline.rank).
DENSE_DEPTH = 8
LEXICAL_DEPTH = 8
LEXICAL_POOL = 6  # x LEXICAL_DEPTH: the BM25 rows re-ordered by query coverage
# The first PLACES hits are places of their own: a fused row right next to one of them is shown
# as its neighbour and ranks after them. Past them the fused rows keep their order, next to a hit
# or not: skipping them everywhere left 102 of LoCoMo's 828 evidence turns out of the ranked list
# at k=10 (a question's evidence is often two turns in a row). PLACES is the default RECALL_K:
# an answer at that k is unchanged (with fewer places than that, the rows next to them stay out
# as before: a turn is not shown twice in a short answer). benchmark/README.md, "What moved the
# numbers".
PLACES = 3
# The pool's order: covered share + POOL_MEANING x cosine. Among passages that cover the query's
# words alike (a place named both in a fact and in small talk), the one closer in meaning comes
# first, so a question that names its subject by other words still finds it.
POOL_MEANING = 0.3
# When one pooled passage holds every word of the query, the lexical leg votes only for those
# that hold at least this share of it: in a pool tied on the common words, rank 2 scores almost
# what rank 1 does in the fusion, and the dense leg's favourite among them outvoted the one
# passage that says it all ("load note b1" returned b12, b10, b13). benchmark/README.md,
# "What moved the numbers".
WHOLE_QUERY_FLOOR = 0.5
WHOLE = 0.999  # a share this high is the whole query (float sums)
# A stem in more passages than this is "common" ("line", "valves"): left out of the BM25 match
# (it adds almost nothing to BM25 but makes FTS5 score much of the table), still counted for
# coverage.
COMMON_SHARE, COMMON_MIN = 0.02, 200
# Nothing relevant: a query whose best passage is below MIN_SIMILARITY (cosine, for the packaged
# MiniLM) and covers less than MIN_COVERED of the query's weight finds nothing; so does a query
# whose identifiers the history never contains.
MIN_SIMILARITY = 0.3
MIN_COVERED = 0.34
# No identifier the query names is in the history: its closest passages are still shown, as near
# misses under their own label, when the rest of the query matches well (a passage covering at
# least this share of the rest, and the model finding one at least MIN_SIMILARITY close).
NEAR_MISS_COVERED = 0.5
# A turn from a month the query names as a time ("in May 2023", "back in January"), or whose text
# names that month as a time ("in July", not "the July delivery"), scores 1 + MONTH_BOOST times as
# much: it reorders the pool, never filters it (filters lost recall wherever tried). A month
# naming the subject lifts nothing (text.py).
MONTH_BOOST = 1.0
# "Clearly more match": at least MORE_MIN passages the ranking read but left out (neither shown
# nor next to a shown one) cover the query as fully as the best shown one (MORE_SHARE of its
# covered share, itself at least MIN_COVERED). The answer's last line then says so.
MORE_MIN = 2
MORE_SHARE = 0.9
# A turn holding every identifier the query names scores 1 + ID_BOOST times as much: the exact id
# is the strongest evidence there is, and without it a run of similar ids (KX-1011, KX-1013) that
# the model finds alike could outvote the one asked for in the fusion.
ID_BOOST = 1.0
# With recency on, a hit's score is scaled between RECENCY_FLOOR (very old) and 1 (newest), so
# recency reorders comparable hits without burying a strong old one under a weak new one.
RECENCY_FLOOR = 0.5


@dataclass
class Hit:
    """A stored piece that ranked, with its fused (and recency-scaled) score."""

    id: int
    conv: str
    turn: str  # the turn's id (turn_uuid): with conv, where the passage comes from
    seq: int
    ts: str
    epoch: float
    role: str
    text: str
    score: float


def common_floor(passages: int) -> float:
    """How many passages a stem must be in to count as common, for an index of ``passages``."""
    return max(COMMON_SHARE * passages, COMMON_MIN)


def idf(passages: int, containing: int) -> float:
    """BM25's inverse document frequency: high for a rare term, near 0 for one in most passages
    (a speaker's name, a word every chat uses)."""
    return math.log((passages - containing + 0.5) / (containing + 0.5) + 1)


@dataclass(frozen=True)
class Lexical:
    """The lexical leg's answer: rowids best first, and what the gate needs."""

    pool: list[int]  # the BM25 rows, best first
    shares: list[float]  # the share of the query's weight each pooled row covers, 0 to 1
    unknown_ids: bool  # the query names identifiers and the history holds none of them
    unknown: tuple[str, ...] = ()  # the query's identifier forms the history never holds

    @property
    def covered(self) -> float:
        """The largest share of the query's weight one passage covers."""
        return max(self.shares, default=0.0)


class Pooled(NamedTuple):
    """A row of the BM25 pool: its id, its text and its identifier forms."""

    id: int
    text: str
    ids: Sequence[str]


def searched_terms(query: Query, common: Mapping[str, int]) -> list[str]:
    """The terms the BM25 pool is matched on: the query's, less the common ones (it adds almost
    nothing to BM25 but makes the store score much of the history), unless all are common."""
    return [t for t in query.terms if not is_common(t, common)] or list(query.terms)


def known_counts(query: Query, common: Mapping[str, int]) -> dict[str, int]:
    """The passage counts of the query's common terms, from the vocabulary loaded with the
    vectors: counting a common word would read most of the index. The store counts the rest."""
    return {t: n for t in query.terms if (n := common_count(t, common)) is not None}


def lexical(
    query: Query, counts: Mapping[str, int], rows: Sequence[Pooled], passages: int
) -> Lexical:
    """The lexical leg: the BM25 pool ``rows`` (best first), each with the share of the query
    it covers (the pool is ordered by ``order_pool`` once the query's vector is known).

    ``counts`` holds how many passages contain each query term (``known_counts``, then the
    store's count of the others). Each query term weighs its rarity in this user's own
    history, so a name that occurs in every turn counts for little and a rare noun for much.
    """
    weights = {term: idf(passages, min(count, passages)) for term, count in counts.items()}
    unknown = tuple(dict.fromkeys(i for i in query.ids if counts[i] == 0))
    unknown_ids = bool(query.ids) and len(unknown) == len(set(query.ids))
    # With no identifier known, the shares are of the rest of the query (the ids and their
    # parts no passage holds would only scale every share down): whether near misses show.
    left_out = unknown_parts(query, counts) if unknown_ids else set()
    whole = sum(
        (ID_COVERAGE if t in query.ids else 1) * weights[t]
        for t in query.terms
        if t not in left_out
    )
    return Lexical(
        pool=[row.id for row in rows],
        shares=[
            coverage(query.terms, row.text, weights, row.ids) / whole if whole else 0.0
            for row in rows
        ],
        unknown_ids=unknown_ids,
        unknown=unknown,
    )


def unknown_parts(query: Query, counts: Mapping[str, int]) -> set[str]:
    """The query's identifier terms no passage holds: the joined forms and their word parts
    ("mt5120", "5120"; "mt" stays when passages hold it)."""
    parts = {w for token in identifiers(query.text.lower()) for w in WORD.findall(token)}
    return {t for t in query.terms if (t in query.ids or t in parts) and counts.get(t) == 0}


def order_pool(
    by_words: Lexical,
    cosines: Mapping[int, float] | np.ndarray,
    similarity: np.ndarray | None = None,
    *,
    candidates: int,
) -> list[int]:
    """The lexical leg's ranking: its best ``candidates`` rows by covered share plus
    ``POOL_MEANING`` x cosine; when a row covers the whole query, only the rows that cover
    ``WHOLE_QUERY_FLOOR`` of it. ``cosines`` maps a pooled rowid to its cosine (a row without
    one counts 0); or, with ``similarity``, it is the ascending rowids of the whole matrix
    (``similarity[i]`` is row ``cosines[i]``'s)."""
    by_row = cosines if similarity is None else pool_cosines(by_words.pool, cosines, similarity)
    score = [
        share + POOL_MEANING * by_row.get(rowid, 0.0)
        for rowid, share in zip(by_words.pool, by_words.shares, strict=True)
    ]
    floor = WHOLE_QUERY_FLOOR if by_words.covered >= WHOLE else 0.0
    ranked = sorted(
        (i for i, share in enumerate(by_words.shares) if share >= floor),
        key=lambda i: (-score[i], i),
    )
    return [by_words.pool[i] for i in ranked[:candidates]]


def pool_cosines(pool: Sequence[int], ids: np.ndarray, similarity: np.ndarray) -> dict[int, float]:
    """The cosines of the pooled rows, read from the whole matrix's (``similarity[i]`` is row
    ``ids[i]``'s, ``ids`` ascending)."""
    rows = np.searchsorted(ids, pool).clip(max=max(len(ids) - 1, 0))
    return {
        rowid: float(similarity[r])
        for r, rowid in zip(rows, pool, strict=True)
        if len(ids) and ids[r] == rowid
    }


def dense(ids: np.ndarray, scores: np.ndarray, candidates: int) -> tuple[list[int], float]:
    """The dense leg: the ``candidates`` rowids with the highest cosine (``scores[i]`` is row
    ``ids[i]``'s), equal cosines in row order, and the best cosine (0 for an empty matrix).
    Ties are broken by row, never by the partition, so a deeper leg starts with a shallower
    one (repeated turns embed alike)."""
    if not len(ids):
        return [], 0.0
    n = min(candidates, len(scores))
    floor = scores[np.argpartition(-scores, n - 1)[n - 1]]
    tied = np.flatnonzero(scores >= floor)  # the top n, and any row tied with the n-th
    ordered = tied[np.lexsort((tied, -scores[tied]))][:n]
    return [int(ids[i]) for i in ordered], float(scores[ordered[0]])


def nothing_relevant(by_words: Lexical, best_similarity: float, min_similarity: float) -> bool:
    """Whether to answer with no passage: neither leg found anything close (``min_similarity``
    0 turns the cosine's part off); or the identifiers asked for are not in the history and the
    rest of the query does not match well enough for near misses."""
    if by_words.unknown_ids:
        return best_similarity < min_similarity or by_words.covered < NEAR_MISS_COVERED
    return best_similarity < min_similarity and by_words.covered < MIN_COVERED


def fuse(legs: list[tuple[list[int], float]], k: int = RRF_K) -> dict[int, float]:
    """Weighted reciprocal rank fusion: each (ranked ids, weight) leg adds weight / (k + rank)."""
    fused: dict[int, float] = {}
    for ranked, weight in legs:
        for rank, rowid in enumerate(ranked):
            fused[rowid] = fused.get(rowid, 0.0) + weight / (k + rank + 1)
    return fused


def recency(age_days: float, half_life_days: float, floor: float = RECENCY_FLOOR) -> float:
    """The factor for a hit ``age_days`` older than the newest turn: 1 for the newest, halfway
    to ``floor`` after each half life."""
    return floor + (1 - floor) * 0.5 ** (age_days / half_life_days)


class Candidate(NamedTuple):
    """A fused row as the store read it: what a Hit shows, and its identifier forms."""

    id: int
    conv: str
    turn: str
    seq: int
    ts: str
    epoch: float
    role: str
    text: str
    ids: Sequence[str]


def rescored(fused: Mapping[int, float], scores: Mapping[int, float]) -> dict[int, float]:
    """The fused order fused again (``fuse``) with a reranker's (``scores``, higher first; equal
    scores in the fused order, a row the store could not read last). The reranker votes beside
    the legs rather than replacing them: alone it put small talk that names a unit before the
    fact about it (benchmark/README.md, "A cross-encoder")."""
    order = sorted(fused, key=lambda rowid: (-fused[rowid], rowid))
    by_score = sorted(order, key=lambda rowid: -scores.get(rowid, -math.inf))  # stable
    return fuse([(order, 1.0), (by_score, 1.0)])


def top_hits(
    rows: Iterable[Candidate],
    fused: Mapping[int, float],
    *,
    k: int,
    newest: float,
    half_life_days: float,
    months: Sequence[tuple[int | None, int]] = (),
    ids: Sequence[str] = (),
    after: Sequence[int] = (),
) -> list[Hit]:
    """The best ``k`` of the fused rows (``rows``: those of ``fused`` and of ``after``, in any
    order), in ``ranked_hits``'s order, each a place of its own (``choose``)."""
    ranked = ranked_hits(
        rows,
        fused,
        newest=newest,
        half_life_days=half_life_days,
        months=months,
        ids=ids,
        after=after,
    )
    return choose(ranked, k)


class Ranked(NamedTuple):
    """The ranked list before the places are chosen: the fused rows as hits, best first, and
    the rows a wider pool appends after them, in their order."""

    fused: list[Hit]
    appended: list[Hit]

    def all(self) -> list[Hit]:
        return [*self.fused, *self.appended]


def ranked_hits(
    rows: Iterable[Candidate],
    fused: Mapping[int, float],
    *,
    newest: float,
    half_life_days: float,
    months: Sequence[tuple[int | None, int]] = (),
    ids: Sequence[str] = (),
    after: Sequence[int] = (),
) -> Ranked:
    """Every fused row as a hit, best first: recency applied when ``half_life_days`` is set,
    and turns from a month the query names, or holding every identifier it names (``ids``,
    joined forms), lifted (never filtered); then the rows of ``after`` in that order, as they
    are (a wider pool appends, never reorders)."""
    asked = set(ids)
    hits = []
    read = {row.id: row for row in rows}
    for row in read.values():
        if row.id not in fused:
            continue
        hit = as_hit(row, fused[row.id])
        if asked and asked <= set(row.ids):
            hit.score *= 1 + ID_BOOST
        hits.append(hit)
    if half_life_days > 0:
        for hit in hits:
            hit.score *= recency(max(newest - hit.epoch, 0.0) / 86_400, half_life_days)
    for hit in hits:
        if in_month(hit, months):
            hit.score *= 1 + MONTH_BOOST
    hits.sort(key=lambda h: (-h.score, h.id))
    return Ranked(hits, [as_hit(read[i], 0.0) for i in after if i in read and i not in fused])


def choose(ranked: Ranked, k: int) -> list[Hit]:
    """The first ``k`` of ``ranked``: the first PLACES fused rows that are not next to a
    better one (each place's neighbours show those that
    are), then, once there are PLACES of them, the other fused rows in their order, then the
    appended rows not next to a hit chosen before them. One order whatever ``k``: a larger k
    takes more of it. A turn is never shown twice within the first PLACES passages: with fewer
    places than that, the rows next to them stay out, as they are shown as neighbours."""
    places: list[Hit] = []
    rest: list[Hit] = []
    for hit in ranked.fused:
        if len(places) < PLACES and not any(next_to(place, hit) for place in places):
            places.append(hit)
        else:
            rest.append(hit)
    chosen = places + rest if len(places) == PLACES else places
    for hit in ranked.appended:
        if len(chosen) >= k:
            break
        if not any(next_to(c, hit) for c in chosen):
            chosen.append(hit)
    return chosen[:k]


def next_to(one: Hit, other: Hit) -> bool:
    """Whether two hits are turns right next to each other in one conversation."""
    return one.conv == other.conv and abs(one.seq - other.seq) == 1


def as_hit(row: Candidate, score: float) -> Hit:
    """A candidate row as a hit scoring ``score``."""
    return Hit(row.id, row.conv, row.turn, row.seq, row.ts, row.epoch, row.role, row.text, score)


def in_month(hit: Hit, months: Sequence[tuple[int | None, int]]) -> bool:
    """Whether a hit belongs to a (year or None, month) the query names as a time: dated in it,
    or its text names the month as a time (in a turn of that year, or with the year written)."""
    year, month = int(hit.ts[:4]), int(hit.ts[5:7])
    return any(
        (m == month and y in (None, year))
        or (names_month(hit.text, m) and (y in (None, year) or str(y) in hit.text))
        for y, m in months
    )


@dataclass(frozen=True)
class Notes:
    """What an answer says besides its passages (render.py words it)."""

    unknown: tuple[str, ...] = ()  # the query's identifiers, as written, no conversation holds
    near_misses: bool = False  # the passages only come closest to the rest of the query
    more: int = 0  # passages left out that match as fully as the shown ones (0: not clearly more)


def notes(
    query: Query,
    by_words: Lexical,
    rows: Sequence[Candidate] = (),
    chosen: Sequence[Hit] = (),
) -> Notes:
    """The notes of an answer: ``rows`` are the fused candidates the store read, ``chosen``
    the hits top_hits kept of them."""
    written = {NON_WORD.sub("", token.lower()): token for token in identifiers(query.text)}
    unknown = tuple(dict.fromkeys(written[form] for form in by_words.unknown if form in written))
    if by_words.unknown_ids:
        return Notes(unknown, near_misses=bool(chosen))
    return Notes(unknown, more=more_matching(by_words, rows, chosen))


def more_matching(by_words: Lexical, rows: Sequence[Candidate], chosen: Sequence[Hit]) -> int:
    """How many of ``rows`` (not ``chosen``, nor next to a chosen hit, which shows them as its
    neighbours) cover the query as fully as the best chosen one; 0 unless at least MORE_MIN
    do and that one covers at least MIN_COVERED: "clearly more match than are shown"."""
    share = dict(zip(by_words.pool, by_words.shares, strict=True))
    best = max((share.get(hit.id, 0.0) for hit in chosen), default=0.0)
    if best < MIN_COVERED:
        return 0
    counted: list[Candidate | Hit] = list(chosen)
    for row in sorted(rows, key=lambda r: r.id):
        if share.get(row.id, 0.0) >= MORE_SHARE * best and not any(
            c.conv == row.conv and abs(c.seq - row.seq) <= 1 for c in counted
        ):
            counted.append(row)  # one place in the history: its neighbour is not another
    more = len(counted) - len(chosen)
    return more if more >= MORE_MIN else 0
