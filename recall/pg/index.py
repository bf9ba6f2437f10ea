"""Index runs over PostgreSQL: due users claimed across replicas, their chunks reconciled with
their conversations, and BM25's postings and term statistics kept as FTS5 keeps its own.

    users.due_at passed, no live lease -> recall_claim (FOR NO KEY UPDATE SKIP LOCKED, a lease)
      -> one run per claimed user: the conversations whose version `indexed` does not show
      -> their pieces (recall/indexing/pieces.py's rows_of) -> embed only new or changed text
      -> flushes of FLUSH_TEXTS pieces, each one transaction under the user's index lock that
         re-checks each conversation's version, writes, and last of all checks the lease and
         moves the BM25 totals in the users row
      -> the run's end: indexed_changes, due again when writes came meanwhile, lease cleared.

The pieces, their chunk keys, what counts as changed and when to flush are the ones the embedded
engine uses too (recall/indexing/pieces.py), so both stores hold the same rows; the terms are
FTS5's own (recall/pg/fts.py). A run renews its lease while it goes on; a replica killed (or
stopped) mid-run leaves it to run out, and another replica claims the user and finishes: every
flush was one transaction, and a flush whose lease is no longer its own writes nothing.

Embedding runs in the index worker processes at background priority (recall/indexing/
workers.py, as the files store's runs do), so an index run never takes the cores from a request:
in the server's process, on threads, a replica's ingest fell from 476 posts/s to 168/s while
index runs went on (benchmark/README.md, "Replicas under load"). Without workers (tests, the
benchmark's in-process runs) the caller's embedder embeds on a pool of `concurrency` threads.
Stemming runs on that pool either way, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
from psycopg import sql

from recall.concurrency import run_in
from recall.domain.conversation import SOURCE_SUFFIX
from recall.domain.errors import StoreUnavailable
from recall.embedder import Embedder, release_freed_memory
from recall.indexing.pieces import (
    Row,
    Stored,
    batch_full,
    built_by,
    changed_rows,
    embed_missing,
    rows_of,
)
from recall.pg.database import Connection, Database, xact_lock
from recall.pg.fts import Counted, count_terms

if TYPE_CHECKING:  # the worker module runs as a program (`-m`): never import it on the way there
    from recall.indexing.workers import IndexWorkers

log = logging.getLogger("recall.pg.index")

RETRY_SECONDS = 30.0  # a failed run's user is due again after this long (or the debounce)
# Conversations a run reads in one snapshot: a few round trips for a large import, not one per
# conversation, and never more than this many conversations' pieces held at once.
PLAN_READS = 32


def fingerprint(embedder: Embedder) -> str:
    """users.built_by: how the user's chunks were built (the embedded engine's schema and the
    embedder); chunks built otherwise are dropped and rebuilt."""
    return json.dumps(built_by(embedder), sort_keys=True)


def index_lock(user_hash: str) -> sql.Composed:
    """A user's index lock (held to the transaction's end): the user's index flushes, forgets and
    erases, on any replica, one at a time. Posts never take it: a flush holds it while it writes
    and takes the users row only for its last statement, so a post of the user (whose end
    updates that row) waits a moment at most, never for a flush's writes. (':' keeps the key
    apart from the conversations' locks, `<hash>/<conversation id>`.)"""
    return xact_lock(f"{user_hash}:index")


# --- dropping index rows (the caller holds the transaction and the user's index lock) ---------


async def drop_conversation(conn: Connection, user_hash: str, conversation_id: str) -> int:
    """Remove a conversation's chunks, their postings and `indexed` row, adjusting the term
    counts and users.passages/tokens; the chunks removed."""
    cur = await conn.execute(
        "DELETE FROM chunks WHERE user_hash = %s AND conversation_id = %s"
        " RETURNING id, recalled, tokens",
        (user_hash, conversation_id),
    )
    dropped = await cur.fetchall()
    await _add_totals(conn, user_hash, *await _unindex(conn, user_hash, dropped))
    await conn.execute(
        "DELETE FROM indexed WHERE user_hash = %s AND conversation_id = %s",
        (user_hash, conversation_id),
    )
    return len(dropped)


