"""The recall pipeline: every ranking stage (search.py) composed once, over a Source each store
implements (the embedded engine's SQLite file; PostgreSQL's rows), so a ranking change is made
here or in search.py and shows on both stores alike.

    vectors -> BM25 pool with its term counts -> lexical (coverage) ; cosines -> dense leg
      -> nothing relevant? -> order_pool -> fuse -> candidate rows -> (reranker) -> top_hits
      -> notes
      -> each hit's neighbours

The pipeline is a coroutine because PostgreSQL's reads are. SQLite's are blocking calls on the
engine's recall thread: its source's methods are coroutines that never suspend, and
``run_blocking`` drives the pipeline over it to its end on that thread, with no event loop
(it raises should the pipeline ever suspend there, rather than silently need one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

from recall.concurrency import run_in
from recall.ranking.render import NEIGHBOURS, Neighbour, gather_neighbours
from recall.ranking.search import (
    DENSE_DEPTH,
    DENSE_WEIGHT,
    LEXICAL_DEPTH,
    LEXICAL_POOL,
    LEXICAL_WEIGHT,
    MIN_SIMILARITY,
    Candidate,
    Hit,
    Lexical,
    Notes,
    Pooled,
    dense,
    fuse,
    lexical,
    notes,
    nothing_relevant,
    order_pool,
    rescored,
    top_hits,
)
from recall.ranking.text import Query
from recall.ranking.vectors import Vectors

Found = list[tuple[Hit, list[Neighbour]]]  # each hit, best first, with the turns around it


class Reranker(Protocol):
    """Scores (query, passage) pairs, higher first (recall/reranker.py's CrossEncoder)."""

    def scores(self, query: str, passages: Sequence[str]) -> np.ndarray: ...


Rerank = Callable[[str, Sequence[str]], Awaitable[np.ndarray]]


def on_this_thread(scores: Callable[[str, Sequence[str]], np.ndarray]) -> Rerank:
    """``scores`` as the pipeline awaits it, run right here: for a pipeline driven by
    run_blocking, which must never suspend."""

    async def rerank(query: str, passages: Sequence[str]) -> np.ndarray:
        return scores(query, passages)

    return rerank


def on_threads(pool: Executor, scores: Callable[[str, Sequence[str]], np.ndarray]) -> Rerank:
    """``scores`` as the pipeline awaits it, on a thread of ``pool``: off the event loop."""

    async def rerank(query: str, passages: Sequence[str]) -> np.ndarray:
        return await run_in(pool, scores, query, passages)

    return rerank


class Pool(NamedTuple):
    """The BM25 pool of a query, as a store read it in its snapshot."""

    counts: dict[str, int]  # how many passages hold each query term
    passages: int  # the searchable passages those counts are out of
    rows: list[Pooled]  # the best rows by BM25, best first, ties by id


class Piece(NamedTuple):
    """A stored piece of a turn near a hit (its conversation is the key it is filed under)."""

    seq: int
    role: str
    text: str
    recalled: bool | int


class Source(Protocol):
    """What a store gives the pipeline, all read in one snapshot of one user's index."""

    async def vectors(self) -> Vectors:
        """The user's matrix (and, for a store that keeps them there, its common stems)."""
        ...

    async def pool(self, query: Query, size: int) -> Pool:
        """The query's term counts and its ``size`` best rows by FTS5's BM25 (bm25.py)."""
        ...

    async def candidates(self, ids: Sequence[int]) -> list[Candidate]:
        """The rows of ``ids``, in any order."""
        ...

    async def around(self, hits: Sequence[Hit], span: int) -> Mapping[str, Sequence[Piece]]:
        """By conversation, the pieces of the turns up to ``span`` before and after each hit
        (the hit's own included or not), each piece once, in conversation order."""
        ...


@dataclass(frozen=True)
class Ranking:
    """The settings a store ranks with (RECALL_K, RECALL_CANDIDATES, the recency half life, the
    similarity floor), held once by each store: the pool is never smaller than ``k``."""

    k: int = 3
    candidates: int = 8
    half_life_days: float = 0.0
    min_similarity: float = MIN_SIMILARITY  # calibrated for the packaged model; 0: off
    # RECALL_RERANK: scores (query, passages), higher first; the store runs it where its CPU
    # work goes (the SQLite engine on its recall thread, never suspending; PostgreSQL's off
    # the event loop)
    rerank: Rerank | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", max(self.candidates, self.k))


async def rank(
    source: Source, query: Query, qvec: np.ndarray, ranking: Ranking
) -> tuple[Found, Notes]:
    """The best ``ranking.k`` passages for ``query`` (``qvec`` its vector) with their
    neighbours, and the answer's notes; none when nothing is relevant.

    The legs' depths are fixed (search.DENSE_DEPTH, LEXICAL_DEPTH), so every setting ranks the
    same fused list and ``k`` takes a prefix of it; ``ranking.candidates`` beyond DENSE_DEPTH
    appends the dense leg's next rows after it, in cosine order. The notes read the fused rows
    only, so they too are the same at any RECALL_CANDIDATES."""
    vectors = await source.vectors()
    by_words = (
        await lexical_leg(source, query, LEXICAL_DEPTH * LEXICAL_POOL)
        if query.terms
        else Lexical([], [], False)
    )
    similarity = vectors.matrix @ qvec  # each passage's cosine: both legs use it
    legs = fused_legs(by_words, vectors.ids, similarity, ranking)
    if legs is None:
        return [], notes(query, by_words)
    fused, widened = legs
    rows = await source.candidates([*fused, *widened])
    if ranking.rerank is not None:
        read = [row for row in rows if row.id in fused]
        scores = await ranking.rerank(query.text, [row.text for row in read])
        fused = rescored(fused, {row.id: float(s) for row, s in zip(read, scores, strict=True)})
    hits = top_hits(
        rows,
        fused,
        k=ranking.k,
        newest=vectors.newest,
        half_life_days=ranking.half_life_days,
        months=query.months,
        ids=query.ids,
        after=widened,
    )
    ranked = [row for row in rows if row.id in fused]
    return await with_neighbours(source, hits), notes(query, by_words, ranked, hits)


class Legs(NamedTuple):
    """The two legs fused, and the dense rows ranked after them."""

    fused: dict[int, float]  # rowid -> fused score: DENSE_DEPTH dense rows, LEXICAL_DEPTH lexical
    widened: list[int]  # the dense leg's next rows up to RECALL_CANDIDATES, not fused, by cosine


def fused_legs(
    by_words: Lexical, ids: np.ndarray, similarity: np.ndarray, ranking: Ranking
) -> Legs | None:
    """The dense leg (``similarity[i]`` is row ``ids[i]``'s cosine) fused with the lexical one,
    at their fixed depths, and the dense rows ``ranking.candidates`` widens the list with; None
    when nothing is relevant (checked first: a query that finds nothing orders and fuses
    nothing)."""
    closest, best_similarity = dense(ids, similarity, max(DENSE_DEPTH, ranking.candidates))
    if nothing_relevant(by_words, best_similarity, ranking.min_similarity):
        return None
    by_words_ranked = order_pool(by_words, ids, similarity, candidates=LEXICAL_DEPTH)
    fused = fuse([(closest[:DENSE_DEPTH], DENSE_WEIGHT), (by_words_ranked, LEXICAL_WEIGHT)])
    widened = [rowid for rowid in closest[DENSE_DEPTH:] if rowid not in fused]
    return Legs(fused, widened)


async def lexical_leg(source: Source, query: Query, size: int) -> Lexical:
    """The lexical leg: the store's BM25 pool, each row's share of the query (search.lexical)."""
    pool = await source.pool(query, size)
    return lexical(query, pool.counts, pool.rows, pool.passages)


async def with_neighbours(source: Source, hits: list[Hit], span: int = NEIGHBOURS) -> Found:
    """Each hit with up to ``span`` turns before and after it, those that exist."""
    if not hits:
        return []
    around = await source.around(hits, span)
    return [
        (
            hit,
            gather_neighbours(
                hit.seq,
                (
                    piece
                    for piece in around.get(hit.conv, ())
                    if piece.seq != hit.seq and abs(piece.seq - hit.seq) <= span
                ),
            ),
        )
        for hit in hits
    ]


T = TypeVar("T")


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine``, which must never suspend (its awaits are all blocking calls), to its
    end on this thread."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("the pipeline suspended over a blocking source")
