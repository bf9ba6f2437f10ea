"""A tool call reads the store once and writes once: on PostgreSQL at most two transactions per
recall_my_conversations call, counted from pg_stat_database (xact_commit + xact_rollback of the
server's database) around calls made by a real MCP client, with a bearer token, to a real server.

What else could count in the window is held off or counted: the index runner's poll (a
transaction every half second) waits on a SHARE lock of `users` the test holds (a search only
reads that table, a settle takes FOR KEY SHARE: neither waits for it); nothing asks /healthz;
autovacuum is off while the test runs (a worker's visit to the database is its transactions
too); the counts are read from another database once every backend has flushed them (PostgreSQL
does so when a backend is idle, at most every second, else within ten); and the pool's ping of a
connection idle for over a second (recall/pg/database.py, FRESH_SECONDS), an empty statement
that is a transaction of its own, is counted from the database's statement log (how many there
are depends on how slowly the calls come on a busy machine, not on the tool).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Server, conversation, make_server
from fastmcp import Client
from pg import PgDatabase, PgServer
from psycopg import sql

from recall.domain.conversation import conversation_ref, user_dir_name

CALLS = 10  # back to back, each in its own MCP session
PER_CALL = 2  # the promise: one snapshot read, one settle (the check and the audit line)
EMPTY_STATEMENT = re.compile(r"LOG:  statement: $", re.MULTILINE)
FLUSHED_WITHIN = 11.0  # seconds: PGSTAT_IDLE_INTERVAL (10 s), the longest a backend holds counts


@pytest.fixture
def quiet_database(pg_server: PgServer, pg_database: PgDatabase) -> Iterator[None]:
    """While the test runs: every statement on the test's database logged (the pings are
    counted from the log), and autovacuum off on the test server (a worker's visit to the
    database, about once a minute, is its transactions too)."""
    name = sql.Identifier(pg_database.name)
    configure(pg_server, sql.SQL("ALTER DATABASE {} SET log_statement = 'all'").format(name))
    configure(pg_server, sql.SQL("ALTER SYSTEM SET autovacuum = off"))
    try:
        yield
    finally:
        configure(pg_server, sql.SQL("ALTER SYSTEM RESET autovacuum"))


def configure(pg_server: PgServer, statement: sql.Composable) -> None:
    with psycopg.connect(pg_server.superuser_url, autocommit=True) as conn:
        conn.execute(statement)
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture
def server(tmp_path: Path, pg_database: PgDatabase, quiet_database: None) -> Iterator[Server]:
    settings = {"STORE": "postgres", "DATABASE_URL": pg_database.app_url}
    with make_server(tmp_path, ENGINE="embedded", **settings).start() as server:
        body = conversation("alice", "c1", "ticket MT-4471 is open on the K-2 compressor", "Noted.")
        assert server.post(body)[0] == 202
        server.wait_indexed("alice")
        yield server


def transactions(pg_server: PgServer, database: str) -> int:
    """The database's transactions as flushed so far, read from the `postgres` database (so the
    reading itself is no transaction of ``database``)."""
    with psycopg.connect(pg_server.superuser_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            (database,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def pings(log: str) -> int:
    """The empty statements in a stretch of the server's log: the pool's pings (psycopg_pool's
    check_connection), logged as the database logs every statement (``log_statement``)."""
    return len(EMPTY_STATEMENT.findall(log))


async def counted_calls(
    server: Server, pg_server: PgServer, database: str, tool: str, arguments: dict[str, Any]
) -> tuple[list[str], int, int]:
    """CALLS calls of ``tool`` back to back, after the counts of what came before settled: their
    answers, the transactions counted, and the pool's pings among them."""
    await asyncio.sleep(FLUSHED_WITHIN)
    before, logged = transactions(pg_server, database), len(pg_server.log())
    answers = [await call(server, tool, arguments) for _ in range(CALLS)]
    await asyncio.sleep(FLUSHED_WITHIN)
    return answers, transactions(pg_server, database) - before, pings(pg_server.log()[logged:])


async def call(server: Server, tool: str, arguments: dict[str, Any]) -> str:
    """One call in its own MCP session, with alice's bearer token."""
    async with Client(f"{server.url}/mcp", auth=server.tokens["alice"]) as client:
        result = await client.call_tool(tool, arguments)
    return result.content[0].text  # type: ignore[union-attr]


@pytest.mark.slow  # two bursts of calls, each between waits for the counts to be flushed
async def test_a_tool_call_costs_at_most_two_transactions_on_postgres(
    server: Server, pg_server: PgServer, pg_database: PgDatabase
) -> None:
    # Given a ready index, and the index runner's poll held off by a lock the test holds
    search = ("recall_my_conversations", {"query": "MT-4471"})
    read = ("read_my_conversation", {"ref": conversation_ref(user_dir_name("alice"), "c1")})
    with psycopg.connect(pg_database.superuser_url) as holder:
        holder.execute("LOCK TABLE users IN SHARE MODE")
        first = await call(server, *search)  # the model loaded, the matrix cached
        assert "MT-4471 is open on the K-2 compressor" in first

        # When alice's agent calls each tool CALLS times, back to back
        searched, by_search, search_pings = await counted_calls(
            server, pg_server, pg_database.name, *search
        )
        reads, by_read, read_pings = await counted_calls(server, pg_server, pg_database.name, *read)
        holder.rollback()

    # Then each answer is the first one, and the calls cost at most two transactions each (and
    # the pool's pings besides)
    print(f"search {by_search} ({search_pings} pings), read {by_read} ({read_pings} pings)")
    assert searched == [first] * CALLS
    assert by_search - search_pings <= PER_CALL * CALLS, (by_search, search_pings)
    assert all("MT-4471 is open on the K-2 compressor" in text for text in reads)
    assert by_read - read_pings <= PER_CALL * CALLS, (by_read, read_pings)
    # and every call left its one line in alice's audit
    with psycopg.connect(pg_database.superuser_url) as conn:
        row = conn.execute("SELECT count(*) FROM audit").fetchone()
    assert row == (2 * CALLS + 1,)
