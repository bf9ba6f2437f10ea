"""Recall over PostgreSQL: the one ranking pipeline (recall/ranking/pipeline.py) over one
user's rows (source.py), then render, as the embedded engine answers.

    query -> Query -> its vector and its terms' FTS5 stems (a thread)
      -> one REPEATABLE READ READ ONLY transaction:
           users (the memory state, erasures, forgets, BM25 totals, built_by, generation)
           -> pipeline.rank over PgSource: the user's matrix (cached when of this generation,
              else read in this snapshot), the dense leg (exact cosine with every row), the
              BM25 pool from the postings by FTS5's own formula (ranking/bm25.py), lexical,
              nothing relevant?, order_pool, fuse, top_hits, the neighbours
      -> render
      -> users.forgets read again (a tool call: in PgStore.settle's transaction, with the audit
         line): changed -> run again (a forget deletes its chunks in its own transaction, so a
         fresh snapshot holds none of them)

The one thing kept between calls is each user's matrix, and only for the generation it was
read at (vectors.py): a forget on any replica is honoured at once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

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
from recall.ranking.pipeline import Found, Ranking, Reranker, on_threads, rank
from recall.ranking.render import render
from recall.ranking.search import MIN_SIMILARITY, Notes
from recall.ranking.text import Query
from recall.ranking.vectors import VectorCache, VectorLoads, Vectors
from recall.store import SEARCHABLE, Marked, MemoryState, Searched, leave_mark

# A recall re-runs when a forget committed while it read; past this many tries in a row it
# gives up (a user forgetting without pause): RecallRaced, which the server answers softly.
MAX_TRIES = 5


# The user's row and what the state needs, in one statement (a user with no row: NULLs).
USER_ROW = (
    "SELECT EXISTS (SELECT 1 FROM conversations WHERE user_hash = %(user)s),"
    " EXISTS (SELECT 1 FROM indexed WHERE user_hash = %(user)s),"
    " u.erasures, u.forgets, u.built_by, u.passages, u.tokens, u.generation,"
    # an index run due or going, as recall_indexing() counts them
    " coalesce(u.due_at IS NOT NULL OR u.lease_until > now(), false)"
    " FROM (SELECT) AS one LEFT JOIN users u ON u.user_hash = %(user)s"
)


class UserRow(NamedTuple):
    stored: bool  # a conversation is stored
    indexed: bool  # an indexed row is there
    erasures: int | None  # None: the user has no row
    forgets: int | None
    built_by: str | None
    passages: int | None
    tokens: int | None
    generation: Any
    due: bool  # an index run due or going


class Seen(NamedTuple):
    """A mark (recall.store.Mark): the user's erasures and forgets as a read saw them; forgets
    None for a lookup's mark (the read tool's answer does not change with a forget)."""

    erasures: int
    forgets: int | None


def memory_state(row: UserRow, wanted: str) -> MemoryState:
    """recall.store.Store.state from the user's row."""
    if row.indexed and row.built_by == wanted:
        return "behind" if row.due else "ready"
    if not row.stored:
        return "none"
    # No indexed row yet: the first run is on its way. Rows by another model: a rebuild.
    return "unindexed" if row.indexed else "pending"


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
        reranker: Reranker | None = None,
    ) -> None:
        self.db = db
        self.embedder = embedder
        self.max_chars = max_chars
        self.wanted = fingerprint(embedder)
        # The query's vector and stems, and the reranker's scores: CPU work off the event loop,
        # on threads of our own (no more than the cores, as the embedded engine's recalls).
        self._pool = ThreadPoolExecutor(
            min(recall_concurrency, usable_cores()), thread_name_prefix="recall-pg"
        )
        rerank = None if reranker is None else on_threads(self._pool, reranker.scores)
        self.ranking = Ranking(k, candidates, half_life_days, min_similarity, rerank)
        self.cache = VectorCache(cache_bytes)
        self.loads = VectorLoads(self.cache, asynchronous=True)  # one read per user at a time

    async def state(self, user_hash: str) -> MemoryState:
        async with self.db.user(user_hash, read_only=True) as conn:
            return memory_state(await self._user_row(conn, user_hash), self.wanted)

    async def search(self, user_hash: str, text: str, marked: Marked | None = None) -> Searched:
        """The memory state, the answer for ``text`` when the state is searchable (else
        ``Recalled("")``), and the counters they were read under (a Seen, for PgStore.settle),
        all in one snapshot. Whether a forget committed since is settle's to tell."""
        query = Query.parse(text) if text.strip() else None
        analysed = await run_in(self._pool, self._analyse, query) if query else None
        state, seen, found = await self._snapshot(
            user_hash, query, analysed, always=False, marked=marked
        )
        return Searched(state, found, seen)

    async def recall(self, user_hash: str, text: str) -> Recalled:
        """The answer for ``text`` ("" when nothing matches) whatever the state; EngineError
        when the user's index cannot be searched (built by another model, or its rows do not
        fit the query). On its own (tools, tests): the forgets are read again after each try."""
        if not text.strip():
            return Recalled("")
        query = Query.parse(text)  # once: the search and the rendering read the same analysis
        analysed = await run_in(self._pool, self._analyse, query)
        for _ in range(MAX_TRIES):
            _, seen, found = await self._snapshot(user_hash, query, analysed, always=True)
            if await self._forgets(user_hash) == seen.forgets:
                return found
        raise RecallRaced("recall overlapped a forget on every try")

    def _analyse(self, query: Query) -> tuple[np.ndarray, list[list[list[str]]]]:
        return self.embedder.embed_query([query.text])[0], phrase_stems(query.terms)

    async def close(self) -> None:
        self._pool.shutdown(wait=True)

    async def _forgets(self, user_hash: str) -> int:
        async with self.db.user(user_hash, read_only=True) as conn:
            cur = await conn.execute("SELECT forgets FROM users WHERE user_hash = %s", (user_hash,))
            row = await cur.fetchone()
        return 0 if row is None else int(row[0])

    async def _user_row(self, conn: Connection, user_hash: str) -> UserRow:
        cur = await conn.execute(USER_ROW, {"user": user_hash})
        return UserRow(*(await cur.fetchone() or ()))

    async def _snapshot(
        self,
        user_hash: str,
        query: Query | None,
        analysed: tuple[np.ndarray, list[list[list[str]]]] | None,
        *,
        always: bool,
        marked: Marked | None = None,
    ) -> tuple[MemoryState, Seen, Recalled]:
        """One try, in one REPEATABLE READ READ ONLY snapshot: the state, the counters, and the
        answer, ranked when the state is searchable (``always``: whatever the state). The
        erasures go to ``marked`` as soon as they are read, for a ranking that fails after."""
        try:
            async with self.db.user(user_hash, read_only=True, repeatable=True) as conn:
                row = await self._user_row(conn, user_hash)
                state = memory_state(row, self.wanted)
                seen = Seen(row.erasures or 0, row.forgets or 0)
                # What a failed search's audit line is checked against.
                leave_mark(marked, Seen(seen.erasures, None))
                if query is None or analysed is None or not (always or state in SEARCHABLE):
                    return state, seen, Recalled("")
                found, said = await self._search(conn, user_hash, query, *analysed, row)
        except psycopg.DataError as exc:  # e.g. vectors of another dimension than the query's
            raise EngineError(f"index unreadable: {type(exc).__name__}") from exc
        # A search words its answer by the state it read (a run due: "not yet"); recall, on its
        # own, answers plainly whatever the state.
        behind = not always and state == "behind"
        answer = render(found, query, self.max_chars, user_hash, said, still_indexing=behind)
        return state, seen, answer

    async def _search(
        self,
        conn: Connection,
        user_hash: str,
        query: Query,
        qvec: np.ndarray,
        stems: list[list[list[str]]],
        row: UserRow,
    ) -> tuple[Found, Notes]:
        """The ranking in the snapshot ``conn`` holds: its hits with their neighbours, and the
        answer's notes."""
        if row.forgets is None or not row.passages:  # no user row, or nothing indexed
            return [], Notes()
        if row.built_by != self.wanted:
            raise EngineError("index built by another schema or model")
        source = self._source(
            conn, Snapshot(user_hash, row.passages, row.tokens or 0, stems), str(row.generation)
        )
        return await rank(source, query, qvec, self.ranking)

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
