"""The connection pool, one transaction per unit of work, and what a database fault becomes.

Every user's work runs in a transaction that first did `set_config('recall.user_hash', ...,
true)` (SET LOCAL): row-level security then shows and accepts that user's rows only, on top of
each query's own `WHERE user_hash = %s`. The pool is bounded, opens while the database is down
(a replica starts anyway, /readyz says "database"), and reconnects by itself when it returns.
A fault of the connection (refused, cut, the server shutting down or out of connections, a pool
wait that ran out) is `StoreUnavailable`: the routes answer 503, the tool fails soft. Anything
else (a serialization failure, a deadlock, NOWAIT's or a timeout's refusal, a constraint) is not
the database being away and passes as psycopg raised it.

Nothing is served from the database before its role and schema passed the check (`verify`) on a
connection: at start when it answers (`start`), else on the first connection that succeeds later,
whichever use draws it (a request, /readyz, an index claim). Until then every use waits for that
check; once it failed, every use is refused (`DatabaseRefused`) and `refusal()` says why.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from pgvector.psycopg import register_vector_async
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from recall.domain.errors import StoreUnavailable
from recall.pg.schema import USER_SETTING, check_schema
from recall.settings import URL_UNREADABLE, ConfigError

log = logging.getLogger("recall.pg.database")

UNREACHABLE = "database unreachable"
REFUSED = "database refused: this server does not serve from it (see the log)"
WAIT_SECONDS = 5.0  # a request waits this long for a connection, then 503
CHECK_SECONDS = 2.0  # /readyz answers sooner than a request gives up
CONNECT_SECONDS = 5  # one connection attempt (a host that drops packets never refuses)
# A lost connection is retried with backoff (1 s, then 2 s ...) for this long; past it the pool
# stops retrying on its own and each request starts a fresh attempt at once, so the first
# request after an outage of any length finds the database (no backoff grown meanwhile).
RECONNECT_SECONDS = 4.0
# A connection back from work this recently is handed out again without a ping: a round trip
# saved on every unit of work under load. One cut within that window (a fast restart) fails at
# its BEGIN, before any work, and is replaced there (Database._begin).
FRESH_SECONDS = 1.0

Connection = psycopg.AsyncConnection[Any]
Verify = Callable[[Connection], Awaitable[None]]  # ConfigError when not to serve from it

# What the server says when it refuses a connection for a reason no retry mends: a wrong password
# or role, no such database, no way in for this role (SQLSTATE 28000, 28P01, 3D000, 42501). libpq
# gives no SQLSTATE for a failed connection, only the server's FATAL line (or its own line when
# the server asked for a password and the URL has none). Anything else is an outage.
MISCONFIGURED = re.compile(
    r"FATAL:\s+(?P<fatal>(?:\w+ )?authentication failed.*|database .* does not exist|"
    r"role .* does not exist|no pg_hba\.conf entry.*|role .* is not permitted to log in|"
    r"permission denied for database.*)|(?P<libpq>fe_sendauth: no password supplied)"
)


class DatabaseRefused(StoreUnavailable):
    """The database answered, and this server must not serve from it (its role or schema
    failed the check): every use is refused, as when it is away (503, the tool fails soft)."""


@dataclass(frozen=True)
class StartCheck:
    """What a replica's one check at start found (``check_at_start``, before the server loads
    its model): why the database refuses this server for good (``refused``, the line the server
    exits with), or why it did not answer (``outage``), or neither: its role and schema passed."""

    refused: str | None = None
    outage: str | None = None


class Database:
    def __init__(
        self,
        url: str,
        size: int,
        verify: Verify | None = check_schema,
        checked: StartCheck | None = None,
    ) -> None:
        """``verify``: run on a connection before anything else is (None: nothing to check).
        ``checked``: what this start's check already found (``start`` then connects no more)."""
        self.where = _where(url)
        self._url = url
        self._verify = verify
        self._verified = verify is None
        self._checked_at_start = checked
        self._verifying = asyncio.Lock()
        self._refused = asyncio.Event()
        self.refused: str | None = None  # why, once the check failed
        self._pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=size,
            open=False,
            timeout=WAIT_SECONDS,
            reconnect_timeout=RECONNECT_SECONDS,
            # autocommit: every unit of work opens its own transaction (conn.transaction()),
            # so none is left open between them
            kwargs={"autocommit": True, "connect_timeout": CONNECT_SECONDS},
            configure=_configure,
            # a connection cut while idle (the database restarted) is found at checkout and
            # replaced, rather than failing the request that drew it
            check=self._check,
            name="recall",
        )
        self._returned: weakref.WeakKeyDictionary[Connection, float] = weakref.WeakKeyDictionary()
        self._committed: weakref.WeakSet[Connection] = weakref.WeakSet()  # by commit_with

    async def open(self) -> None:
        """Start the pool without waiting for a connection: the server starts while the
        database is down, and requests succeed once it is up."""
        await self._pool.open(wait=False)

    async def start(self) -> None:
        """A replica's start: one connection of its own first (``first_check``), unless the
        start's check was made already (``checked``: a host that drops packets is waited for
        once, not twice). When the database does not answer (an outage), the pool opens all the
        same and the check waits for the first connection that succeeds."""
        checked = self._checked_at_start
        if checked is None:
            outage = await self.first_check()
        elif checked.refused is not None:  # main() exits before; a caller that did not
            raise ConfigError(checked.refused)
        else:
            outage = checked.outage
            self._verified = self._verified or outage is None  # the check passed on its connection
        if outage is not None:
            log.warning(
                "database unreachable at start (%s): requests answer 503 and /readyz "
                '"database" until it answers; its role and schema are checked then',
                outage,
            )
        await self.open()

    async def first_check(self) -> str | None:
        """One connection of its own and the role and schema check on it. ConfigError, in one
        line, when the database answers and refuses us for good (authentication, no such
        database: a misconfiguration) or the check refuses it: the pool is then never opened.
        The outage's first line when it does not answer; None when the check passed."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._url, autocommit=True, connect_timeout=CONNECT_SECONDS
            )
        except psycopg.ProgrammingError:  # libpq's parse errors quote the URL: never shown
            raise ConfigError(URL_UNREADABLE) from None
        except psycopg.OperationalError as exc:
            if (reason := misconfigured(exc)) is not None:
                raise ConfigError(
                    f"DATABASE_URL: the database refused the connection: {reason}; check the "
                    "role, its password and the database name"
                ) from exc
            return _first_line(exc)
        async with conn:
            try:
                await self._checked(conn)
            except DatabaseRefused:
                raise ConfigError(self.refused) from None
        return None

    async def refusal(self) -> str:
        """Waits until the check refused the database (never, while it has not); why."""
        await self._refused.wait()
        assert self.refused is not None
        return self.refused

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def user(
        self, user_hash: str, *, read_only: bool = False, repeatable: bool = False
    ) -> AsyncIterator[Connection]:
        """One transaction for one user's work: committed when the block ends, rolled back when
        it raises. ``repeatable``: one snapshot for all its queries (REPEATABLE READ);
        ``read_only``: no writes."""
        async with self._transaction(_opening(user_hash, read_only, repeatable)) as (conn, _):
            yield conn

    @asynccontextmanager
    async def user_with(
        self, user_hash: str, *statements: sql.Composable
    ) -> AsyncIterator[tuple[Connection, list[list[Any]]]]:
        """A user's write transaction (as ``user``) opened together with these statements in
        one simple query: the connection and each statement's rows.

        A hot path's way to fewer round trips: an execute costs its own round trip and about
        0.15 ms of this process's CPU, so a post's ten of them were most of its cost. Values go
        in as ``sql.Literal`` (quoted by psycopg, as the opening quotes the user hash)."""
        opening = sql.SQL("; ").join([_opening(user_hash, False, False), *statements])
        async with self._transaction(opening) as (conn, cur):
            rows = await _rows(cur)
            yield conn, rows[len(rows) - len(statements) :]

    @asynccontextmanager
    async def system(self) -> AsyncIterator[Connection]:
        """One transaction with no user: row-level security shows it no user's rows; what it
        may do across users goes through the SECURITY DEFINER functions."""
        async with self._transaction(sql.SQL("BEGIN")) as (conn, _):
            yield conn

    async def check(self) -> str | None:
        """None when the database answers, "database" when it does not, "schema" when its
        role or schema was refused (GET /readyz)."""
        if self.refused is not None:
            return "schema"
        try:
            async with self._pool.connection(timeout=CHECK_SECONDS) as conn:
                await self._checked(conn)
                await conn.execute("SELECT 1")
        except DatabaseRefused:
            return "schema"
        except (psycopg.Error, PoolTimeout):
            return "database"
        return None

    async def commit_with(self, conn: Connection, *statements: sql.Composable) -> None:
        """End the block's transaction with these statements (``sql.Literal`` values, as in
        ``user_with``) and its COMMIT in one round trip; the block's end then commits nothing
        more. Raises as the block's end would."""
        cur = await conn.execute(sql.SQL("; ").join([*statements, sql.SQL("COMMIT")]))
        while cur.nextset():
            pass
        _check_committed(cur)
        self._committed.add(conn)

    @asynccontextmanager
    async def _transaction(
        self, opening: sql.Composable
    ) -> AsyncIterator[tuple[Connection, psycopg.AsyncCursor[Any]]]:
        """A transaction ``opening`` began (the connection is in autocommit, so nothing else
        opens one), committed when the block ends and rolled back when it raises; the block
        gets the connection and the opening's cursor."""
        try:
            conn, cur = await self._begin(opening)
            try:
                yield conn, cur
                if conn in self._committed:
                    self._committed.discard(conn)
                else:
                    _check_committed(await conn.execute("COMMIT"))
            except BaseException:
                self._committed.discard(conn)
                if not conn.closed:  # a failed rollback leaves the pool to discard it
                    with suppress(psycopg.Error):
                        await conn.rollback()
                raise
            finally:
                self._returned[conn] = time.monotonic()
                await self._pool.putconn(conn)
        except PoolTimeout as exc:
            raise StoreUnavailable(UNREACHABLE) from exc
        except psycopg.OperationalError as exc:
            if _away(exc):
                raise StoreUnavailable(UNREACHABLE) from exc
            raise

    async def _begin(self, opening: sql.Composable) -> tuple[Connection, psycopg.AsyncCursor[Any]]:
        """A pooled connection with ``opening`` run on it. One the database cut since its last
        use (a restart) fails right there, before any work: it is replaced, once."""
        if self.refused is not None:
            raise DatabaseRefused(REFUSED)
        for retry in (True, False):
            conn = await self._pool.getconn()
            try:
                await self._checked(conn)
                return conn, await conn.execute(opening)
            except BaseException as exc:
                await self._pool.putconn(conn)  # a cut one is discarded
                if not (retry and isinstance(exc, psycopg.OperationalError) and _away(exc)):
                    raise
        raise AssertionError("unreachable")

    async def _checked(self, conn: Connection) -> None:
        """The role and schema check on ``conn``, once: the first use after start waits for it
        (one at a time; later ones find it done). DatabaseRefused once it failed."""
        if self._verified:
            return
        async with self._verifying:
            if self.refused is None and not self._verified and self._verify is not None:
                try:
                    await self._verify(conn)
                except ConfigError as exc:
                    self.refused = str(exc)
                    self._refused.set()
                else:
                    self._verified = True
        if self.refused is not None:
            raise DatabaseRefused(REFUSED)

    async def _check(self, conn: Connection) -> None:
        """At checkout: a connection idle for long is pinged first (one found cut is replaced
        by the pool); one used just now is not (a round trip saved per unit of work)."""
        if time.monotonic() - self._returned.get(conn, 0.0) > FRESH_SECONDS:
            await AsyncConnectionPool.check_connection(conn)


