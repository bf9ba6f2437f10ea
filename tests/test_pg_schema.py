"""The PostgreSQL schema: migrate, the start-up check, and row-level security as the app role."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import ROOT
from pg import PgDatabase, PgServer
from psycopg import sql

from recall.pg import schema
from recall.pg.schema import (
    FUNCTIONS,
    MIGRATIONS,
    SCHEMA_VERSION,
    SHARED_TABLES,
    USER_TABLES,
    MigrationError,
    check_schema,
    migrate,
)
from recall.settings import ConfigError

ALICE, BOB = "a" * 24, "b" * 24
EVERY_VERSION = sorted(MIGRATIONS)

# One row of each user table, for a user hash (the owner writes them: its policy lets it).
ROWS = {
    "users": "INSERT INTO users (user_hash) VALUES (%(u)s)",
    "conversations": "INSERT INTO conversations VALUES (%(u)s, 'c1', '{}', "
    "nextval('conversation_versions'), now(), now() - interval '400 days', 1)",
    "tombstones": "INSERT INTO tombstones VALUES (%(u)s, 'c1', 'k1', 'd1')",
    "tombstone_times": "INSERT INTO tombstone_times VALUES (%(u)s, '*', now())",
    "receipts": "INSERT INTO receipts (user_hash, receipt) VALUES (%(u)s, '{}')",
    "audit": "INSERT INTO audit (user_hash, at, line) VALUES (%(u)s, 'T', '{}')",
    "indexed": "INSERT INTO indexed VALUES (%(u)s, 'c1', 1)",
    "chunks": "INSERT INTO chunks (user_hash, chunk, conversation_id, turn, seq, block, split, "
    "ts, epoch, role, text, ids, digest, recalled, tokens, embedding) VALUES "
    "(%(u)s, 'k', 'c1', 't', 0, 0, 0, '', 0, 'user', 'secret text', '', '', false, 2, '[1,0]')",
    "postings": "INSERT INTO postings VALUES (%(u)s, 'secret', 1, 1, 0)",
    "terms": "INSERT INTO terms VALUES (%(u)s, 'secret', 1)",
}


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def as_user(conn: psycopg.Connection[Any], user_hash: str) -> None:
    """What recall/pg/database.py does first in a user's transaction (here for the session)."""
    conn.execute("SELECT set_config('recall.user_hash', %s, false)", (user_hash,))


def seed(owner_url: str, *users: str) -> None:
    with connect(owner_url) as conn:
        for user in users:
            for statement in ROWS.values():
                conn.execute(statement, {"u": user})


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    # no WHERE of our own: what the policies alone let through
    return {
        t: conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))).fetchone()[0]
        for t in USER_TABLES
    }


def hashes(conn: psycopg.Connection[Any]) -> set[str]:
    found: set[str] = set()
    for t in USER_TABLES:
        query = sql.SQL("SELECT DISTINCT user_hash FROM {}").format(sql.Identifier(t))
        found |= {row[0] for row in conn.execute(query)}
    return found


def catalog(url: str) -> list[tuple[Any, ...]]:
    """What migrate makes: tables, policies, functions, privileges, the schema versions."""
    with connect(url) as conn:
        return [
            *conn.execute(
                "SELECT relname, relkind, relrowsecurity, relforcerowsecurity, relacl::text "
                "FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY relname"
            ),
            *conn.execute(
                "SELECT tablename, policyname, roles::text, qual, with_check FROM pg_policies "
                "ORDER BY 1, 2"
            ),
            *conn.execute(
                "SELECT proname, prosecdef, proconfig::text, proacl::text FROM pg_proc "
                "WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'recall%' ORDER BY 1"
            ),
            *conn.execute("SELECT version FROM recall_schema ORDER BY 1"),
        ]


@pytest.fixture
def bare(pg_server: PgServer) -> Iterator[PgDatabase]:
    """A database migrate has never touched, pgvector made by the superuser (as an operator
    whose owner role may not create extensions would)."""
    database = pg_server.empty_database()
    with connect(database.superuser_url) as conn:
        conn.execute("CREATE EXTENSION vector")
    yield database
    pg_server.drop_database(database.name)


