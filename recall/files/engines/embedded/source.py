"""The embedded engine as the pipeline's Source (recall/ranking/pipeline.py): one user's SQLite
file, read through one connection inside one snapshot the caller opened.

Its methods are coroutines only in form: each is a blocking read on the engine's recall thread,
and none ever suspends, so pipeline.run_blocking drives the pipeline over it without a loop.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence

from recall.files.engines.embedded.store import bm25_pool, candidate_rows, pieces_around
from recall.ranking.pipeline import Piece, Pool
from recall.ranking.search import Candidate, Hit
from recall.ranking.text import Query
from recall.ranking.vectors import Vectors


class SqliteSource:
    """One snapshot of a user's db: ``vectors`` gives its matrix (the engine's cache, which
    checks the snapshot's generation), read once per source."""

    def __init__(self, con: sqlite3.Connection, vectors: Callable[[], Vectors]) -> None:
        self.con = con
        self._load = vectors
        self._vectors: Vectors | None = None

    async def vectors(self) -> Vectors:
        if self._vectors is None:
            self._vectors = self._load()
        return self._vectors

    async def pool(self, query: Query, size: int) -> Pool:
        # FTS5 holds no per-term statistics cheaply: the common stems come with the matrix, and
        # the searchable passages are its rows.
        vectors = await self.vectors()
        return bm25_pool(self.con, query, vectors.common, size, len(vectors.ids))

    async def candidates(self, ids: Sequence[int]) -> list[Candidate]:
        return candidate_rows(self.con, ids)

    async def around(self, hits: Sequence[Hit], span: int) -> Mapping[str, Sequence[Piece]]:
        return pieces_around(self.con, hits, span)
