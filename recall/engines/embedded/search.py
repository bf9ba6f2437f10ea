"""Ranking: the two legs (BM25 over FTS5, exact cosine), their fusion, recency, the top k.

    query -> lexical leg (BM25, re-ordered by coverage) + dense leg (cosine over the matrix)
          -> weighted reciprocal rank fusion -> optional recency -> top k hits

The knobs below were measured on the benchmark; their figures are recorded once, in
benchmark/README.md, "What moved the numbers". Change one only with a run of that benchmark.
`fuse()` and `recency()` are pure: any engine can rank with them.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import numpy as np

from recall.engines.embedded.text import Query, coverage, fts_query, is_common

# Fusion: ranks, not scores, are fused (BM25 and cosine live on different scales); 60 is the usual
# reciprocal-rank constant. The dense leg at half weight: a passage only the model finds cannot
# push out a lexical hit; the model reorders the lexical pool and lifts what both legs found.
RRF_K = 60
LEXICAL_WEIGHT = 1.0
DENSE_WEIGHT = 0.5
# bm25 weight of the identifier column: an exact id (mt4471) is the strongest evidence there is.
IDS_COLUMN_WEIGHT = 8.0
LEXICAL_POOL = 6  # x candidates: the BM25 rows re-ordered by query coverage
# A stem in more passages than this is "common" ("line", "valves"): left out of the BM25 match
# (it adds almost nothing to BM25 but makes FTS5 score much of the table), still counted for
# coverage.
COMMON_SHARE, COMMON_MIN = 0.02, 200
# With recency on, a hit's score is scaled between RECENCY_FLOOR (very old) and 1 (newest), so
# recency reorders comparable hits without burying a strong old one under a weak new one.
RECENCY_FLOOR = 0.5


@dataclass
class Hit:
    """A stored piece that ranked, with its fused (and recency-scaled) score."""

    id: int
    conv: str
    seq: int
    ts: str
    epoch: float
    role: str
    text: str
    score: float


def common_floor(passages: int) -> float:
    """How many passages a stem must be in to count as common, for an index of ``passages``."""
    return max(COMMON_SHARE * passages, COMMON_MIN)


def lexical(
    con: sqlite3.Connection, query: Query, common: frozenset[str], candidates: int
) -> list[int]:
    """The lexical leg: rowids, best first, at most ``candidates``."""
    searched = [t for t in query.terms if not is_common(t, common)] or query.terms
    # A wider BM25 pool, re-ordered by how much of the query each passage covers.
    rows = con.execute(
        "SELECT rowid, text FROM fts WHERE fts MATCH ? ORDER BY bm25(fts, 1.0, ?) LIMIT ?",
        (fts_query(searched), IDS_COLUMN_WEIGHT, candidates * LEXICAL_POOL),
    ).fetchall()
    ranked = sorted(enumerate(rows), key=lambda r: (-coverage(query.terms, r[1][1]), r[0]))
    return [rowid for _, (rowid, _) in ranked[:candidates]]


def dense(ids: np.ndarray, matrix: np.ndarray, qvec: np.ndarray, candidates: int) -> list[int]:
    """The dense leg: the ``candidates`` rowids whose unit vectors are closest to ``qvec``."""
    if not len(ids):
        return []
    scores = matrix @ qvec
    n = min(candidates, len(scores))
    top = np.argpartition(-scores, n - 1)[:n]
    return [int(ids[i]) for i in top[np.argsort(-scores[top])]]


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


def top_hits(
    con: sqlite3.Connection,
    fused: dict[int, float],
    *,
    k: int,
    newest: float,
    half_life_days: float,
) -> list[Hit]:
    """The best ``k`` of the fused rows, recency applied when ``half_life_days`` is set."""
    if not fused:
        return []
    marks = ",".join("?" * len(fused))
    hits = [
        Hit(rowid, conv, seq, ts, epoch, role, text, fused[rowid])
        for rowid, conv, seq, ts, epoch, role, text in con.execute(
            f"SELECT id, conv, seq, ts, epoch, role, text FROM chunks WHERE id IN ({marks})",
            list(fused),
        )
    ]
    if half_life_days > 0:
        for hit in hits:
            hit.score *= recency(max(newest - hit.epoch, 0.0) / 86_400, half_life_days)
    hits.sort(key=lambda h: (-h.score, h.id))
    return hits[:k]