@pytest.fixture
def bypassing_role(pg_server: PgServer, pg_database: PgDatabase) -> Iterator[str]:
    """A login role with BYPASSRLS (only a superuser can make one); its URL."""
    with connect(pg_database.superuser_url) as conn:
        conn.execute("CREATE ROLE recall_bypass LOGIN BYPASSRLS PASSWORD 'bypass-pw'")
    yield pg_server.url("recall_bypass", pg_database.name, "bypass-pw")
    pg_server.drop_database(pg_database.name)  # its connections first
    with connect(pg_server.superuser_url) as conn:
        conn.execute("DROP ROLE recall_bypass")


# --- migrate ---------------------------------------------------------------------------------


async def test_migrate_applies_every_version_once_and_a_second_run_changes_nothing(
    bare: PgDatabase,
) -> None:
    assert await migrate(bare.owner_url) == EVERY_VERSION
    made = catalog(bare.owner_url)
    assert await migrate(bare.owner_url) == []
    assert catalog(bare.owner_url) == made


async def test_a_version_1_database_moves_to_the_newest_keeping_its_rows(
    bare: PgDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a database a server of schema version 1 migrated, with a user's rows in it
    with monkeypatch.context() as old_server:
        old_server.setattr(schema, "MIGRATIONS", {1: MIGRATIONS[1]})
        old_server.setattr(schema, "SEQUENCES", schema.SEQUENCES[:-1])  # chunk_generations: v2
        assert await migrate(bare.owner_url) == [1]
    seed(bare.owner_url, ALICE)
    # when this server's migrate runs
    assert await migrate(bare.owner_url) == EVERY_VERSION[1:]
    # then every row is still there, the new column has its default, and the schema checks
    with connect(bare.owner_url) as conn:
        as_user(conn, ALICE)
        assert counts(conn) == dict.fromkeys(USER_TABLES, 1)
        assert conn.execute("SELECT generation FROM users").fetchone() == (0,)
    await check(bare.app_url)


async def test_two_migrations_at_once_both_succeed_and_apply_once(bare: PgDatabase) -> None:
    results = await asyncio.gather(migrate(bare.owner_url), migrate(bare.owner_url))
    assert sorted(results) == [[], EVERY_VERSION]
    with connect(bare.owner_url) as conn:
        rows = conn.execute("SELECT version FROM recall_schema ORDER BY 1").fetchall()
    assert rows == [(v,) for v in EVERY_VERSION]


async def test_migrate_without_pgvector_says_so_in_one_line(pg_server: PgServer) -> None:
    # given a database without the extension, and an owner that may not create it
    database = pg_server.empty_database()
    try:
        with pytest.raises(MigrationError) as caught:
            await migrate(database.owner_url)
        message = str(caught.value)
        assert message.startswith("pgvector: CREATE EXTENSION vector failed (")
        assert "\n" not in message
        # and nothing was made
        with connect(database.owner_url) as conn:
            assert conn.execute("SELECT to_regclass('recall_schema')").fetchone() == (None,)
    finally:
        pg_server.drop_database(database.name)


async def test_migrate_refuses_a_missing_app_role_its_owner_may_not_create(
    pg_database: PgDatabase,
) -> None:
    with pytest.raises(MigrationError, match=r"^role recall_nobody does not exist and this role"):
        await migrate(pg_database.owner_url, app_role="recall_nobody")


async def test_migrate_creates_a_missing_app_role_nologin_with_a_note(
    pg_server: PgServer, pg_database: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    # given an owner that may create roles (here the superuser), when the app role is missing
    try:
        with caplog.at_level(logging.WARNING, logger="recall"):
            assert await migrate(pg_database.superuser_url, app_role="recall_new") == []
        # then it exists, cannot log in yet, and may read the tables; the note says what next
        with connect(pg_database.superuser_url) as conn:
            assert conn.execute(
                "SELECT rolcanlogin, has_table_privilege('recall_new', 'users', 'SELECT') "
                "FROM pg_roles WHERE rolname = 'recall_new'"
            ).fetchone() == (False, True)
        assert "created role recall_new NOLOGIN" in caplog.text
        assert "ALTER ROLE recall_new LOGIN PASSWORD" in caplog.text
    finally:
        pg_server.drop_database(pg_database.name)
        with connect(pg_server.superuser_url) as conn:
            conn.execute("DROP ROLE IF EXISTS recall_new")


async def test_migrate_refuses_to_make_the_owner_the_app_role(pg_database: PgDatabase) -> None:
    with pytest.raises(MigrationError, match=r"^--app-role recall_owner is the role migrate"):
        await migrate(pg_database.owner_url, app_role="recall_owner")


def run_migrate(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "recall_server.py", "migrate", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def test_the_migrate_command_says_up_to_date_in_one_line(pg_database: PgDatabase) -> None:
    done = run_migrate(pg_database.owner_url)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (
        f"recall-server migrate: schema version {SCHEMA_VERSION}, up to date; "
        "role recall_app granted"
    )


def test_the_migrate_command_never_prints_the_password(
    pg_server: PgServer, pg_database: PgDatabase
) -> None:
    password = "wrong-secret-4471"
    done = run_migrate(pg_server.url("recall_owner", pg_database.name, password))
    assert done.returncode == 1
    assert done.stderr.startswith("recall-server migrate: cannot connect to the database: ")
    assert len(done.stderr.strip().splitlines()) == 1
    assert password not in done.stderr + done.stdout
    # nor of a URL libpq cannot parse
    done = run_migrate(f"postgresql://recall_owner:{password}@127.0.0.1:port/x")
    assert done.returncode == 1
    assert password not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_the_migrate_command_without_a_url_exits_2() -> None:
    done = run_migrate("")
    assert done.returncode == 2
    assert done.stderr.strip() == "recall-server migrate: set DATABASE_URL to the tables' owner"


# --- the start-up check ----------------------------------------------------------------------


async def check(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await check_schema(conn)


def one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


async def test_the_app_role_on_a_migrated_database_passes_the_check(
    pg_database: PgDatabase,
) -> None:
    await check(pg_database.app_url)


async def test_the_check_refuses_a_database_without_the_schema(pg_server: PgServer) -> None:
    database = pg_server.empty_database()
    try:
        with pytest.raises(ConfigError) as caught:
            await check(database.app_url)
        assert "has no recall schema" in one_line(caught)
        assert one_line(caught).endswith(
            "run recall-server migrate (DATABASE_URL naming the tables' owner)"
        )
    finally:
        pg_server.drop_database(database.name)


async def test_the_check_refuses_a_newer_schema(pg_database: PgDatabase) -> None:
    with connect(pg_database.owner_url) as conn:
        conn.execute("INSERT INTO recall_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(ConfigError) as caught:
        await check(pg_database.app_url)
    assert one_line(caught) == (
        f"the database has schema version {SCHEMA_VERSION + 1}, newer than this server's "
        f"({SCHEMA_VERSION}): upgrade the server"
    )


async def test_the_check_refuses_the_tables_owner(pg_database: PgDatabase) -> None:
    with pytest.raises(ConfigError) as caught:
        await check(pg_database.owner_url)
    assert one_line(caught).startswith(
        "DATABASE_URL's role recall_owner owns the tables (or is a member of their owner): "
        "row-level security would not bind it"
    )


async def test_the_check_refuses_a_superuser(pg_database: PgDatabase) -> None:
    with pytest.raises(ConfigError) as caught:
        await check(pg_database.superuser_url)
    assert one_line(caught).startswith("DATABASE_URL's role postgres is a superuser: ")


async def test_the_check_refuses_a_role_with_bypassrls(bypassing_role: str) -> None:
    with pytest.raises(ConfigError) as caught:
        await check(bypassing_role)
    assert one_line(caught).startswith("DATABASE_URL's role recall_bypass has BYPASSRLS: ")


# --- row-level security, as the app role -----------------------------------------------------


def test_every_table_has_row_level_security_enabled_and_forced(pg_database: PgDatabase) -> None:
    with connect(pg_database.owner_url) as conn:
        rows = conn.execute(
            "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class "
            "WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'"
        ).fetchall()
    assert {name for name, *_ in rows} == {*USER_TABLES, *SHARED_TABLES}
    assert [name for name, enabled, forced in rows if not (enabled and forced)] == []


def test_without_the_setting_the_app_role_sees_no_users_rows(pg_database: PgDatabase) -> None:
    seed(pg_database.owner_url, ALICE, BOB)
    with connect(pg_database.app_url) as conn:
        assert counts(conn) == dict.fromkeys(USER_TABLES, 0)
    with connect(pg_database.owner_url) as owner:  # the rows are there
        assert counts(owner) == dict.fromkeys(USER_TABLES, 2)


def test_as_one_user_the_other_users_rows_are_invisible_and_untouchable(
    pg_database: PgDatabase,
) -> None:
    seed(pg_database.owner_url, ALICE, BOB)
    with connect(pg_database.app_url) as conn:
        as_user(conn, ALICE)
        assert counts(conn) == dict.fromkeys(USER_TABLES, 1)
        assert hashes(conn) == {ALICE}
        for table in USER_TABLES:
            name = sql.Identifier(table)
            # bob's rows: updates and deletes reach none of them
            for statement in (
                sql.SQL("UPDATE {} SET user_hash = user_hash WHERE user_hash = %s"),
                sql.SQL("DELETE FROM {} WHERE user_hash = %s"),
            ):
                assert conn.execute(statement.format(name), (BOB,)).rowcount == 0
            # moving alice's row to bob is refused
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("UPDATE {} SET user_hash = %s").format(name), (BOB,))
    # and a new row for bob, one transaction each (each refusal aborts its own)
    for table, statement in ROWS.items():
        with connect(pg_database.app_url) as conn:
            as_user(conn, ALICE)
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                conn.execute(statement, {"u": BOB})
            assert table  # named in the failure's traceback
    with connect(pg_database.owner_url) as owner:
        assert counts(owner) == dict.fromkeys(USER_TABLES, 2)


def test_the_app_role_may_write_its_users_rows(pg_database: PgDatabase) -> None:
    # the grants cover every table and sequence the write path uses
    with connect(pg_database.app_url) as conn:
        as_user(conn, ALICE)
        for statement in ROWS.values():
            conn.execute(statement, {"u": ALICE})
        conn.execute("INSERT INTO server_keys (key_id, value) VALUES ('k1', 'x')")
        assert counts(conn) == dict.fromkeys(USER_TABLES, 1)
        assert conn.execute("SELECT key_id FROM server_keys").fetchall() == [("k1",)]


def test_the_cross_user_functions_return_only_hashes_and_counts(
    pg_database: PgDatabase,
) -> None:
    seed(pg_database.owner_url, ALICE, BOB)
    with connect(pg_database.owner_url) as owner:
        owner.execute("UPDATE users SET due_at = now() - interval '1 second'")
    with connect(pg_database.app_url) as conn:
        assert conn.execute("SELECT * FROM recall_users()").fetchall() == [(ALICE,), (BOB,)]
        assert conn.execute("SELECT recall_indexing()").fetchone() == (2,)
        users, oldest = conn.execute("SELECT * FROM recall_index_lag(0.5)").fetchone()
        assert users == 2 and 1.5 <= oldest < 30
        expired = conn.execute("SELECT * FROM recall_expired(now() - interval '1 day')")
        assert expired.fetchall() == [(ALICE, "c1"), (BOB, "c1")]
        claimed = conn.execute("SELECT * FROM recall_claim('replica-1', 30, 1, 1)").fetchall()
        assert claimed == [(ALICE,)]  # one asked for; leased now
        again = conn.execute("SELECT * FROM recall_claim('replica-2', 30, 1, 10)").fetchall()
        assert again == [(BOB,)]
        assert conn.execute("SELECT * FROM recall_index_lag()").fetchone() == (0, 0.0)
        assert conn.execute("SELECT recall_indexing()").fetchone() == (2,)
    with connect(pg_database.owner_url) as owner:
        # what each returns is hashes, ids and numbers; each runs as the owner, path pinned
        rows = owner.execute(
            "SELECT p.proname, p.prosecdef, p.proconfig, pg_get_function_result(p.oid), "
            "has_function_privilege('public', p.oid, 'EXECUTE'), "
            "has_function_privilege('recall_app', p.oid, 'EXECUTE') FROM pg_proc p "
            "WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'recall%' ORDER BY 1"
        ).fetchall()
    assert [name for name, *_ in rows] == sorted(f.split("(")[0] for f in FUNCTIONS)
    results = {
        "recall_claim": "SETOF text",
        "recall_expired": "TABLE(user_hash text, conversation_id text)",
        "recall_index_lag": "TABLE(users bigint, oldest_seconds double precision)",
        "recall_indexing": "bigint",
        "recall_users": "SETOF text",
    }
    for name, definer, config, result, public, app in rows:
        assert definer, name
        assert config == ["search_path=pg_catalog, public, pg_temp"], name
        assert result == results[name]
        assert (public, app) == (False, True), name


def test_two_replicas_claiming_at_once_never_get_the_same_user(pg_database: PgDatabase) -> None:
    # given 20 due users
    users = [f"{n:024x}" for n in range(20)]
    seed(pg_database.owner_url, *users)
    with connect(pg_database.owner_url) as owner:
        owner.execute("UPDATE users SET due_at = now() - interval '1 second'")
    # when one replica's claim is still in its transaction while another claims
    with connect(pg_database.app_url) as one, connect(pg_database.app_url) as two:
        two.execute("SET lock_timeout = '2s'")  # a claim that waited would fail, not hang
        with one.transaction():
            first = one.execute("SELECT * FROM recall_claim('one', 30, 1, 15)").fetchall()
            second = two.execute("SELECT * FROM recall_claim('two', 30, 1, 15)").fetchall()
        # then they split the users, none twice; and the leases keep a third claim away
        assert len(first) == 15 and len(second) == 5
        assert sorted(first + second) == [(u,) for u in users]
        assert two.execute("SELECT * FROM recall_claim('three', 30, 1, 15)").fetchall() == []
    with connect(pg_database.owner_url) as owner:
        owners = owner.execute("SELECT lease_owner, count(*) FROM users GROUP BY 1 ORDER BY 1")
        assert owners.fetchall() == [("one", 15), ("two", 5)]


def test_the_app_role_cannot_lift_row_level_security(pg_database: PgDatabase) -> None:
    seed(pg_database.owner_url, ALICE, BOB)
    attempts = [
        "ALTER TABLE conversations DISABLE ROW LEVEL SECURITY",
        "ALTER TABLE conversations NO FORCE ROW LEVEL SECURITY",
        "DROP POLICY tenant ON conversations",
        "CREATE POLICY everyone ON conversations USING (true)",
        "ALTER POLICY tenant ON conversations USING (true)",
        "DROP TABLE conversations",
        "TRUNCATE conversations",  # TRUNCATE would skip the policies: not granted
        "ALTER TABLE conversations OWNER TO recall_app",
        "CREATE TABLE public.mine (x int)",
        "CREATE FUNCTION public.recall_users() RETURNS SETOF text LANGUAGE sql AS 'SELECT 1::text'",
        "ALTER FUNCTION recall_users() SECURITY INVOKER",
        "SET ROLE recall_owner",
    ]
    for statement in attempts:
        with connect(pg_database.app_url) as conn, pytest.raises(psycopg.Error) as caught:
            conn.execute(statement)
        assert isinstance(caught.value, psycopg.errors.InsufficientPrivilege), statement
    # row_security = off does not switch the policies off: the query is refused instead
    with connect(pg_database.app_url) as conn:
        conn.execute("SET row_security = off")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("SELECT * FROM conversations")
    with connect(pg_database.owner_url) as owner:
        assert counts(owner) == dict.fromkeys(USER_TABLES, 2)
