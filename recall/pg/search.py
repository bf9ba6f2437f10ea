"""Recall over PostgreSQL: the embedded engine's pipeline (EmbeddedEngine._search, the
neighbours, render) through the shared ranking core, over one user's rows.

    query -> Query -> its vector and its terms' FTS5 stems (a thread)
      -> one REPEATABLE READ READ ONLY transaction:
           users (the memory state, erasures, forgets, BM25 totals, built_by, generation)
           -> the user's matrix: cached when of this generation, else read in this snapshot
           -> the dense leg, exact (the query's cosine with every row of the matrix)
           -> the terms' passage counts (`terms`) -> the BM25 pool from the postings (a
              phrase of several stems, "user_id": its rows tokenised again, in batches, on the
              recall's threads), by FTS5's own formula -> lexical (coverage) -> nothing relevant?
           -> order_pool -> fuse -> top_hits -> the neighbours
      -> render
      -> users.forgets read again (a tool call: in PgStore.settle's transaction, with the audit
         line): changed -> run again (a forget deletes its chunks in its own transaction, so a
         fresh snapshot holds none of them)

BM25 is FTS5's `bm25(fts, 1.0, IDS_COLUMN_WEIGHT)` (fts5_aux.c): for each query phrase,
idf = ln((N - n + 0.5) / (n + 0.5)) (1e-6 when not above 0), f = tf in text + weight x tf in
ids, score += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * D / avgdl)), summed in the query's
phrase order in floating point as FTS5 sums it; ties by id, as SQLite's sorter leaves them
(rowid order). The one thing kept between calls is each user's matrix, and only for the
generation it was read at (vectors.py): a forget on any replica is honoured at once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import psycopg

from recall.concurrency import run_in, usable_cores
from recall.domain.answers import Recalled
from recall.domain.errors import EngineError
from recall.embedder import Embedder
from recall.indexing.pieces import Neighbour, gather_neighbours
from recall.pg.database import Connection, Database
from recall.pg.fts import phrase_counts, phrase_stems
from recall.pg.index import fingerprint
from recall.ranking.render import NEIGHBOURS, render
from recall.ranking.search import (
    DENSE_WEIGHT,
    IDS_COLUMN_WEIGHT,
    LEXICAL_POOL,
    LEXICAL_WEIGHT,
    MIN_SIMILARITY,
    Candidate,
    Hit,
    Lexical,
    Notes,
    Pooled,
    common_floor,
    dense,
    fuse,
    known_counts,
    lexical,
    notes,
    nothing_relevant,
    order_pool,
    searched_terms,
    top_hits,
)
from recall.ranking.text import Query, stem_prefixes
from recall.ranking.vectors import VectorCache, Vectors
from recall.store import SEARCHABLE, MemoryState, Searched

K1, B = 1.2, 0.75  # FTS5's bm25 constants (fts5_aux.c)
TEXT_COLUMN_WEIGHT = 1.0
# A recall re-runs when a forget committed while it read; past this many tries in a row it
# gives up (a user forgetting without pause): RecallRaced, which the server answers softly.
MAX_TRIES = 5
# Rows tokenised per step when counting the phrases of several stems ("user_id"): 50-100 ms of
# a thread for 500 rows of two dozen such words each, so a cancelled recall stops within that.
PHRASE_BATCH = 500

Found = list[tuple[Hit, list[Neighbour]]]


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
        self._loads: dict[str, asyncio.Lock] = {}  # one read of a user's matrix at a time

    async def state(self, user_hash: str) -> MemoryState:
        async with self.db.user(user_hash, read_only=True) as conn:
            return memory_state(await self._user_row(conn, user_hash), self.wanted)

    async def search(self, user_hash: str, text: str) -> Searched:
        """The memory state, the answer for ``text`` when the state is searchable (else
        ``Recalled("")``), and the counters they were read under (a Seen, for PgStore.settle),
        all in one snapshot. Whether a forget committed since is settle's to tell."""
        query = Query.parse(text) if text.strip() else None
        analysed = await run_in(self._pool, self._analyse, query) if query else None
        state, seen, found = await self._snapshot(user_hash, query, analysed, always=False)
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
    ) -> tuple[MemoryState, Seen, Recalled]:
        """One try, in one REPEATABLE READ READ ONLY snapshot: the state, the counters, and the
        answer, ranked when the state is searchable (``always``: whatever the state)."""
        try:
            async with self.db.user(user_hash, read_only=True, repeatable=True) as conn:
                row = await self._user_row(conn, user_hash)
                state = memory_state(row, self.wanted)
                seen = Seen(row.erasures or 0, row.forgets or 0)
                if query is None or analysed is None or not (always or state in SEARCHABLE):
                    return state, seen, Recalled("")
                found, said = await self._search(conn, user_hash, query, *analysed, row)
        except psycopg.DataError as exc:  # e.g. vectors of another dimension than the query's
            raise EngineError(f"index unreadable: {type(exc).__name__}") from exc
        return state, seen, render(found, query, self.max_chars, user_hash, said)

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
        if row.forgets is None or row.passages == 0:  # no user row, or nothing indexed
            return [], Notes()
        if row.built_by != self.wanted:
            raise EngineError("index built by another schema or model")
        vectors = await self._vectors(conn, user_hash, str(row.generation))
        hits, said = await self._rank(
            conn, user_hash, query, qvec, stems, vectors, row.passages, row.tokens
        )
        return await self._with_neighbours(conn, user_hash, hits), said

    async def _vectors(self, conn: Connection, user_hash: str, generation: str) -> Vectors:
        """The user's matrix of this snapshot's generation: cached, or read in the snapshot.
        Recalls of one user that miss wait for one read rather than each reading it all."""
        if (cached := self.cache.get(user_hash, generation)) is not None:
            return cached
        lock = self._loads.setdefault(user_hash, asyncio.Lock())
        async with lock:
            vectors = self.cache.get(user_hash, generation)
            if vectors is None:
                vectors = await self._read_vectors(conn, user_hash, generation)
                self.cache.keep(user_hash, vectors)
        if not lock.locked():  # nobody reading: the lock goes (a waiter keeps its own)
            self._loads.pop(user_hash, None)
        return vectors

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

    async def _rank(
        self,
        conn: Connection,
        user_hash: str,
        query: Query,
        qvec: np.ndarray,
        stems: list[list[list[str]]],
        vectors: Vectors,
        passages: int,
        tokens: int,
    ) -> tuple[list[Hit], Notes]:
        """EmbeddedEngine._search over this user's rows."""
        similarity = vectors.matrix @ qvec  # each passage's cosine: both legs use it
        by_words = (
            await self._lexical(conn, user_hash, query, stems, passages, tokens)
            if query.terms
            else Lexical([], [], False)
        )
        by_meaning, best_similarity = dense(vectors.ids, similarity, self.candidates)
        if nothing_relevant(by_words, best_similarity, self.min_similarity):
            return [], notes(query, by_words)
        by_words_ranked = order_pool(by_words, vectors.ids, similarity, candidates=self.candidates)
        fused = fuse([(by_meaning, DENSE_WEIGHT), (by_words_ranked, LEXICAL_WEIGHT)])
        cur = await conn.execute(
            "SELECT id, conversation_id, turn, seq, ts, epoch, role, text, ids FROM chunks"
            " WHERE user_hash = %s AND id = ANY(%s)",
            (user_hash, list(fused)),
        )
        rows = await cur.fetchall()
        candidates = [Candidate(*row[:8], row[8].split()) for row in rows]
        hits = top_hits(
            candidates,
            fused,
            k=self.k,
            newest=vectors.newest,
            half_life_days=self.half_life_days,
            months=query.months,
            ids=query.ids,
        )
        return hits, notes(query, by_words, candidates, hits)

    async def _lexical(
        self,
        conn: Connection,
        user_hash: str,
        query: Query,
        stems: list[list[list[str]]],
        passages: int,
        tokens: int,
    ) -> Lexical:
        """store.lexical_leg over the postings: the query's term counts and its BM25 pool,
        ranked by search.lexical."""
        # Each term's phrases, one per form (text.fts_forms): FTS5's `"form" OR "form"`.
        stems_of = dict(zip(query.terms, stems, strict=True))
        # A common word is told by its prefixes (text.common_count): only those are read.
        probes = {prefix for term in query.terms for prefix in stem_prefixes(term)}
        cur = await conn.execute(
            "SELECT term, docs FROM terms WHERE user_hash = %s AND term = ANY(%s)",
            (user_hash, sorted(probes | {s for forms in stems for p in forms for s in p})),
        )
        docs: dict[str, int] = dict(await cur.fetchall())
        floor = common_floor(passages)
        common = {p: docs[p] for p in probes if docs.get(p, 0) > floor}
        counts = known_counts(query, common)
        searched = searched_terms(query, common)
        phrases = [phrase for term in searched for phrase in stems_of[term]]
        owner = [term for term in searched for _ in stems_of[term]]  # each phrase's term
        # Each one-stem phrase (nearly every query word): the rows holding it, with (tf in text,
        # tf in ids), from its postings.
        cur = await conn.execute(
            "SELECT p.term, p.chunk_id, p.tf_text, p.tf_ids, c.tokens FROM postings p"
            " JOIN chunks c ON c.user_hash = p.user_hash AND c.id = p.chunk_id"
            " WHERE p.user_hash = %s AND p.term = ANY(%s)",
            (user_hash, sorted({phrase[0] for phrase in phrases if len(phrase) == 1})),
        )
        by_stem: dict[str, dict[int, tuple[int, int]]] = {}
        length: dict[int, int] = {}
        for term, chunk_id, tf_text, tf_ids, row_tokens in await cur.fetchall():
            by_stem.setdefault(term, {})[chunk_id] = (tf_text, tf_ids)
            length[chunk_id] = row_tokens
        # Phrases of several stems ("user_id" is "user" "id"): counted in the rows' own text.
        several = list(dict.fromkeys(tuple(phrase) for phrase in phrases if len(phrase) > 1))
        in_rows = await self._phrases(conn, user_hash, several, length) if several else {}
        held = [
            by_stem.get(phrase[0], {}) if len(phrase) == 1 else in_rows.get(tuple(phrase), {})
            for phrase in phrases
        ]
        rows_of: dict[str, set[int]] = {}  # a term's count: the rows holding any of its forms
        for term, h in zip(owner, held, strict=True):
            rows_of.setdefault(term, set()).update(h)
        counts.update({t: len(rows_of.get(t, ())) for t in searched if t not in counts})
        # FTS5's BM25 over the rows that hold any searched phrase, best first, ties by id.
        idfs = [fts5_idf(passages, len(h)) for h in held]
        avgdl = tokens / passages
        scores = {
            chunk_id: bm25(
                [
                    (idf, tf[0] * TEXT_COLUMN_WEIGHT + tf[1] * IDS_COLUMN_WEIGHT)
                    for idf, h in zip(idfs, held, strict=True)
                    if (tf := h.get(chunk_id)) is not None
                ],
                length[chunk_id],
                avgdl,
            )
            for chunk_id in {c for h in held for c in h}
        }
        pool = sorted(scores, key=lambda c: (-scores[c], c))[: self.candidates * LEXICAL_POOL]
        cur = await conn.execute(
            "SELECT id, text, ids FROM chunks WHERE user_hash = %s AND id = ANY(%s)",
            (user_hash, pool),
        )
        pooled = {row[0]: row for row in await cur.fetchall()}
        rows = [Pooled(c, pooled[c][1], pooled[c][2].split()) for c in pool]
        return lexical(query, counts, rows, passages)

    async def _phrases(
        self,
        conn: Connection,
        user_hash: str,
        phrases: list[tuple[str, ...]],
        length: dict[int, int],
    ) -> dict[tuple[str, ...], dict[int, tuple[int, int]]]:
        """The rows holding each phrase of several stems ("user_id"), with its (tf in text, tf
        in ids) in each, counted as FTS5 matches it (consecutive tokens); ``length`` gets those
        rows' token counts. The postings hold no positions, so the rows holding every stem of a
        phrase are read and tokenised again: PHRASE_BATCH at a time, each batch once for all the
        phrases, on the recall's threads (about a second of CPU for 3,000 rows: never on the
        event loop, which other users' posts and /healthz need), and a cancelled recall stops
        after the batch under way. text.MAX_PHRASE_TERMS bounds the phrases."""
        # (stem, its phrase, the phrase's distinct stems): a row holding all of them is read.
        wanted = [(s, n, len(set(p))) for n, p in enumerate(phrases) for s in sorted(set(p))]
        cur = await conn.execute(
            "SELECT DISTINCT p.chunk_id FROM unnest(%s::text[], %s::int[], %s::int[])"
            " AS w (term, phrase, stems)"
            " JOIN postings p ON p.user_hash = %s AND p.term = w.term"
            " GROUP BY p.chunk_id, w.phrase, w.stems HAVING count(*) = w.stems ORDER BY 1",
            ([w[0] for w in wanted], [w[1] for w in wanted], [w[2] for w in wanted], user_hash),
        )
        rows = [row[0] for row in await cur.fetchall()]
        found: list[dict[int, tuple[int, int]]] = [{} for _ in phrases]
        for start in range(0, len(rows), PHRASE_BATCH):
            cur = await conn.execute(
                "SELECT id, text, ids, tokens FROM chunks WHERE user_hash = %s AND id = ANY(%s)",
                (user_hash, rows[start : start + PHRASE_BATCH]),
            )
            batch = await cur.fetchall()
            pieces = [(text, ids) for _, text, ids, _ in batch]
            counts = await run_in(self._pool, phrase_counts, phrases, pieces)
            for held, in_batch in zip(found, counts, strict=True):
                for (chunk_id, _, _, row_tokens), tf in zip(batch, in_batch, strict=True):
                    if tf != (0, 0):
                        held[chunk_id] = tf
                        length[chunk_id] = row_tokens
        return dict(zip(phrases, found, strict=True))

    async def _with_neighbours(self, conn: Connection, user_hash: str, hits: list[Hit]) -> Found:
        """Each hit with up to NEIGHBOURS turns before and after it (store.neighbours)."""
        if not hits:
            return []
        # Two hits of one conversation may share neighbours: each piece once (by its id).
        cur = await conn.execute(
            "SELECT DISTINCT c.id, c.conversation_id, c.seq, c.block, c.split, c.role, c.text,"
            " c.recalled FROM unnest(%s::text[], %s::int[]) AS h (conv, seq)"
            " JOIN chunks c ON c.user_hash = %s AND c.conversation_id = h.conv"
            " AND c.seq BETWEEN h.seq - %s AND h.seq + %s"
            " ORDER BY c.conversation_id, c.seq, c.block, c.split, c.id",
            ([h.conv for h in hits], [h.seq for h in hits], user_hash, NEIGHBOURS, NEIGHBOURS),
        )
        around: dict[str, list[Any]] = {}
        for _, conv, seq, _, _, role, text, recalled in await cur.fetchall():
            around.setdefault(conv, []).append((seq, role, text, recalled))
        return [
            (
                hit,
                gather_neighbours(
                    hit.seq,
                    (
                        p
                        for p in around.get(hit.conv, [])
                        if p[0] != hit.seq and abs(p[0] - hit.seq) <= NEIGHBOURS
                    ),
                ),
            )
            for hit in hits
        ]
