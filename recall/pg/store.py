"""PgStore: the truth of every user in one PostgreSQL (STORE=postgres), for any number of replicas.

The same rules as the files store, decided by the same pure functions of recall/domain/
(forgetting.admitted for the tombstones, conversation.stored_holds for a stale re-post), each
under locks that hold across replicas. Every query filters by the user hash, in a transaction
that set it for the row-level security policies (recall/pg/database.py). The locks, always
taken in this order:

- the user's index lock (recall.pg.index.index_lock), taken by forgets, erases and index
  flushes, never by posts: the user's index changes one transaction at a time;
- the user's row: a post takes FOR KEY SHARE (posts of a user run side by side), a forget FOR NO
  KEY UPDATE (one at a time per user; posts still run), an erase FOR UPDATE (it waits for the
  posts in flight, and later posts wait for it, then meet its tombstones). An index flush takes
  it last, by its one UPDATE just before its commit, so posts never wait for a flush's writes;
- a conversation's advisory lock (its writers, on any replica, one at a time). A post takes it
  after the row lock; a forget takes it BEFORE its index and row locks: a post holding the
  conversation's lock ends by bumping the user's counters (an UPDATE, so FOR NO KEY UPDATE of
  the row), and a forget holding that row lock while waiting for the conversation's would
  deadlock with it.

Tombstones are keyed digests (recall.domain.forgetting.turn_digest) under a key in
`server_keys` that every replica shares; each tombstone names its key, so digests imported under
the files store's key still match. Nothing here logs a user id, a text or a key: user hashes only.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from recall.domain.answers import Recalled
from recall.domain.conversation import (
    Conversation,
    conversation_named,
    readable_lines,
    stored_holds,
)
from recall.domain.errors import NotDue, NotFound, StoreUnavailable
from recall.domain.forgetting import (
    EVERYTHING,
    Forgetting,
    admitted,
    expired,
    new_receipt,
    now_utc,
    stamp,
    turn_digest,
)
from recall.pg.database import Database, StartCheck, xact_lock
from recall.pg.index import IndexRunner, drop_conversation, drop_user_index, index_lock
from recall.pg.schema import key_id
from recall.pg.search import PgSearch, Seen
from recall.settings import Settings
from recall.store import (
    AuditLine,
    Located,
    Mark,
    Marked,
    MemoryState,
    Receipt,
    Searched,
    Settled,
    Turn,
    leave_mark,
)

log = logging.getLogger("recall.pg.store")

KEY_LOCK = 0x7265_6361_6B79  # "recaky": making the shared tombstone key, once, on any replica


def conversation_lock(user_hash: str, conversation_id: str) -> sql.Composed:
    """A conversation's advisory lock (held to the transaction's end)."""
    return xact_lock(f"{user_hash}/{conversation_id}")


# Statements of the write path, formatted with sql.Literal values (they run in batches).
TOMBSTONES = "SELECT key_id, digest FROM tombstones WHERE user_hash = {} AND conversation_id = {}"
FORGOTTEN_BEFORE = (
    "SELECT max(at) FROM tombstone_times WHERE user_hash = {} AND conversation_id IN ({}, {})"
)
BODY = "SELECT body FROM conversations WHERE user_hash = {} AND conversation_id = {}"
BODY_BY_ID = "SELECT body FROM conversations WHERE user_hash = %s AND conversation_id = %s"
# A change of the user's memory: an index run is due (after the debounce, from the first change
# no run covers); the forgets counted make recalls in flight read again.
CHANGED = (
    "UPDATE users SET changes = changes + 1, forgets = forgets + {}, "
    "due_at = coalesce(due_at, now() + make_interval(secs => {})) WHERE user_hash = {}"
)


def since(mark: Seen | None, now: Seen) -> Settled:
    """What came since ``mark`` (None: nothing to check), told by the user's counters ``now``:
    an erase, or (a search's mark) a forget."""
    if mark is None:
        return "kept"
    if now.erasures > mark.erasures:
        return "erased"
    return "forgotten" if mark.forgets is not None and now.forgets != mark.forgets else "kept"


def storable(value: Any) -> Any:
    """``value`` as jsonb can hold it: its strings without NUL (jsonb refuses \\u0000), which
    becomes U+FFFD, as a cut character does elsewhere. An audit line quotes a query as asked."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


async def _one(conn: psycopg.AsyncConnection[Any], query: str, params: Any = ()) -> Any:
    """The first row of a query (None when there is none)."""
    return await (await conn.execute(query, params)).fetchone()


async def _all(conn: psycopg.AsyncConnection[Any], query: str, params: Any = ()) -> list[Any]:
    return await (await conn.execute(query, params)).fetchall()


# --- what a forget and an erase remove; `recall-server import` (recall/transfer.py) removes the
# same for what the files store forgot or erased. The caller holds the user's index lock and row. --


async def add_tombstones(
    conn: psycopg.AsyncConnection[Any],
    user: str,
    turns: dict[str, list[Turn]],
    under: tuple[str, bytes],
) -> None:
    """Add the digests of these conversations' turns, under key ``under`` (key_id, key), to the
    user's tombstones."""
    kid, key = under
    pairs = [(cid, turn_digest(key, t)) for cid, ts in turns.items() for t in ts]
    await conn.execute(
        "INSERT INTO tombstones (user_hash, conversation_id, key_id, digest) "
        "SELECT %s, c, %s, d FROM unnest(%s::text[], %s::text[]) AS t(c, d) "
        "ON CONFLICT DO NOTHING",
        (user, kid, [c for c, _ in pairs], [d for _, d in pairs]),
    )


async def remove_conversation(
    conn: psycopg.AsyncConnection[Any], user: str, conversation_id: str
) -> int:
    """What a forget removes: the conversation's row and its index pieces (chunks, postings,
    term counts, `indexed`); the chunks removed."""
    await conn.execute(
        "DELETE FROM conversations WHERE user_hash = %s AND conversation_id = %s",
        (user, conversation_id),
    )
    return await drop_conversation(conn, user, conversation_id)


async def remove_user(conn: psycopg.AsyncConnection[Any], user: str) -> int:
    """What an erase removes: every conversation, the whole index (its BM25 totals reset) and the
    audit, counted as an erasure (a recall that overlapped it appends no audit line). Tombstones
    and receipts stay. The chunks removed."""
    await conn.execute("DELETE FROM conversations WHERE user_hash = %s", (user,))
    index_rows = await drop_user_index(conn, user)
    await conn.execute("DELETE FROM audit WHERE user_hash = %s", (user,))
    await conn.execute("UPDATE users SET erasures = erasures + 1 WHERE user_hash = %s", (user,))
    return index_rows


class PgStore:
    """recall.store.Store over PostgreSQL. ``runner`` and ``search`` (recall/pg/index.py and
    search.py) are the index half; without them the truth half works alone."""

    name = "postgres"
    engine_name = "embedded"  # the embedded ranking, over the database

    def __init__(
        self,
        database: Database,
        debounce: float,
        runner: IndexRunner | None = None,
        search: PgSearch | None = None,
    ) -> None:
        self.database = database
        self.debounce = debounce  # an index run is due this long after the first unindexed write
        self.runner = runner
        self.searcher = search  # recall over the database (recall/pg/search.py)
        self._keys: dict[str, bytes] = {}  # key_id -> key: never change once made
        self._current: tuple[str, bytes] | None = None  # the key new tombstones are made under

    def describe(self) -> str:
        return f"embedded ranking on the postgres store, database {self.database.where}"

    # --- life ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and check the role and schema (Database.start); ConfigError when this server
        must not serve from the database (the pool is then not opened). A database that is down
        does not keep the replica from starting: the check waits for its first connection, and
        nothing is served before it passed."""
        await self.database.start()
        if self.runner is not None:
            await self.runner.start()

    async def refused(self) -> str:
        return await self.database.refusal()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.close()
        if self.searcher is not None:
            await self.searcher.close()
        await self.database.close()

    async def ready(self) -> str | None:
        return await self.database.check()

    async def indexing(self) -> int:
        async with self.database.system() as conn:
            return int((await _one(conn, "SELECT recall_indexing()"))[0])

    async def index_lag(self) -> tuple[int, float]:
        async with self.database.system() as conn:
            users, oldest = await _one(
                conn, "SELECT users, oldest_seconds FROM recall_index_lag(%s)", (self.debounce,)
            )
        return int(users or 0), float(oldest or 0.0)

    # --- the tombstone key --------------------------------------------------------------------

    async def _tombstone_key(self) -> tuple[str, bytes]:
        """The key new digests are made under: the oldest in `server_keys`, made on first need.
        Made under an advisory lock, so replicas starting together agree on one."""
        if self._current is None:
            async with self.database.system() as conn:
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (KEY_LOCK,))
                row = await _one(
                    conn, "SELECT key_id, value FROM server_keys ORDER BY made_at, key_id LIMIT 1"
                )
                if row is None:
                    made = secrets.token_bytes(32)
                    row = (key_id(made), made)
                    await conn.execute(
                        "INSERT INTO server_keys (key_id, value) VALUES (%s, %s) "
                        "ON CONFLICT DO NOTHING",
                        row,
                    )
            self._current = (row[0], bytes(row[1]))
            self._keys[row[0]] = bytes(row[1])
        return self._current

    async def _keys_named(
        self, conn: psycopg.AsyncConnection[Any], key_ids: set[str]
    ) -> dict[str, bytes]:
        missing = [k for k in key_ids if k not in self._keys]
        if missing:
            rows = await _all(
                conn, "SELECT key_id, value FROM server_keys WHERE key_id = ANY(%s)", (missing,)
            )
            self._keys.update((k, bytes(v)) for k, v in rows)
        # A key that is not there (lost) makes digests nothing can match: they are left aside.
        return {k: self._keys[k] for k in key_ids if k in self._keys}

    async def _forgetting(
        self, conn: psycopg.AsyncConnection[Any], tombstones: list[Any], before: Any
    ) -> Forgetting:
        """What a conversation's tombstones (TOMBSTONES' rows) and last forget or erase
        (FORGOTTEN_BEFORE) forget of it."""
        by_key: dict[str, set[str]] = {}
        for kid, digest in tombstones:
            by_key.setdefault(kid, set()).add(digest)
        keys = await self._keys_named(conn, set(by_key)) if by_key else {}
        return Forgetting({keys[k]: frozenset(d) for k, d in by_key.items() if k in keys}, before)

    async def _changed(self, conn: psycopg.AsyncConnection[Any], user: str, forgets: int) -> None:
        """Count a change of the user's memory (see CHANGED)."""
        await conn.execute(
            sql.SQL(CHANGED).format(
                sql.Literal(forgets), sql.Literal(self.debounce), sql.Literal(user)
            )
        )

    # --- the write path -----------------------------------------------------------------------

    async def put(self, user: str, conversation: Conversation) -> bool:
        cid = conversation.conversation_id
        u, c = sql.Literal(user), sql.Literal(cid)
        # The hot path: the transaction's start, the locks and every read the decision needs in
        # one round trip, the writes and the commit in another (Database.user_with).
        async with self.database.user_with(
            user,
            sql.SQL("INSERT INTO users (user_hash) VALUES ({}) ON CONFLICT DO NOTHING").format(u),
            sql.SQL("SELECT 1 FROM users WHERE user_hash = {} FOR KEY SHARE").format(u),
            conversation_lock(user, cid),
            sql.SQL(TOMBSTONES).format(u, c),
            sql.SQL(FORGOTTEN_BEFORE).format(u, c, sql.Literal(EVERYTHING)),
            sql.SQL(BODY).format(u, c),
        ) as (conn, (*_, tombstones, ((before,),), stored)):
            # Forgotten (nothing may be stored) rolls the transaction back: nothing written.
            forgetting = await self._forgetting(conn, tombstones, before)
            conversation = admitted(conversation, forgetting)
            data = conversation.to_jsonl()
            if stored and stored_holds(
                stored[0][0].encode("utf-8"), data.encode("utf-8"), conversation.lines
            ):
                return False  # already stored (committed), or a stale snapshot of it
            stamps = [line["ts"] for line in conversation.lines]  # ...Z: they sort as times
            await self.database.commit_with(
                conn,
                sql.SQL(
                    "INSERT INTO conversations "
                    "(user_hash, conversation_id, body, version, first_ts, last_ts, turns) "
                    "VALUES ({}, {}, {}, nextval('conversation_versions'), {}, {}, {}) "
                    "ON CONFLICT (user_hash, conversation_id) DO UPDATE SET body = excluded.body, "
                    "version = excluded.version, first_ts = excluded.first_ts, "
                    "last_ts = excluded.last_ts, turns = excluded.turns"
                ).format(u, c, *map(sql.Literal, (data, min(stamps), max(stamps), len(stamps)))),
                sql.SQL(CHANGED).format(sql.Literal(0), sql.Literal(self.debounce), u),
            )
        return True

    # --- what the memory page reads -----------------------------------------------------------

    async def conversation_ids(self, user: str) -> list[str]:
        async with self.database.user(user, read_only=True) as conn:
            rows = await _all(
                conn,
                "SELECT conversation_id FROM conversations WHERE user_hash = %s "
                'ORDER BY conversation_id COLLATE "C"',
                (user,),
            )
        return [cid for (cid,) in rows]

    async def conversations(self, user: str) -> dict[str, list[Turn]]:
        async with self.database.user(user, read_only=True) as conn:
            rows = await _all(
                conn,
                "SELECT conversation_id, body FROM conversations WHERE user_hash = %s",
                (user,),
            )
        return {cid: readable_lines(body.encode("utf-8")) for cid, body in rows}

    async def turns(self, user: str, conversation_id: str) -> list[Turn] | None:
        async with self.database.user(user, read_only=True) as conn:
            row = await _one(conn, BODY_BY_ID, (user, conversation_id))
        return None if row is None else readable_lines(row[0].encode("utf-8"))

    # --- the lifecycle ------------------------------------------------------------------------

    async def forget(
        self,
        user: str,
        conversation_id: str,
        reason: str,
        only_if: Callable[[list[Turn]], bool] | None = None,
    ) -> Receipt:
        at = now_utc()
        key = await self._tombstone_key()  # before: never a second connection while one is held
        async with self.database.user(user) as conn:
            await conn.execute(conversation_lock(user, conversation_id))  # first: see the top
            await conn.execute(index_lock(user))
            if (
                await _one(
                    conn, "SELECT 1 FROM users WHERE user_hash = %s FOR NO KEY UPDATE", (user,)
                )
                is None
            ):
                raise NotFound  # nothing of the user was ever stored
            row = await _one(
                conn,
                "SELECT body FROM conversations WHERE user_hash = %s AND conversation_id = %s",
                (user, conversation_id),
            )
            if row is None:
                if not await self._tombstoned(conn, user, conversation_id):
                    raise NotFound
                if (earlier := await self._last_forget(conn, user, conversation_id)) is not None:
                    return earlier
                turns: list[Turn] = []  # erased, never forgotten alone: its own receipt now
            else:
                turns = readable_lines(row[0].encode("utf-8"))
                if only_if is not None and not only_if(turns):
                    raise NotDue  # rolled back: nothing removed, no receipt
            await add_tombstones(conn, user, {conversation_id: turns}, key)
            rows = await remove_conversation(conn, user, conversation_id)
            await self._changed(conn, user, forgets=1)
            receipt = new_receipt(
                user,
                "forget",
                at,
                reason=reason,
                conversation_id=conversation_id,
                removed={"conversations": 1, "turns": len(turns), "index_rows": rows},
            )
            await self._add_receipt(conn, user, receipt)
        log.info("user %s: forgot a conversation (%s)", user, reason)
        return receipt

    async def _tombstoned(
        self, conn: psycopg.AsyncConnection[Any], user: str, conversation_id: str
    ) -> bool:
        row = await _one(
            conn,
            "SELECT EXISTS (SELECT 1 FROM tombstones WHERE user_hash = %s AND conversation_id = %s)"
            " OR EXISTS (SELECT 1 FROM tombstone_times WHERE user_hash = %s "
            "AND conversation_id IN (%s, %s))",
            (user, conversation_id, user, conversation_id, EVERYTHING),
        )
        return bool(row[0])

    async def _last_forget(
        self, conn: psycopg.AsyncConnection[Any], user: str, conversation_id: str
    ) -> Receipt | None:
        row = await _one(
            conn,
            "SELECT receipt FROM receipts WHERE user_hash = %s AND receipt->>'operation' = "
            "'forget' AND receipt->>'conversation_id' = %s ORDER BY seq DESC LIMIT 1",
            (user, conversation_id),
        )
        return None if row is None else row[0]

    async def _add_receipt(
        self, conn: psycopg.AsyncConnection[Any], user: str, receipt: Receipt
    ) -> None:
        await conn.execute(
            "INSERT INTO receipts (user_hash, receipt) VALUES (%s, %s)", (user, Jsonb(receipt))
        )

    async def erase(self, user: str) -> Receipt:
        at = now_utc()
        key = await self._tombstone_key()
        async with self.database.user(user) as conn:
            await conn.execute(index_lock(user))  # before the row: see the top
            await conn.execute(
                "INSERT INTO users (user_hash) VALUES (%s) ON CONFLICT DO NOTHING", (user,)
            )
            # FOR UPDATE: waits for the posts in flight (FOR KEY SHARE); later ones wait for it.
            await conn.execute("SELECT 1 FROM users WHERE user_hash = %s FOR UPDATE", (user,))
            rows = await _all(
                conn,
                "SELECT conversation_id, body FROM conversations WHERE user_hash = %s",
                (user,),
            )
            erased = {cid: readable_lines(body.encode("utf-8")) for cid, body in rows}
            await add_tombstones(conn, user, erased, key)
            index_rows = await remove_user(conn, user)
            await self._changed(conn, user, forgets=1)
            removed = {"conversations": len(erased), "turns": sum(map(len, erased.values()))}
            receipt = new_receipt(user, "erase", at, removed={**removed, "index_rows": index_rows})
            await self._add_receipt(conn, user, receipt)  # receipts outlive the erase
        log.info("user %s: erased", user)
        return receipt

    async def receipts(self, user: str) -> list[Receipt]:
        async with self.database.user(user, read_only=True) as conn:
            rows = await _all(
                conn, "SELECT receipt FROM receipts WHERE user_hash = %s ORDER BY seq", (user,)
            )
        return [receipt for (receipt,) in rows]

    async def sweep(self, retention_days: float) -> int:
        cutoff = now_utc() - timedelta(days=retention_days)
        still_expired = functools.partial(expired, cutoff=cutoff)  # a post may resume it
        async with self.database.system() as conn:
            due = await _all(
                conn, "SELECT user_hash, conversation_id FROM recall_expired(%s)", (cutoff,)
            )
        forgotten = 0
        for user, conversation_id in due:
            with suppress(NotFound, NotDue):  # forgotten, or resumed, meanwhile
                await self.forget(user, conversation_id, "retention", still_expired)
                forgotten += 1
        # The recall audit is the user's data too: its old lines go with the same retention.
        async with self.database.system() as conn:
            users = [u for (u,) in await _all(conn, "SELECT * FROM recall_users()")]
        for user in users:
            async with self.database.user(user) as conn:
                await conn.execute(
                    'DELETE FROM audit WHERE user_hash = %s AND at < %s COLLATE "C"',
                    (user, stamp(cutoff)),
                )
        return forgotten

    # --- the audit, and recalls that overlap an erasure ---------------------------------------

    async def mark(self, user: str) -> Mark:
        return Seen(await self._erasures(user), None)

    async def erased_since(self, user: str, mark: Mark) -> bool:
        return await self._erasures(user) > mark.erasures

    async def _erasures(self, user: str) -> int:
        async with self.database.user(user, read_only=True) as conn:
            row = await _one(conn, "SELECT erasures FROM users WHERE user_hash = %s", (user,))
        return 0 if row is None else int(row[0])

    async def append_audit(self, user: str, line: AuditLine, mark: Mark) -> None:
        await self.settle(user, Seen(mark.erasures, None), line)

    async def settle(self, user: str, mark: Mark, line: AuditLine | None) -> Settled:
        """One transaction: the user's counters now against ``mark`` (a Seen), and the audit
        line when nothing came since. With a line, FOR KEY SHARE: an erase (FOR UPDATE) in
        flight is waited for, then seen. The check made, a line that cannot be written (the
        insert or the commit failed) is "unaudited": the answer may still go out."""
        settled: Settled | None = None
        lock = "" if line is None else " FOR KEY SHARE"
        try:
            async with self.database.user(user, read_only=line is None) as conn:
                row = await _one(
                    conn, f"SELECT erasures, forgets FROM users WHERE user_hash = %s{lock}", (user,)
                )
                settled = since(mark, Seen(*row) if row else Seen(0, 0))
                if settled == "kept" and line is not None and row is not None:
                    await conn.execute(
                        "INSERT INTO audit (user_hash, at, line) VALUES (%s, %s, %s)",
                        (user, str(line.get("at", "")), Jsonb(storable(line))),
                    )
        except (StoreUnavailable, psycopg.Error):
            if settled != "kept":
                raise
            return "unaudited"
        return settled

    async def audit(self, user: str, since: str | None = None) -> list[AuditLine]:
        async with self.database.user(user, read_only=True) as conn:
            rows = await _all(
                conn,
                "SELECT line FROM audit WHERE user_hash = %s "
                'AND (%s::text IS NULL OR at >= %s COLLATE "C") ORDER BY seq',
                (user, since, since),
            )
        return [line for (line,) in rows]

    async def audit_page(
        self, user: str, limit: int, before: int | None = None
    ) -> tuple[list[AuditLine], int | None]:
        async with self.database.user(user, read_only=True) as conn:
            rows = await _all(
                conn,
                "SELECT seq, line FROM audit WHERE user_hash = %s "
                "AND (%s::bigint IS NULL OR seq < %s) ORDER BY seq DESC LIMIT %s",
                (user, before, before, limit + 1),  # one more: is there a next page
            )
        page = rows[:limit]
        more = page[-1][0] if len(rows) > limit and page else None
        return [line for _, line in page], more

    # --- search -------------------------------------------------------------------------------

    def _searcher(self) -> PgSearch:
        if self.searcher is None:
            raise RuntimeError("PgStore: no search configured")
        return self.searcher

    async def state(self, user: str) -> MemoryState:
        return await self._searcher().state(user)

    async def recall(self, user: str, query: str) -> Recalled:
        return await self._searcher().recall(user, query)

    async def search(self, user: str, query: str, marked: Marked | None = None) -> Searched:
        return await self._searcher().search(user, query, marked)

    async def locate(self, user: str, ref: str, marked: Marked | None = None) -> Located:
        """The lookup in one snapshot: the erasures, the user's conversation ids, the one named."""
        async with self.database.user(user, read_only=True, repeatable=True) as conn:
            row = await _one(conn, "SELECT erasures FROM users WHERE user_hash = %s", (user,))
            mark = Seen(0 if row is None else int(row[0]), None)
            leave_mark(marked, mark)
            ids = await _all(
                conn, "SELECT conversation_id FROM conversations WHERE user_hash = %s", (user,)
            )
            named = conversation_named(user, ref, (cid for (cid,) in ids))
            body = None if named is None else await _one(conn, BODY_BY_ID, (user, named))
        if named is None or body is None:
            return Located(None, mark)
        return Located((named, readable_lines(body[0].encode("utf-8"))), mark)

    @property
    def cached_bytes(self) -> int:
        """The replica's cached vector matrices (GET /metrics' vector_cache_bytes)."""
        return 0 if self.searcher is None else self.searcher.cache.cached_bytes

    def repair(self, user: str) -> None:
        if self.runner is not None:
            self.runner.repair(user)