async def drop_user_index(conn: Connection, user_hash: str) -> int:
    """Remove every index row of a user (chunks, postings, terms, indexed), the BM25 totals
    reset; the chunks removed."""
    cur = await conn.execute("DELETE FROM chunks WHERE user_hash = %s", (user_hash,))
    removed = max(cur.rowcount, 0)
    for table in ("postings", "terms", "indexed"):
        await conn.execute(f"DELETE FROM {table} WHERE user_hash = %s", (user_hash,))
    await conn.execute(
        "UPDATE users SET passages = 0, tokens = 0, generation = nextval('chunk_generations')"
        " WHERE user_hash = %s",
        (user_hash,),
    )
    return removed


async def _unindex(
    conn: Connection, user_hash: str, dropped: list[tuple[int, bool, int]]
) -> tuple[int, int]:
    """The postings of chunks just deleted (id, recalled, tokens) go, and their share of the
    term counts; their share of the BM25 totals (passages, tokens) is returned, for the caller to
    move with the users row."""
    searchable = [(chunk_id, tokens) for chunk_id, recalled, tokens in dropped if not recalled]
    if not searchable:
        return 0, 0
    cur = await conn.execute(
        "DELETE FROM postings WHERE user_hash = %s AND chunk_id = ANY(%s) RETURNING term",
        (user_hash, [chunk_id for chunk_id, _ in searchable]),
    )
    gone = Counter(term for (term,) in await cur.fetchall())
    await _add_terms(conn, user_hash, {term: -n for term, n in gone.items()})
    return -len(searchable), -sum(t for _, t in searchable)


async def _add_terms(conn: Connection, user_hash: str, delta: dict[str, int]) -> None:
    """terms.docs += delta, rows that reach 0 deleted (sorted: one lock order)."""
    terms = sorted(t for t, n in delta.items() if n)
    if not terms:
        return
    await conn.execute(
        "INSERT INTO terms (user_hash, term, docs)"
        " SELECT %s, term, docs FROM unnest(%s::text[], %s::int[]) AS d (term, docs)"
        " ON CONFLICT (user_hash, term) DO UPDATE SET docs = terms.docs + excluded.docs",
        (user_hash, terms, [delta[t] for t in terms]),
    )
    await conn.execute(
        "DELETE FROM terms WHERE user_hash = %s AND term = ANY(%s) AND docs <= 0",
        (user_hash, terms),
    )


async def _add_totals(conn: Connection, user_hash: str, passages: int, tokens: int) -> None:
    """The BM25 totals move with the searchable chunks, and so does the generation (a cached
    matrix of the user's vectors is no longer theirs)."""
    await conn.execute(
        "UPDATE users SET passages = passages + %s, tokens = tokens + %s,"
        " generation = nextval('chunk_generations') WHERE user_hash = %s",
        (passages, tokens, user_hash),
    )


async def _insert(
    conn: Connection, user_hash: str, rows: list[Row], counted: list[Counted]
) -> tuple[int, int]:
    """Write pieces with their postings and term counts; their share of the BM25 totals
    (passages, tokens) is returned, as `_unindex` returns it. Ids are given in the pieces' order,
    as SQLite gives rowids: ties in the ranking break the same way."""
    if not rows:
        return 0, 0
    # The vectors go in pgvector's binary form (%b): formatted as text, a flush's 256 took tens
    # of milliseconds of the event loop, and every post waited behind them.
    cur = await conn.execute(
        "INSERT INTO chunks (user_hash, chunk, conversation_id, turn, seq, block, split, ts,"
        " epoch, role, text, ids, digest, recalled, tokens, embedding)"
        " SELECT %s, chunk, conv, turn, seq, block, split, ts, epoch, role, text, ids, digest,"
        " recalled, tokens, embedding FROM unnest(%s::text[], %s::text[], %s::text[],"
        " %s::int[], %s::int[], %s::int[], %s::text[], %s::float8[], %s::text[], %s::text[],"
        " %s::text[], %s::text[], %s::bool[], %s::int[], %b::vector[]) WITH ORDINALITY"
        " AS r (chunk, conv, turn, seq, block, split, ts, epoch, role, text, ids, digest,"
        " recalled, tokens, embedding, n) ORDER BY n RETURNING conversation_id, chunk, id",
        (
            user_hash,
            [r.chunk for r in rows],
            [r.conv for r in rows],
            [r.turn for r in rows],
            [r.seq for r in rows],
            [r.block for r in rows],
            [r.split for r in rows],
            [r.ts for r in rows],
            [r.epoch for r in rows],
            [r.role for r in rows],
            [r.text for r in rows],
            [r.ids for r in rows],
            [r.digest for r in rows],
            [r.recalled for r in rows],
            [0 if r.recalled else c.tokens for r, c in zip(rows, counted, strict=True)],
            [r.vec for r in rows],
        ),
    )
    ids = {(conv, chunk): chunk_id for conv, chunk, chunk_id in await cur.fetchall()}
    postings: list[tuple[str, int, int, int]] = []
    delta: Counter[str] = Counter()
    passages = tokens = 0
    for row, terms in zip(rows, counted, strict=True):
        if row.recalled:  # a neighbour only: no postings, not in BM25's totals
            continue
        chunk_id = ids[row.conv, row.chunk]
        postings += [(term, chunk_id, tf[0], tf[1]) for term, tf in terms.tf.items()]
        delta.update(terms.tf.keys())
        passages += 1
        tokens += terms.tokens
    if postings:
        term, chunk_id, tf_text, tf_ids = (list(column) for column in zip(*postings, strict=True))
        await conn.execute(
            "INSERT INTO postings (user_hash, term, chunk_id, tf_text, tf_ids)"
            " SELECT %s, * FROM unnest(%s::text[], %s::bigint[], %s::int[], %s::int[])",
            (user_hash, term, chunk_id, tf_text, tf_ids),
        )
    await _add_terms(conn, user_hash, dict(delta))
    return passages, tokens


