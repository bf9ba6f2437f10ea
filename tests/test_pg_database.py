"""recall/pg/database.py against a real PostgreSQL: per-user transactions, faults, recovery."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import numpy as np
import psycopg
import pytest
from pg import PgDatabase, PgServer
from psycopg import sql

from recall.domain.errors import StoreUnavailable
from recall.pg.database import Database

ALICE, BOB = "a" * 24, "b" * 24


@pytest.fixture
async def db(pg_database: PgDatabase) -> AsyncIterator[Database]:
    database = Database(pg_database.app_url, 4)
    await database.open()
    yield database
    await database.close()


async def add_user(db: Database, user_hash: str, conversation_id: str = "c1") -> None:
    async with db.user(user_hash) as conn:
        await conn.execute("INSERT INTO users (user_hash) VALUES (%s)", (user_hash,))
        await conn.execute(
            "INSERT INTO conversations VALUES (%s, %s, '{}', nextval('conversation_versions'), "
            "now(), now(), 1)",
            (user_hash, conversation_id),
        )


async def count(conn: psycopg.AsyncConnection, table: str) -> int:
    cur = await conn.execute(f"SELECT count(*) FROM {table}")  # no filter: the policy's alone
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def until_answers(db: Database, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while await db.check() is not None:
        assert time.monotonic() < deadline, "the pool did not reconnect"
        await asyncio.sleep(0.2)


async def test_a_users_transaction_sees_and_writes_only_that_users_rows(db: Database) -> None:
    # given two users' rows
    await add_user(db, ALICE)
    await add_user(db, BOB)
    # when alice's transaction reads without a filter of its own, then only her rows show
    async with db.user(ALICE) as conn:
        assert await count(conn, "users") == 1
        assert await count(conn, "conversations") == 1
    # and a row for bob is refused
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        async with db.user(ALICE) as conn:
            await conn.execute("INSERT INTO users (user_hash) VALUES (%s)", (BOB,))


async def test_a_system_transaction_sees_no_users_rows(db: Database) -> None:
    await add_user(db, ALICE)
    async with db.system() as conn:
        assert await count(conn, "conversations") == 0
        cur = await conn.execute("SELECT * FROM recall_users()")  # across users: hashes only
        assert await cur.fetchall() == [(ALICE,)]


async def test_the_setting_lasts_one_transaction_only(db: Database) -> None:
    # given alice's transaction ended, when the same pooled connection serves a system one
    await add_user(db, ALICE)
    async with db.system() as conn:
        cur = await conn.execute("SELECT current_setting('recall.user_hash', true)")
        # then it holds no user (SET LOCAL went with the commit)
        assert (await cur.fetchone()) in ((None,), ("",))


async def test_a_read_only_transaction_refuses_writes(db: Database) -> None:
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        async with db.user(ALICE, read_only=True, repeatable=True) as conn:
            cur = await conn.execute("SHOW transaction_isolation")
            assert await cur.fetchone() == ("repeatable read",)
            await conn.execute("INSERT INTO users (user_hash) VALUES (%s)", (ALICE,))


async def test_a_failed_block_writes_nothing(db: Database) -> None:
    with pytest.raises(RuntimeError):
        async with db.user(ALICE) as conn:
            await conn.execute("INSERT INTO users (user_hash) VALUES (%s)", (ALICE,))
            raise RuntimeError("the caller's own failure")
    async with db.user(ALICE) as conn:
        assert await count(conn, "users") == 0


async def test_a_block_whose_statement_failed_never_ends_as_if_committed(db: Database) -> None:
    # given a block that wrote, then swallowed a failed statement (the transaction is aborted:
    # PostgreSQL answers its COMMIT with ROLLBACK, and no error)
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        async with db.user(ALICE) as conn:
            await conn.execute("INSERT INTO users (user_hash) VALUES (%s)", (ALICE,))
            with contextlib.suppress(psycopg.errors.DivisionByZero):
                await conn.execute("SELECT 1 / 0")
    # then its end raised (a caller never acknowledges it), and nothing was written
    async with db.user(ALICE) as conn:
        assert await count(conn, "users") == 0


async def test_a_transaction_opened_with_reads_gets_their_rows_and_commits_with_its_writes(
    db: Database,
) -> None:
    # given alice's rows, and a value with quotes and a backslash, as a post's text has
    await add_user(db, ALICE)
    text = "it's C:\\temp -- 'quoted'; DROP TABLE users"
    # when a transaction opens with two reads and ends with a write and its commit
    async with db.user_with(
        ALICE,
        sql.SQL("SELECT count(*) FROM conversations"),
        sql.SQL("SELECT {}::text, 2").format(sql.Literal(text)),
    ) as (conn, (conversations, echoed)):
        # then each read's rows come back, in order, under alice's setting
        assert conversations == [(1,)]
        assert echoed == [(text, 2)]
        await db.commit_with(
            conn,
            sql.SQL("UPDATE conversations SET body = {} WHERE user_hash = {}").format(
                sql.Literal(text), sql.Literal(ALICE)
            ),
        )
    # and the write is committed, the value as written
    async with db.user(ALICE) as conn:
        cur = await conn.execute("SELECT body FROM conversations")
        assert await cur.fetchall() == [(text,)]


async def test_a_write_ending_in_a_failed_statement_commits_nothing(db: Database) -> None:
    await add_user(db, ALICE)
    with pytest.raises(psycopg.errors.DivisionByZero):
        async with db.user_with(ALICE) as (conn, _):
            await db.commit_with(
                conn, sql.SQL("DELETE FROM conversations"), sql.SQL("SELECT 1 / 0")
            )
    async with db.user(ALICE) as conn:
        assert await count(conn, "conversations") == 1


async def test_vectors_go_in_and_come_back_through_the_adapter(db: Database) -> None:
    vector = np.array([0.6, 0.8, 0.0], dtype=np.float32)
    async with db.user(ALICE) as conn:
        await conn.execute(
            "INSERT INTO chunks (user_hash, chunk, conversation_id, turn, seq, block, split, ts, "
            "epoch, role, text, ids, digest, recalled, tokens, embedding) VALUES "
            "(%s, 'k', 'c1', 't', 0, 0, 0, '', 0, 'user', '', '', '', false, 0, %s)",
            (ALICE, vector),
        )
        cur = await conn.execute("SELECT embedding, embedding <#> %s FROM chunks", (vector,))
        stored, distance = await cur.fetchone() or (None, None)
    assert np.allclose(stored.to_numpy(), vector)
    assert distance == pytest.approx(-1.0)


async def test_a_connection_cut_mid_transaction_is_store_unavailable(
    db: Database, pg_database: PgDatabase
) -> None:
    # given a transaction going on, when its backend is terminated
    with pytest.raises(StoreUnavailable, match=r"^database unreachable$"):
        async with db.user(ALICE) as conn:
            cur = await conn.execute("SELECT pg_backend_pid()")
            (pid,) = await cur.fetchone() or (0,)
            with psycopg.connect(pg_database.superuser_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await conn.execute("SELECT 1")
    # then the next transaction gets a working connection
    async with db.user(ALICE) as conn:
        assert await count(conn, "users") == 0


async def test_a_lock_refused_is_not_the_database_being_away(db: Database) -> None:
    # given alice's row locked by one transaction
    await add_user(db, ALICE)
    async with db.user(ALICE) as holder:
        await holder.execute("SELECT 1 FROM users WHERE user_hash = %s FOR UPDATE", (ALICE,))
        # when another asks for it with NOWAIT, then it gets psycopg's refusal, not a 503
        with pytest.raises(psycopg.errors.LockNotAvailable):
            async with db.user(ALICE) as other:
                await other.execute(
                    "SELECT 1 FROM users WHERE user_hash = %s FOR UPDATE NOWAIT", (ALICE,)
                )


async def test_the_pool_opens_while_the_database_is_down_and_recovers(
    pg_server: PgServer, pg_database: PgDatabase
) -> None:
    # given the database is down when the replica starts
    pg_server.stop()
    database = Database(pg_database.app_url, 2)
    try:
        await database.open()  # does not wait, does not raise
        # then a readiness check and a user's work both say so, without user data
        assert await database.check() == "database"
        with pytest.raises(StoreUnavailable, match=r"^database unreachable$"):
            async with database.user(ALICE):
                pass
        # when the database comes back, then the same pool serves again by itself
        pg_server.start()
        await until_answers(database)
        await add_user(database, ALICE)
        # and after a restart under an open pool, the idle connections cut are replaced
        pg_server.stop()
        pg_server.start()
        async with database.user(ALICE) as conn:
            assert await count(conn, "users") == 1
    finally:
        pg_server.start()  # whatever failed, the session's server runs on for the next tests
        await database.close()