def xact_lock(key: str) -> sql.Composed:
    """The advisory lock named ``key``, held to the transaction's end (on any replica: the
    lock lives in the database). The key is hashed to PostgreSQL's 64-bit lock space."""
    return sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))").format(sql.Literal(key))


async def _rows(cur: psycopg.AsyncCursor[Any]) -> list[list[Any]]:
    """Each result's rows, of a query of several statements."""
    results = []
    while True:
        results.append(await cur.fetchall() if cur.description is not None else [])
        if not cur.nextset():
            return results


def _opening(user_hash: str, read_only: bool, repeatable: bool) -> sql.Composed:
    """BEGIN with its modes and SET LOCAL of the user: one simple query (the hash quoted by
    psycopg, no parameters), so a transaction opens in one round trip."""
    begin = "BEGIN" + (" ISOLATION LEVEL REPEATABLE READ" if repeatable else "")
    begin += " READ ONLY" if read_only else ""
    return sql.SQL(begin + "; SELECT set_config({}, {}, true)").format(
        sql.Literal(USER_SETTING), sql.Literal(user_hash)
    )


def _check_committed(cur: psycopg.AsyncCursor[Any]) -> None:
    """A block that swallowed a failed statement left the transaction aborted: its COMMIT is
    answered ROLLBACK, with no error. It must never end as if committed (a 202 for nothing
    stored)."""
    if cur.statusmessage != "COMMIT":
        raise psycopg.errors.InFailedSqlTransaction(
            "the transaction was rolled back at its end (a statement in it failed)"
        )