# --- index runs -------------------------------------------------------------------------------


class LeaseLost(Exception):
    """The user's lease is no longer this runner's (it ran out and another replica claimed the
    user, or it was cleared): the run stops and writes nothing more."""


class RunStopped(Exception):
    """The run passed its timeout, or its renewal found the lease lost: it stops between
    flushes (what was flushed is consistent)."""


@dataclass
class _Moved:
    """What a flush moves in the users row at its end: the BM25 totals, and whether the user's
    chunks changed (a new generation: a replica's cached matrix of them is stale)."""

    passages: int = 0
    tokens: int = 0
    chunks: bool = False

    def add(self, totals: tuple[int, int]) -> None:
        self.passages += totals[0]
        self.tokens += totals[1]


@dataclass
class _Work:
    """What one conversation needs: the version it was read at, rows to drop and to write."""

    conv: str
    version: int
    drop: list[int]
    write: list[Row]
    counted: list[Counted] = field(default_factory=list)  # the terms of each row of write


class IndexRunner:
    """Claims due users (on any replica, each user by one runner at a time) and indexes them,
    ``concurrency`` users at once."""

    def __init__(
        self,
        db: Database,
        embedder: Embedder,
        *,
        debounce: float,
        concurrency: int,
        lease_seconds: float = 30.0,
        poll_seconds: float = 0.5,
        timeout: float,
        workers: IndexWorkers | None = None,
    ) -> None:
        self.db = db
        self.embedder = embedder  # names the vectors (the fingerprint); embeds without workers
        self.workers = workers
        self.debounce = debounce
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.timeout = timeout
        # Names this runner in users.lease_owner (a hostname and pid: no user data).
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.wanted = fingerprint(embedder)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="recall-pg-index")
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._runs: dict[str, asyncio.Task[None]] = {}  # user hash -> its run (strong refs)
        self._chores: set[asyncio.Task[None]] = set()  # repairs in flight

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        """Stop claiming and cancel the runs; their leases run out (another replica, or this
        one restarted, finishes them)."""
        tasks = [t for t in (self._loop_task, *self._runs.values(), *self._chores) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.workers is not None:
            await self.workers.close()
        self._pool.shutdown(wait=True)

    @property
    def running(self) -> int:
        """Index runs going on in this runner now."""
        return len(self._runs)

    def wake(self) -> None:
        """Look for due users now (a post on this replica), not at the next poll."""
        self._wake.set()

    def repair(self, user_hash: str) -> None:
        """A recall found no index it could read: make the user's run due now (no wait). The
        run rebuilds what the conversations need: everything when the chunks were built by
        another model or layout, else what is missing. Not while a run is going on: it covers
        it, and recalls asking meanwhile must not restart it over and over."""
        task = asyncio.create_task(self._repair(user_hash))
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _repair(self, user_hash: str) -> None:
        try:
            async with self.db.user(user_hash) as conn:
                await conn.execute(
                    "UPDATE users SET due_at = least(due_at, now()) WHERE user_hash = %s"
                    " AND (lease_until IS NULL OR lease_until < now())",
                    (user_hash,),
                )
        except (StoreUnavailable, psycopg.Error) as exc:
            log.warning("repair of user %s not queued: %s", user_hash, _describe(exc))
            return
        self.wake()

    # -- claiming ---------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            free = self.concurrency - len(self._runs)
            if free > 0:
                for user_hash in await self._claim(free):
                    task = asyncio.create_task(self._run(user_hash))
                    self._runs[user_hash] = task
                    task.add_done_callback(self._finished(user_hash))
            # asyncio.timeout, not wait_for: 3.11's wait_for can lose a cancellation that meets
            # the event being set (close() then waited for this loop for ever).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_seconds):
                    await self._wake.wait()

    def _finished(self, user_hash: str) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            self._runs.pop(user_hash, None)
            self._wake.set()  # a slot is free

        return done

    async def _claim(self, n: int) -> list[str]:
        try:
            async with self.db.system() as conn:
                cur = await conn.execute(
                    "SELECT recall_claim(%s, %s, %s, %s)",
                    (self.owner, self.lease_seconds, self.debounce, n),
                )
                return [user_hash for (user_hash,) in await cur.fetchall()]
        except StoreUnavailable:
            return []  # the database is down: the next poll tries again
        except psycopg.Error as exc:
            log.warning("index claim failed: %s", type(exc).__name__)
            return []

    # -- one run ----------------------------------------------------------------------------

    async def _run(self, user_hash: str) -> None:
        lost = asyncio.Event()
        renewal = asyncio.create_task(self._renew(user_hash, lost))
        started = time.monotonic()
        try:
            changes = await self._index(user_hash, lambda: self._check(started, lost))
        except LeaseLost:
            log.warning("index run of user %s stopped: its lease was lost", user_hash)
            return
        except asyncio.CancelledError:
            raise  # stopped (shutdown): the lease runs out, another run finishes
        except Exception as exc:  # logged; due again after RETRY_SECONDS
            log.warning("index run of user %s failed: %s", user_hash, _describe(exc))
            changes = None
        finally:
            renewal.cancel()
            release_freed_memory()
        try:
            await self._end(user_hash, changes)
        except (StoreUnavailable, psycopg.Error) as exc:
            log.warning("index run of user %s not recorded: %s", user_hash, _describe(exc))
        else:
            log.debug("index run of user %s in %.2fs", user_hash, time.monotonic() - started)

    def _check(self, started: float, lost: asyncio.Event) -> None:
        if lost.is_set():
            raise LeaseLost
        if time.monotonic() - started > self.timeout:
            raise RunStopped(f"index run timed out after {self.timeout:g}s")

    async def _renew(self, user_hash: str, lost: asyncio.Event) -> None:
        """Keep the lease while the run goes on (a third of it between renewals)."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                async with self.db.user(user_hash) as conn:
                    if not await self._extend_lease(conn, user_hash):
                        lost.set()
                        return
            except (StoreUnavailable, psycopg.Error):
                continue  # the flushes check the lease themselves

    @asynccontextmanager
    async def _locked(self, user_hash: str) -> AsyncIterator[tuple[Connection, _Moved]]:
        """One flush transaction: the user's index lock first (forgets, erases and other
        flushes of the user wait; posts go on, see `index_lock`), the block's writes, then last
        the users row: the lease checked to be ours and renewed, and what the block `_Moved`
        (the BM25 totals, a new generation) in one statement just before the commit. A lease
        found lost there rolls the block's writes back."""
        async with self.db.user(user_hash) as conn:
            await conn.execute(index_lock(user_hash))
            moved = _Moved()
            yield conn, moved
            if not await self._extend_lease(conn, user_hash, moved):
                raise LeaseLost

    async def _extend_lease(
        self, conn: Connection, user_hash: str, moved: _Moved | None = None
    ) -> bool:
        """The lease renewed for another ``lease_seconds``, if it is still this runner's, and
        what a flush ``moved`` moved with it."""
        moved = moved or _Moved()
        cur = await conn.execute(
            "UPDATE users SET lease_until = now() + make_interval(secs => %s),"
            " passages = passages + %s, tokens = tokens + %s, generation = CASE WHEN %s"
            " THEN nextval('chunk_generations') ELSE generation END"
            " WHERE user_hash = %s AND lease_owner = %s RETURNING 1",
            (self.lease_seconds, moved.passages, moved.tokens, moved.chunks, user_hash,
             self.owner),
        )  # fmt: skip
        return await cur.fetchone() is not None

    async def _index(self, user_hash: str, check: Callable[[], None]) -> int:
        """Bring the user's index up to date; the `changes` it covers (read at its start)."""
        async with self.db.user(user_hash, read_only=True, repeatable=True) as conn:
            cur = await conn.execute(
                "SELECT changes, built_by FROM users WHERE user_hash = %s", (user_hash,)
            )
            changes, built = await cur.fetchone() or (0, self.wanted)
            cur = await conn.execute(
                "SELECT conversation_id, version FROM conversations WHERE user_hash = %s",
                (user_hash,),
            )
            versions: dict[str, int] = dict(await cur.fetchall())
            cur = await conn.execute(
                "SELECT conversation_id, version FROM indexed WHERE user_hash = %s", (user_hash,)
            )
            indexed: dict[str, int] = dict(await cur.fetchall())
        if built != self.wanted:  # another model or piece layout (or a repair): start over
            async with self._locked(user_hash) as (conn, _):
                await drop_user_index(conn, user_hash)
                await conn.execute(
                    "UPDATE users SET built_by = %s WHERE user_hash = %s", (self.wanted, user_hash)
                )
            indexed = {}
        if gone := sorted(indexed.keys() - versions.keys()):
            async with self._locked(user_hash) as (conn, _):
                for conv in gone:
                    await drop_conversation(conn, user_hash, conv)
        # In the embedded engine's order (its source files, sorted): rows get ids in the same
        # order as its rowids.
        changed = sorted(
            (conv for conv, version in versions.items() if indexed.get(conv) != version),
            key=lambda conv: conv + SOURCE_SUFFIX,
        )
        pending: list[_Work] = []
        to_embed = 0
        for start in range(0, len(changed), PLAN_READS):
            for work in await self._plan(user_hash, changed[start : start + PLAN_READS]):
                pending.append(work)
                to_embed += sum(1 for row in work.write if row.vec is None)
                if batch_full(len(pending), to_embed):
                    check()
                    await self._flush(user_hash, pending)
                    pending, to_embed = [], 0
        if pending:
            check()
            await self._flush(user_hash, pending)
        return int(changes)

    async def _plan(self, user_hash: str, convs: list[str]) -> list[_Work]:
        """What these conversations need, in their order, read in one snapshot; one that is
        gone (forgotten since the run began) or whose stored body cannot be read as pieces is
        left out."""
        async with self.db.user(user_hash, read_only=True, repeatable=True) as conn:
            cur = await conn.execute(
                "SELECT conversation_id, version, body FROM conversations"
                " WHERE user_hash = %s AND conversation_id = ANY(%s)",
                (user_hash, convs),
            )
            found = {conv: (version, body) for conv, version, body in await cur.fetchall()}
            cur = await conn.execute(
                "SELECT conversation_id, chunk, id, seq, ts, role, text, recalled, digest,"
                " embedding FROM chunks WHERE user_hash = %s AND conversation_id = ANY(%s)",
                (user_hash, list(found)),
                binary=True,  # vectors in pgvector's binary form: none parsed from text
            )
            chunks = await cur.fetchall()
        # Parsing bodies and comparing pieces is CPU work: off the event loop, as stemming is.
        return await run_in(self._pool, _works, user_hash, convs, found, chunks)

    async def _embed(self, rows: list[Row]) -> None:
        """Give the rows that have no vector yet theirs: in the workers, else on a pool thread."""
        if self.workers is None:
            await run_in(self._pool, embed_missing, rows, self.embedder, np.asarray)
            return
        todo = [row for row in rows if row.vec is None]
        vectors = await self.workers.embed([row.embed_text for row in todo], self.timeout)
        for row, vec in zip(todo, vectors, strict=True):
            row.vec = vec

    @staticmethod
    def _count(pending: list[_Work]) -> None:
        """On a pool thread: count each new row's terms."""
        rows = [row for work in pending for row in work.write]
        counted = iter(count_terms([(row.text, row.ids) for row in rows]))
        for work in pending:
            work.counted = [next(counted) for _ in work.write]

    async def _flush(self, user_hash: str, pending: list[_Work]) -> None:
        """Write the pending conversations in one transaction; those forgotten or rewritten
        since they were read are left for the next run (their post bumped `changes`)."""
        await self._embed([row for work in pending for row in work.write])
        await run_in(self._pool, self._count, pending)
        async with self._locked(user_hash) as (conn, moved):
            cur = await conn.execute(
                "SELECT conversation_id, version FROM conversations"
                " WHERE user_hash = %s AND conversation_id = ANY(%s)",
                (user_hash, [work.conv for work in pending]),
            )
            current = dict(await cur.fetchall())
            kept = [work for work in pending if current.get(work.conv) == work.version]
            if drop := [chunk_id for work in kept for chunk_id in work.drop]:
                cur = await conn.execute(
                    "DELETE FROM chunks WHERE user_hash = %s AND id = ANY(%s)"
                    " RETURNING id, recalled, tokens",
                    (user_hash, drop),
                )
                moved.add(await _unindex(conn, user_hash, await cur.fetchall()))
            write = [row for work in kept for row in work.write]
            moved.add(await _insert(conn, user_hash, write, [t for w in kept for t in w.counted]))
            moved.chunks = bool(drop or write)
            if kept:
                await conn.execute(
                    "INSERT INTO indexed (user_hash, conversation_id, version)"
                    " SELECT %s, * FROM unnest(%s::text[], %s::bigint[])"
                    " ON CONFLICT (user_hash, conversation_id)"
                    " DO UPDATE SET version = excluded.version",
                    (user_hash, [w.conv for w in kept], [w.version for w in kept]),
                )

    async def _end(self, user_hash: str, changes: int | None) -> None:
        """The run's end, when the lease is still ours: what it covered, and whether another
        run is due (writes came meanwhile, or it failed: ``changes`` None)."""
        async with self.db.user(user_hash) as conn:
            if changes is None:
                await conn.execute(
                    "UPDATE users SET lease_owner = NULL, lease_until = NULL,"
                    " due_at = now() + make_interval(secs => %s)"
                    " WHERE user_hash = %s AND lease_owner = %s",
                    (max(self.debounce, RETRY_SECONDS), user_hash, self.owner),
                )
                return
            await conn.execute(
                "UPDATE users SET indexed_changes = %s, lease_owner = NULL, lease_until = NULL,"
                " due_at = CASE WHEN changes > %s THEN now() + make_interval(secs => %s) END"
                " WHERE user_hash = %s AND lease_owner = %s",
                (changes, changes, self.debounce, user_hash, self.owner),
            )


