"""PostgreSQL as the pipeline's Source (recall/ranking/pipeline.py): one user's rows, read in the
recall's REPEATABLE READ transaction.

The BM25 pool comes from the postings: the query terms' passage counts (`terms`), the rows
holding each one-stem phrase with their (tf in text, tf in ids), and for a phrase of several
stems ("user_id") the rows holding every stem, tokenised again (fts.phrase_counts) in batches on
the recall's threads; ranked by FTS5's own formula (ranking/bm25.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from recall.concurrency import run_in
from recall.pg.database import Connection
from recall.pg.fts import phrase_counts
from recall.ranking.bm25 import Held, best_rows
from recall.ranking.pipeline import Piece, Pool
from recall.ranking.search import (
    Candidate,
    Hit,
    Pooled,
    common_floor,
    known_counts,
    searched_terms,
)
from recall.ranking.text import Query, stem_prefixes
from recall.ranking.vectors import Vectors

# Rows tokenised per step when counting the phrases of several stems ("user_id"): 50-100 ms of
# a thread for 500 rows of two dozen such words each, so a cancelled recall stops within that.
PHRASE_BATCH = 500


@dataclass(frozen=True)
class Snapshot:
    """What the recall's transaction read of the user: the BM25 totals of its searchable rows,
    and its query's phrases (fts.phrase_stems: per term, one phrase of stems per form)."""

    user_hash: str
    passages: int
    tokens: int
    stems: list[list[list[str]]]


