"""Recall over PostgreSQL: the one ranking pipeline (recall/ranking/pipeline.py) over one
user's rows (source.py), then render, as the embedded engine answers.

    query -> Query -> its vector and its terms' FTS5 stems (a thread)
      -> one REPEATABLE READ READ ONLY transaction:
           users (forgets, BM25 totals, built_by, generation)
           -> pipeline.rank over PgSource: the user's matrix (cached when of this generation,
              else read in this snapshot), the dense leg (exact cosine with every row), the
              BM25 pool from the postings by FTS5's own formula (ranking/bm25.py), lexical,
              nothing relevant?, order_pool, fuse, top_hits, the neighbours
      -> users.forgets read again: changed -> run again (a forget deletes its chunks in its
         own transaction, so a fresh snapshot holds none of them)
      -> render

The one thing kept between calls is each user's matrix, and only for the generation it was
read at (vectors.py): a forget on any replica is honoured at once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psycopg

from recall.concurrency import run_in, usable_cores
from recall.domain.answers import Recalled
from recall.domain.errors import EngineError
from recall.embedder import Embedder
from recall.pg.database import Connection, Database
from recall.pg.fts import phrase_stems
from recall.pg.index import fingerprint
from recall.pg.source import PgSource, Snapshot
from recall.ranking.pipeline import Found, rank
from recall.ranking.render import render
from recall.ranking.search import MIN_SIMILARITY, Notes
from recall.ranking.text import Query
from recall.ranking.vectors import VectorCache, VectorLoads, Vectors
from recall.store import MemoryState

# A recall re-runs when a forget committed while it read; past this many tries in a row it
# gives up (a user forgetting without pause): RecallRaced, which the server answers softly.
MAX_TRIES = 5


class RecallRaced(Exception):
    """Every try of a recall overlapped a forget of the same user: nothing is returned."""


class PgSearch:
    """Recall over one user's rows in PostgreSQL, ranked as the embedded engine ranks."""

    def __init__(
        self,
        db: Database,
        embedder: Embedder,
        *,
        k: int = 3,
        candidates: int = 8,
        max_chars: int = 4000,
        half_life_days: float = 0.0,
        min_similarity: float = MIN_SIMILARITY,
        recall_concurrency: int = 4,
        cache_bytes: int = 256 * 2**20,
    ) -> None:
        self.db = db
        self.embedder = embedder
        self.k = k
        self.candidates = max(candidates, k)
        self.max_chars = max_chars
        self.half_life_days = half_life_days
        self.min_similarity = min_similarity
        self.wanted = fingerprint(embedder)
        # The query's vector and stems: CPU work off the event loop, on threads of our own
        # (no more than the cores, as the embedded engine's recalls).
        self._pool = ThreadPoolExecutor(
            min(recall_concurrency, usable_cores()), thread_name_prefix="recall-pg"
        )
        self.cache = VectorCache(cache_bytes)
        self.loads = VectorLoads(self.cache, asynchronous=True)  # one read per user at a time

    async def state(self, user_hash: str) -> MemoryState:
        async with self.db.user(user_hash, read_only=True) as conn:
            cur = await conn.execute(
                "SELECT EXISTS (SELECT 1 FROM conversations WHERE user_hash = %s),"
                " EXISTS (SELECT 1 FROM indexed WHERE user_hash = %s),"
                " EXISTS (SELECT 1 FROM users WHERE user_hash = %s AND built_by = %s),"
                # an index run due or going, as recall_indexing() counts them
                " EXISTS (SELECT 1 FROM users WHERE user_hash = %s"
                " AND (due_at IS NOT NULL OR lease_until > now()))",
                (user_hash, user_hash, user_hash, self.wanted, user_hash),
            )
            stored, indexed, current, due = await cur.fetchone() or (False,) * 4
        if indexed and current:
            return "behind" if due else "ready"
        if not stored:
            return "none"
        # No indexed row yet: the first run is on its way. Rows by another model: a rebuild.
        return "unindexed" if indexed else "pending"

    async def recall(self, user_hash: str, text: str) -> Recalled:
        """The answer for ``text`` ("" when nothing matches); EngineError when the user's index
        cannot be searched (built by another model, or its rows do not fit the query)."""
        if not text.strip():
            return Recalled("")
        query = Query.parse(text)  # once: the search and the rendering read the same analysis
        qvec, stems = await run_in(self._pool, self._analyse, query)
        for _ in range(MAX_TRIES):
            forgets, found, said = await self._search(user_hash, query, qvec, stems)
            if await self._forgets(user_hash) == forgets:
                return render(found, query, self.max_chars, user_hash, said)
        raise RecallRaced("recall overlapped a forget on every try")

    def _analyse(self, query: Query) -> tuple[np.ndarray, list[list[list[str]]]]:
        return self.embedder.embed_query([query.text])[0], phrase_stems(query.terms)

    async def close(self) -> None:
        self._pool.shutdown(wait=True)

    async def _forgets(self, user_hash: str) -> int | None:
        async with self.db.user(user_hash, read_only=True) as conn:
            cur = await conn.execute("SELECT forgets FROM users WHERE user_hash = %s", (user_hash,))
            row = await cur.fetchone()
        return None if row is None else int(row[0])

    async def _search(
        self, user_hash: str, query: Query, qvec: np.ndarray, stems: list[list[list[str]]]
    ) -> tuple[int | None, Found, Notes]:
        """One try, in one snapshot: the forgets it saw, its hits with their neighbours, and
        the answer's notes."""
        try:
            async with self.db.user(user_hash, read_only=True, repeatable=True) as conn:
                cur = await conn.execute(
                    "SELECT forgets, built_by, passages, tokens, generation FROM users"
                    " WHERE user_hash = %s",
                    (user_hash,),
                )
                row = await cur.fetchone()
                if row is None:
                    return None, [], Notes()
                forgets, built, passages, tokens, generation = row
                if passages == 0:
                    return forgets, [], Notes()
                if built != self.wanted:
                    raise EngineError("index built by another schema or model")
                source = self._source(
                    conn, Snapshot(user_hash, passages, tokens, stems), str(generation)
                )
                found, said = await rank(
                    source,
                    query,
                    qvec,
                    k=self.k,
                    candidates=self.candidates,
                    half_life_days=self.half_life_days,
                    min_similarity=self.min_similarity,
                )
                return forgets, found, said
        except psycopg.DataError as exc:  # e.g. vectors of another dimension than the query's
            raise EngineError(f"index unreadable: {type(exc).__name__}") from exc

    def _source(self, conn: Connection, snapshot: Snapshot, generation: str) -> PgSource:
        """The pipeline's source over this transaction. Its matrix is the cached one of this
        generation, or read in this snapshot: recalls of one user that miss wait for one read."""

        async def vectors() -> Vectors:
            user_hash = snapshot.user_hash
            return await self.loads.aget(
                user_hash, generation, lambda: self._read_vectors(conn, user_hash, generation)
            )

        return PgSource(conn, snapshot, vectors, self._pool)

    async def _read_vectors(self, conn: Connection, user_hash: str, generation: str) -> Vectors:
        """store.load_vectors over the user's rows: recalled answers left out (the dense leg
        never finds them), rows by ascending id."""
        cur = conn.cursor(binary=True)  # pgvector's binary form: no text to parse
        await cur.execute(
            "SELECT id, epoch, embedding FROM chunks WHERE user_hash = %s AND NOT recalled"
            " ORDER BY id",
            (user_hash,),
        )
        rows = await cur.fetchall()
        ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
        matrix = np.empty((len(rows), self.embedder.dim), dtype=np.float32)
        for n, row in enumerate(rows):
            matrix[n] = row[2].to_numpy()
        newest = max((row[1] for row in rows), default=0.0)
        return Vectors(generation, ids, matrix, float(newest))