def from_settings(settings: Settings, checked: StartCheck | None = None) -> PgStore:
    """The PostgreSQL store a replica serves from (STORE=postgres): the pool, the embedded
    ranking over the database, and the index runs it claims. ConfigError when the model cannot
    be loaded. ``checked``: the start's check of the database, made already (check_at_start)."""
    from recall.embedder import QUERY_THREADS
    from recall.indexing.configured import configured_embedder, configured_reranker, index_workers

    assert settings.database_url is not None  # Settings.problems() requires it
    # This process embeds queries only (on few threads, as the embedded engine); index runs
    # embed in worker processes of their own, as the files store's do.
    queries = configured_embedder(settings, QUERY_THREADS)
    workers = index_workers(settings)
    database = Database(settings.database_url, settings.database_pool, checked=checked)
    runner = IndexRunner(
        database,
        queries,
        debounce=settings.index_debounce,
        concurrency=settings.index_concurrency,
        lease_seconds=settings.index_lease,
        timeout=settings.index_timeout,
        workers=workers,
    )
    search = PgSearch(
        database,
        queries,
        k=settings.recall_k,
        candidates=settings.recall_candidates,
        max_chars=settings.max_result_chars,
        half_life_days=settings.recall_half_life_days,
        min_similarity=settings.min_similarity(),
        recall_concurrency=settings.recall_concurrency,
        cache_bytes=settings.vector_cache_mb * 2**20,
        reranker=configured_reranker(settings),
    )
    return PgStore(database, settings.index_debounce, runner, search)