def check_at_start(url: str) -> StartCheck:
    """A replica's one check of the database at ``url`` (Database.first_check), made before the
    server loads its model and app: a database that refuses it is refused at once; what it
    found is handed to the lifespan's Database (``checked``), which connects no more."""

    async def first_check() -> StartCheck:
        try:
            outage = await Database(url, 1).first_check()  # its pool is never opened
        except ConfigError as exc:
            return StartCheck(refused=str(exc))
        return StartCheck(outage=outage)

    return asyncio.run(first_check())


def misconfigured(exc: psycopg.OperationalError) -> str | None:
    """What the server said when it refused a connection for good (its own words: they name a
    role or a database, never a password), or None when the failure is an outage."""
    if exc.sqlstate in ("28000", "28P01", "3D000", "42501"):
        return _first_line(exc)
    if match := MISCONFIGURED.search(str(exc)):
        return (match["fatal"] or match["libpq"]).strip()
    return None


def _first_line(exc: psycopg.Error) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _where(url: str) -> str:
    """host:port/dbname as user, for the start-up line: never the password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(DATABASE_URL not readable)"
    host, port = info.get("host", "localhost"), info.get("port", "5432")
    return f"{host}:{port}/{info.get('dbname', '')} as {info.get('user', '')}"


def _away(exc: psycopg.OperationalError) -> bool:
    """Whether the error is the database being out of reach: libpq's own (no SQLSTATE: refused,
    cut), a connection exception (08), insufficient resources (53: too many connections), the
    server going down (57P), a system error (58)."""
    return exc.sqlstate is None or exc.sqlstate.startswith(("08", "53", "57P", "58"))


async def _configure(conn: Connection) -> None:
    """Each new connection: pgvector's adapter, when the database has the extension (a numpy
    array parameter is sent as a vector; a column reads back as a `pgvector.Vector`:
    `.to_numpy()`)."""
    cur = await conn.execute("SELECT to_regtype('vector') IS NOT NULL")
    if (row := await cur.fetchone()) and row[0]:
        await register_vector_async(conn)