class PgSource:
    """One user's rows in one snapshot: ``vectors`` gives the matrix (PgSearch's cache, which
    checks the snapshot's generation); ``threads`` tokenise phrases off the event loop."""

    def __init__(
        self,
        conn: Connection,
        snapshot: Snapshot,
        vectors: Callable[[], Awaitable[Vectors]],
        threads: ThreadPoolExecutor,
    ) -> None:
        self.conn = conn
        self.snapshot = snapshot
        self.user_hash = snapshot.user_hash
        self._vectors = vectors
        self.threads = threads

    async def vectors(self) -> Vectors:
        return await self._vectors()

    async def pool(self, query: Query, size: int) -> Pool:
        # Each term's phrases, one per form (text.fts_forms): FTS5's `"form" OR "form"`.
        stems = self.snapshot.stems
        stems_of = dict(zip(query.terms, stems, strict=True))
        # A common word is told by its prefixes (text.common_count): only those are read.
        probes = {prefix for term in query.terms for prefix in stem_prefixes(term)}
        cur = await self.conn.execute(
            "SELECT term, docs FROM terms WHERE user_hash = %s AND term = ANY(%s)",
            (self.user_hash, sorted(probes | {s for forms in stems for p in forms for s in p})),
        )
        docs: dict[str, int] = dict(await cur.fetchall())
        floor = common_floor(self.snapshot.passages)
        common = {p: docs[p] for p in probes if docs.get(p, 0) > floor}
        counts = known_counts(query, common)
        searched = searched_terms(query, common)
        phrases = [phrase for term in searched for phrase in stems_of[term]]
        owner = [term for term in searched for _ in stems_of[term]]  # each phrase's term
        length: dict[int, int] = {}
        held = await self._held(phrases, length)
        rows_of: dict[str, set[int]] = {}  # a term's count: the rows holding any of its forms
        for term, h in zip(owner, held, strict=True):
            rows_of.setdefault(term, set()).update(h)
        counts.update({t: len(rows_of.get(t, ())) for t in searched if t not in counts})
        passages, tokens = self.snapshot.passages, self.snapshot.tokens
        pool = best_rows(held, length, passages, tokens, size)
        cur = await self.conn.execute(
            "SELECT id, text, ids FROM chunks WHERE user_hash = %s AND id = ANY(%s)",
            (self.user_hash, pool),
        )
        pooled = {row[0]: row for row in await cur.fetchall()}
        return Pool(counts, passages, [Pooled(c, pooled[c][1], pooled[c][2].split()) for c in pool])

    async def _held(self, phrases: list[list[str]], length: dict[int, int]) -> list[Held]:
        """Each phrase's rows with its (tf in text, tf in ids) in each; ``length`` gets those
        rows' token counts."""
        # Each one-stem phrase (nearly every query word): the rows holding it, from its postings.
        cur = await self.conn.execute(
            "SELECT p.term, p.chunk_id, p.tf_text, p.tf_ids, c.tokens FROM postings p"
            " JOIN chunks c ON c.user_hash = p.user_hash AND c.id = p.chunk_id"
            " WHERE p.user_hash = %s AND p.term = ANY(%s)",
            (self.user_hash, sorted({phrase[0] for phrase in phrases if len(phrase) == 1})),
        )
        by_stem: dict[str, dict[int, tuple[int, int]]] = {}
        for term, chunk_id, tf_text, tf_ids, row_tokens in await cur.fetchall():
            by_stem.setdefault(term, {})[chunk_id] = (tf_text, tf_ids)
            length[chunk_id] = row_tokens
        # Phrases of several stems ("user_id" is "user" "id"): counted in the rows' own text.
        several = list(dict.fromkeys(tuple(phrase) for phrase in phrases if len(phrase) > 1))
        in_rows = await self._phrases(several, length) if several else {}
        return [
            by_stem.get(phrase[0], {}) if len(phrase) == 1 else in_rows.get(tuple(phrase), {})
            for phrase in phrases
        ]

    async def _phrases(
        self, phrases: list[tuple[str, ...]], length: dict[int, int]
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
        cur = await self.conn.execute(
            "SELECT DISTINCT p.chunk_id FROM unnest(%s::text[], %s::int[], %s::int[])"
            " AS w (term, phrase, stems)"
            " JOIN postings p ON p.user_hash = %s AND p.term = w.term"
            " GROUP BY p.chunk_id, w.phrase, w.stems HAVING count(*) = w.stems ORDER BY 1",
            (
                [w[0] for w in wanted],
                [w[1] for w in wanted],
                [w[2] for w in wanted],
                self.user_hash,
            ),
        )
        rows = [row[0] for row in await cur.fetchall()]
        found: list[dict[int, tuple[int, int]]] = [{} for _ in phrases]
        for start in range(0, len(rows), PHRASE_BATCH):
            cur = await self.conn.execute(
                "SELECT id, text, ids, tokens FROM chunks WHERE user_hash = %s AND id = ANY(%s)",
                (self.user_hash, rows[start : start + PHRASE_BATCH]),
            )
            batch = await cur.fetchall()
            pieces = [(text, ids) for _, text, ids, _ in batch]
            counts = await run_in(self.threads, phrase_counts, phrases, pieces)
            for held, in_batch in zip(found, counts, strict=True):
                for (chunk_id, _, _, row_tokens), tf in zip(batch, in_batch, strict=True):
                    if tf != (0, 0):
                        held[chunk_id] = tf
                        length[chunk_id] = row_tokens
        return dict(zip(phrases, found, strict=True))

    async def candidates(self, ids: Sequence[int]) -> list[Candidate]:
        cur = await self.conn.execute(
            "SELECT id, conversation_id, turn, seq, ts, epoch, role, text, ids FROM chunks"
            " WHERE user_hash = %s AND id = ANY(%s)",
            (self.user_hash, list(ids)),
        )
        return [Candidate(*row[:8], row[8].split()) for row in await cur.fetchall()]

    async def around(self, hits: Sequence[Hit], span: int) -> Mapping[str, Sequence[Piece]]:
        # Two hits of one conversation may share neighbours: each piece once (by its id).
        cur = await self.conn.execute(
            "SELECT DISTINCT c.id, c.conversation_id, c.seq, c.block, c.split, c.role, c.text,"
            " c.recalled FROM unnest(%s::text[], %s::int[]) AS h (conv, seq)"
            " JOIN chunks c ON c.user_hash = %s AND c.conversation_id = h.conv"
            " AND c.seq BETWEEN h.seq - %s AND h.seq + %s"
            " ORDER BY c.conversation_id, c.seq, c.block, c.split, c.id",
            ([h.conv for h in hits], [h.seq for h in hits], self.user_hash, span, span),
        )
        around: dict[str, list[Piece]] = {}
        for _, conv, seq, _, _, role, text, recalled in await cur.fetchall():
            around.setdefault(conv, []).append(Piece(seq, role, text, recalled))
        return around