def _works(
    user_hash: str,
    convs: list[str],
    found: dict[str, tuple[int, str]],
    chunks: list[tuple[Any, ...]],
) -> list[_Work]:
    """What each conversation of ``convs`` needs (in their order), from its stored body and the
    chunks it has; one not found, or whose body cannot be read as pieces, is left out."""
    have: dict[str, dict[str, Stored]] = {}
    for conv, chunk, chunk_id, seq, ts, role, text, recalled, digest, vec in chunks:
        have.setdefault(conv, {})[chunk] = Stored(
            chunk_id, seq, ts, role, text, recalled, digest, vec.to_numpy()
        )
    works = []
    for conv in convs:
        if conv not in found:
            continue
        version, body = found[conv]
        try:
            # Read as the embedded engine reads a source file (read_source): a bad line fails it.
            lines = [json.loads(line) for line in body.split("\n") if line.strip()]
            wanted = rows_of(conv, lines)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # The conversation id is no user text; the exception may hold some.
            log.warning("user %s: skipping unreadable conversation %s (%s)", user_hash, conv,
                        type(exc).__name__)  # fmt: skip
            continue
        drop, write = changed_rows(wanted, have.get(conv, {}))
        works.append(_Work(conv, version, drop, write))
    return works


def _describe(exc: BaseException) -> str:
    """An exception for the log: its type, and its message only where it holds no user data
    (ours, and the database's own, which name no values)."""
    if isinstance(exc, RunStopped | StoreUnavailable):
        return str(exc)
    return type(exc).__name__
