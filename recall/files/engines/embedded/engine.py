"""The embedded engine: hybrid search in-process, one SQLite file per user, no subprocess.

    index:  home/src/*.funes.jsonl -> pieces -> embed what is new -> home/embedded/recall.db
            (store.py)
    recall: query -> Query (text.py) -> the one ranking pipeline (recall/ranking/pipeline.py)
            over this db (source.py): BM25 + exact cosine over the user's cached matrix,
            fused, top k, the turns before and after -> passages under max_chars (render.py)

This module is the seam (index, recall), the thread hops, the handling of a corrupt db and the
per-user cache of vector matrices. The sources are the truth; the db is a disposable index. A db
that cannot be read is moved aside and rebuilt by the next index run; until then recall raises
EngineError (the server fails soft). Index runs and recalls each run in their own bounded thread
pool; an index run past its INDEX_TIMEOUT stops between flushes (each flush is one transaction,
so the db stays consistent).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from recall.concurrency import run_in, usable_cores
from recall.domain.answers import Recalled
from recall.domain.errors import EngineError
from recall.embedder import Embedder, release_freed_memory
from recall.files.engines.base import ForgetWindows
from recall.files.engines.embedded.source import SqliteSource
from recall.files.engines.embedded.store import (
    common_stems,
    connect,
    db_path,
    discard,
    forget_conversation,
    generation,
    is_corrupt,
    load_vectors,
    looks_like_db,
    outdated,
    reconcile,
)
from recall.ranking.pipeline import Found, Ranking, Reranker, on_this_thread, rank, run_blocking
from recall.ranking.render import render
from recall.ranking.search import MIN_SIMILARITY, Notes, common_floor
from recall.ranking.text import Query
from recall.ranking.vectors import VectorCache, VectorLoads, Vectors

if TYPE_CHECKING:
    from recall.indexing.workers import IndexWorkers

log = logging.getLogger("recall.embedded")


class RunStop:
    """Asked between flushes whether an index run must stop: its deadline passed, or its caller
    was cancelled. A thread cannot be killed; stopping between transactions loses nothing."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = float("inf")
        self.cancelled = threading.Event()

    def begin(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    def check(self) -> None:
        if self.cancelled.is_set():
            raise EngineError("embedded index run cancelled")
        if time.monotonic() > self.deadline:
            raise EngineError(f"embedded index run timed out after {self.timeout:g}s")


def index_sources(home: Path, embedder: Embedder, stop: RunStop) -> None:
    """Bring ``home``'s db up to date with its sources (an index run, on this thread); a db that
    cannot be read is moved aside and rebuilt. EngineError on failure, naming no user text."""
    stop.begin()
    path = db_path(home)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            reconcile(home, path, embedder, stop.check)
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            # Unreadable, or built by another schema or model (store.built_by).
            log.warning("embedded index of %s not usable (%s); rebuilding", home.name, exc)
            discard(path)
            reconcile(home, path, embedder, stop.check)
    except sqlite3.Error as exc:
        raise EngineError(f"embedded index run failed: {exc}") from exc
    except OSError as exc:
        raise EngineError(f"embedded index run failed: {exc.strerror or exc}") from exc
    finally:
        release_freed_memory()


class EmbeddedEngine:
    """Hybrid BM25 + dense recall over one user's sources, stored in ``home/embedded``."""

    name = "embedded"

    def __init__(
        self,
        embedder: Embedder,
        *,
        index_workers: IndexWorkers | None = None,
        k: int = 3,
        candidates: int = 8,
        max_chars: int = 4000,
        half_life_days: float = 0.0,
        cache_bytes: int = 256 * 2**20,
        index_timeout: float = 300.0,
        index_concurrency: int = 2,
        recall_concurrency: int = 4,
        min_similarity: float = MIN_SIMILARITY,
        reranker: Reranker | None = None,
    ) -> None:
        self.embedder = embedder
        # Index runs in worker processes (the server's choice), else on this process' threads.
        self.index_workers = index_workers
        self.max_chars = max_chars
        rerank = None if reranker is None else on_this_thread(reranker.scores)
        self.ranking = Ranking(k, candidates, half_life_days, min_similarity, rerank)
        # The matrices of recent users, at most cache_bytes in all (vectors.py).
        self.cache = VectorCache(cache_bytes)
        self.loads = VectorLoads(self.cache, asynchronous=False)  # one load per user at a time
        self.index_timeout = index_timeout
        # Own bounded pools, never asyncio's shared default one (see recall/concurrency.py).
        self._index_pool = ThreadPoolExecutor(index_concurrency, thread_name_prefix="recall-index")
        # A recall is CPU work that holds the GIL for part of it: on more threads than cores,
        # the threads only queue for the GIL and the cores (16 callers back to back, p99 8-20 ms
        # lower on two threads than on four; benchmark/README.md, "Load"). Recalls admitted past
        # that wait here, inside their RECALL_TIMEOUT.
        self._recall_pool = ThreadPoolExecutor(
            min(recall_concurrency, usable_cores()), thread_name_prefix="recall"
        )
        self._forgetting = ForgetWindows()

    # -- the Engine protocol -------------------------------------------------------------------

    def has_memory(self, home: Path) -> bool:
        # The header, not just the file: a db overwritten with garbage counts as no index, so
        # the server rebuilds it rather than failing every recall until the user posts again.
        return looks_like_db(db_path(home))

    def index_outdated(self, home: Path) -> bool:
        return outdated(db_path(home), self.embedder)

    def ready(self) -> str | None:
        # The model is loaded when the engine is built (the server does not start without it)
        # and stays loaded: nothing to load or check again per probe.
        return None if self.embedder is not None else "embedding_model"

    async def index(self, home: Path) -> None:
        if self.index_workers is not None:
            await self.index_workers.run(home, self.index_timeout)
            return
        stop = RunStop(self.index_timeout)
        await run_in(
            self._index_pool,
            index_sources,
            home,
            self.embedder,
            stop,
            on_cancel=stop.cancelled.set,
        )

    async def close(self) -> None:
        if self.index_workers is not None:
            await self.index_workers.close()

    async def recall(self, home: Path, query: str, *, still_indexing: bool = False) -> Recalled:
        if not query.strip():
            return Recalled("")
        return await run_in(self._recall_pool, self._recall, home, query, still_indexing)

    async def forget(self, home: Path, conversation_id: str) -> int:
        window = self._forgetting.open(home, conversation_id)
        try:
            return await run_in(self._index_pool, self._forget, home, conversation_id)
        finally:
            self._forgetting.close(window)

    def _forget(self, home: Path, conversation_id: str) -> int:
        path = db_path(home)
        # A db moved aside as corrupt may hold the conversation: it goes, post-mortem or not.
        path.with_name(path.name + ".corrupt").unlink(missing_ok=True)
        if not looks_like_db(path):
            return 0  # no index (or garbage, rebuilt from the remaining sources by the next run)
        try:
            return forget_conversation(path, conversation_id)
        except sqlite3.Error as exc:
            raise EngineError(f"embedded forget failed: {type(exc).__name__}") from exc

    # -- index ----------------------------------------------------------------------------------

    # -- recall ---------------------------------------------------------------------------------

    def _recall(self, home: Path, text: str, still_indexing: bool) -> Recalled:
        path = db_path(home)
        if not path.is_file():
            return Recalled("")
        query = Query.parse(text)  # once: the search and the rendering read the same analysis
        started = time.monotonic()
        try:
            con = connect(path, create=False)
            try:
                con.execute("BEGIN")  # one snapshot for the matrix, the FTS and the rows
                found, said = self._search(con, str(path), query)
                con.execute("COMMIT")
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise EngineError(f"embedded index unreadable: {type(exc).__name__}") from exc
        # A forget that overlapped this recall may have deleted rows after our snapshot began.
        if hidden := self._forgetting.hidden(home, started):
            found = [(h, n) for h, n in found if h.conv not in hidden]
        return render(found, query, self.max_chars, home.name, said, still_indexing=still_indexing)

    def _search(self, con: sqlite3.Connection, key: str, query: Query) -> tuple[Found, Notes]:
        """The pipeline over this snapshot, on this thread. Both legs run here one after the
        other: BM25 on a thread of its own, beside the embedding, saved a single recall 2 ms;
        under load the hand-off cost more than that (16 callers back to back: 4-20% fewer calls
        a second; benchmark/README.md, "Load")."""
        qvec = self.embedder.embed_query([query.text])[0]
        source = SqliteSource(con, lambda: self._vectors(con, key))
        return run_blocking(rank(source, query, qvec, self.ranking))

    def _vectors(self, con: sqlite3.Connection, key: str) -> Vectors:
        """The user's matrix from the cache, reloaded when an index run changed the db; recalls
        that miss for the same user wait for one load (vectors.VectorLoads)."""
        current = generation(con)
        return self.loads.get(key, current, lambda: self._loaded(con, key, current))

    def _loaded(self, con: sqlite3.Connection, key: str, current: str) -> Vectors:
        vectors = self._load_vectors(con, current)
        # The db path names the user's directory, a hash; never the user id.
        log.debug(
            "vectors of %s: %d rows, %.1f MB (cache before them %.1f of %.1f MB)",
            Path(key).parent.parent.name,
            len(vectors.ids),
            vectors.nbytes / 2**20,
            self.cache.cached_bytes / 2**20,
            self.cache.budget / 2**20,
        )
        return vectors

    @property
    def cached_bytes(self) -> int:
        """What the cached matrices hold now (at most cache_bytes)."""
        return self.cache.cached_bytes

    def _load_vectors(self, con: sqlite3.Connection, generation: str) -> Vectors:
        """Build the user's matrix (and common stems) from the db, in the caller's snapshot."""
        ids, matrix, newest = load_vectors(con, self.embedder.dim)
        common = common_stems(con, common_floor(len(ids)))
        return Vectors(generation, ids, matrix, newest, common)
