"""BM25 as SQLite FTS5 scores it (`bm25(fts, 1.0, IDS_COLUMN_WEIGHT)`, fts5_aux.c), so a store
without FTS5 (PostgreSQL, over its postings) ranks the lexical pool as the embedded engine does.

For each query phrase, idf = ln((N - n + 0.5) / (n + 0.5)) (1e-6 when not above 0),
f = tf in text + IDS_COLUMN_WEIGHT x tf in ids, and
score += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * D / avgdl)), summed in the query's phrase
order in floating point as FTS5 sums it; ties by id, as SQLite's sorter leaves them (rowid order).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

K1, B = 1.2, 0.75  # FTS5's bm25 constants (fts5_aux.c)
TEXT_COLUMN_WEIGHT = 1.0
# bm25 weight of the identifier column: an exact id (mt4471) is the strongest evidence there is.
IDS_COLUMN_WEIGHT = 8.0

# A phrase's rows: chunk id -> (its count in the text column, its count in the ids column).
Held = Mapping[int, tuple[int, int]]


def fts5_idf(rows: int, hits: int) -> float:
    """FTS5's idf of a phrase found in ``hits`` of ``rows`` passages."""
    idf = math.log((rows - hits + 0.5) / (hits + 0.5))
    return idf if idf > 0.0 else 1e-6


def bm25(terms: Sequence[tuple[float, float]], length: int, avgdl: float) -> float:
    """FTS5's score of a row of ``length`` tokens: ``terms`` are the (idf, frequency) of each
    phrase it holds, in the query's order (the sum's order: floating point is not associative)."""
    score = 0.0
    for idf, freq in terms:
        score += idf * ((freq * (K1 + 1.0)) / (freq + K1 * (1 - B + B * length / avgdl)))
    return score


def best_rows(
    held: Sequence[Held], length: Mapping[int, int], passages: int, tokens: int, size: int
) -> list[int]:
    """The ``size`` best rows holding any phrase, by FTS5's BM25, ties by id: ``held`` is each
    searched phrase's rows in the query's order, ``length`` each row's tokens, ``passages`` and
    ``tokens`` the index's totals."""
    idfs = [fts5_idf(passages, len(rows)) for rows in held]
    avgdl = tokens / passages
    scores = {
        row: bm25(
            [
                (idf, tf[0] * TEXT_COLUMN_WEIGHT + tf[1] * IDS_COLUMN_WEIGHT)
                for idf, rows in zip(idfs, held, strict=True)
                if (tf := rows.get(row)) is not None
            ],
            length[row],
            avgdl,
        )
        for row in {r for rows in held for r in rows}
    }
    return sorted(scores, key=lambda row: (-scores[row], row))[:size]
