"""Versioned migrations, the app role's grants, and the start-up check of the schema.

`recall-server migrate` (DATABASE_URL naming the tables' owner) applies what is missing under
an advisory lock, so two replicas starting at once apply each migration once, then grants the
app role what the server needs (rows, sequences, the cross-user functions; no ownership, no
DDL). The server connects as that role (not the owner, not a superuser, no BYPASSRLS: row-level
security binds it) and refuses, with one line, a schema it does not know.

Everything lives in the `public` schema: migrate pins its own search_path there, and the
SECURITY DEFINER functions pin theirs, so a role's own search_path cannot redirect them.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import sys

import psycopg
from psycopg import sql

from recall.settings import ConfigError

log = logging.getLogger("recall")

SCHEMA_VERSION = 2  # the newest migration this server knows
MIGRATE_LOCK = 0x7265_6361_6C6C  # "recall": the advisory lock migrations run under
APP_ROLE = "recall_app"  # the role the server connects as, granted what it needs by migrate
USER_SETTING = "recall.user_hash"  # SET LOCAL per transaction; every policy reads it

# Every table that holds a user's data: keyed by user_hash first, row-level security forced.
# (Migration 1's: a table added later gets its policies and grants in its own migration.)
USER_TABLES = (
    "users",
    "conversations",
    "tombstones",
    "tombstone_times",
    "receipts",
    "audit",
    "indexed",
    "chunks",
    "postings",
    "terms",
)
# No user data: every replica reads them; the app role may add a server key, not change one.
SHARED_TABLES = {"server_keys": "SELECT, INSERT", "recall_schema": "SELECT"}
SEQUENCES = (
    "conversation_versions",
    "receipts_seq_seq",
    "audit_seq_seq",
    "chunks_id_seq",
    "chunk_generations",
)
# The only cross-user reads: SECURITY DEFINER, owned by the owner, hashes/ids/counts only.
FUNCTIONS = (
    "recall_claim(text, double precision, double precision, integer)",
    "recall_index_lag(double precision)",
    "recall_indexing()",
    "recall_expired(timestamptz)",
    "recall_users()",
)


class MigrationError(Exception):
    """`recall-server migrate` cannot bring the schema up to date; the message says why."""


def _isolation(tables: tuple[str, ...]) -> str:
    """Row-level security, forced, on each user table: a row is visible and writable only in a
    transaction whose `recall.user_hash` is its user's. The `definer` policy lets the owner (the
    migration's role) see all rows: it is what the SECURITY DEFINER functions and `import` run
    as; the server never connects as it (check_schema refuses that)."""
    mine = f"user_hash = current_setting('{USER_SETTING}', true)"
    return "".join(
        f"ALTER TABLE {t} ENABLE ROW LEVEL SECURITY;\n"
        f"ALTER TABLE {t} FORCE ROW LEVEL SECURITY;\n"
        f"CREATE POLICY tenant ON {t} USING ({mine}) WITH CHECK ({mine});\n"
        f"CREATE POLICY definer ON {t} TO CURRENT_USER USING (true) WITH CHECK (true);\n"
        for t in tables
    )


_SHARED_V1 = "".join(
    f"ALTER TABLE {t} ENABLE ROW LEVEL SECURITY;\n"
    f"ALTER TABLE {t} FORCE ROW LEVEL SECURITY;\n"
    f"CREATE POLICY shared ON {t} USING (true) WITH CHECK (true);\n"
    for t in SHARED_TABLES
)

_DEFINER = "LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp"

_FUNCTIONS_V1 = f"""
-- The index queue, across users: due users (due_at passed, no live lease) leased to `owner`,
-- oldest due first. Rows another transaction holds (an erase, another replica's claim) are
-- skipped; posts (FOR KEY SHARE) do not hold a claim up. A run that died leaves due_at set: its
-- user is claimable again once the lease runs out. (debounce_seconds: the callers' signature;
-- the debounce is already in due_at.)
CREATE FUNCTION recall_claim(owner text, lease_seconds double precision,
                             debounce_seconds double precision, n integer)
RETURNS SETOF text {_DEFINER} AS $$
    WITH due AS (
        SELECT user_hash FROM users
        WHERE due_at <= now() AND (lease_until IS NULL OR lease_until < now())
        ORDER BY due_at, user_hash
        LIMIT n
        FOR NO KEY UPDATE SKIP LOCKED)
    UPDATE users u SET lease_owner = owner,
                       lease_until = now() + make_interval(secs => lease_seconds)
    FROM due WHERE u.user_hash = due.user_hash
    RETURNING u.user_hash;
$$;
-- /metrics: users queued that no run holds, and how long the oldest has waited since its first
-- unindexed write (due_at is that write + the debounce; pass the debounce to count from it).
CREATE FUNCTION recall_index_lag(debounce_seconds double precision DEFAULT 0)
RETURNS TABLE (users bigint, oldest_seconds double precision) {_DEFINER} AS $$
    SELECT count(*), coalesce(greatest(0, extract(epoch FROM now() - min(due_at))
                                          + debounce_seconds), 0)::double precision
    FROM users
    WHERE due_at IS NOT NULL AND (lease_until IS NULL OR lease_until < now());
$$;
-- Users with an index run due or going on.
CREATE FUNCTION recall_indexing() RETURNS bigint {_DEFINER} AS $$
    SELECT count(*) FROM users WHERE due_at IS NOT NULL OR lease_until > now();
$$;
-- Retention: the conversations whose last turn is older than the cutoff.
CREATE FUNCTION recall_expired(cutoff timestamptz)
RETURNS TABLE (user_hash text, conversation_id text) {_DEFINER} AS $$
    SELECT c.user_hash, c.conversation_id FROM conversations c WHERE c.last_ts < cutoff
    ORDER BY 1, 2;
$$;
-- Every user with a row (audit pruning walks them).
CREATE FUNCTION recall_users() RETURNS SETOF text {_DEFINER} AS $$
    SELECT user_hash FROM users ORDER BY 1;
$$;
""" + "".join(f"REVOKE ALL ON FUNCTION {f} FROM PUBLIC;\n" for f in FUNCTIONS)

_QUEUE_INDEXES_V1 = """
-- The queue and retention read across users: small indexes keep them off a full scan.
CREATE INDEX users_due ON users (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX conversations_by_age ON conversations (last_ts);
"""

MIGRATIONS: dict[int, str] = {
    1: """
CREATE EXTENSION IF NOT EXISTS vector;

-- One row per user: the index queue (a not-before time, a lease) and the counters recalls check.
CREATE TABLE users (
    user_hash text PRIMARY KEY,
    changes bigint NOT NULL DEFAULT 0,      -- bumped by every post that wrote, forget, erase
    indexed_changes bigint NOT NULL DEFAULT 0,  -- the `changes` the last good index run covered
    due_at timestamptz,                     -- an index run is due from then on (NULL: none)
    lease_owner text,                       -- the replica running it, until lease_until
    lease_until timestamptz,
    forgets bigint NOT NULL DEFAULT 0,      -- bumped by every forget and erase: a recall that
                                            -- saw it change re-reads (no forgotten passage)
    erasures bigint NOT NULL DEFAULT 0,     -- bumped by every erase
    built_by text,                          -- the embedder fingerprint + schema of its chunks
    passages bigint NOT NULL DEFAULT 0,     -- BM25: searchable pieces, and their tokens in all
    tokens bigint NOT NULL DEFAULT 0
);

-- The truth: one row per conversation, the whole conversation as funes-format JSON lines.
CREATE TABLE conversations (
    user_hash text NOT NULL,
    conversation_id text NOT NULL,
    body text NOT NULL,                     -- exactly what the files store writes to disk
    version bigint NOT NULL,                -- a new value on every write
    first_ts timestamptz NOT NULL,
    last_ts timestamptz NOT NULL,           -- retention
    turns integer NOT NULL,
    PRIMARY KEY (user_hash, conversation_id)
);
CREATE SEQUENCE conversation_versions;

-- Tombstones: digests of forgotten turns (HMAC under a server key, named by key_id), and the
-- time rule of tombstones imported from before digests (conversation_id '*': an erasure).
CREATE TABLE tombstones (
    user_hash text NOT NULL,
    conversation_id text NOT NULL,
    key_id text NOT NULL,
    digest text NOT NULL,
    PRIMARY KEY (user_hash, conversation_id, key_id, digest)
);
CREATE TABLE tombstone_times (
    user_hash text NOT NULL,
    conversation_id text NOT NULL,
    at timestamptz NOT NULL,
    PRIMARY KEY (user_hash, conversation_id)
);
-- Server keys (no user data): the tombstone key every replica shares.
CREATE TABLE server_keys (
    key_id text PRIMARY KEY,
    value bytea NOT NULL,
    made_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE receipts (
    user_hash text NOT NULL,
    seq bigserial,
    receipt jsonb NOT NULL,
    PRIMARY KEY (user_hash, seq)
);
CREATE TABLE audit (
    user_hash text NOT NULL,
    seq bigserial,
    at text NOT NULL,                       -- ...Z, as the files store's lines
    line jsonb NOT NULL,
    PRIMARY KEY (user_hash, seq)
);

-- The index (disposable: rebuilt from conversations). Which version of each conversation the
-- chunks show; the pieces with their vectors; BM25's postings and per-user term statistics.
CREATE TABLE indexed (
    user_hash text NOT NULL,
    conversation_id text NOT NULL,
    version bigint NOT NULL,
    PRIMARY KEY (user_hash, conversation_id)
);
CREATE TABLE chunks (
    user_hash text NOT NULL,
    id bigserial,
    chunk text NOT NULL,                    -- sha1("session:turn:block:split")[:16], as funes
    conversation_id text NOT NULL,
    turn text NOT NULL,
    seq integer NOT NULL,
    block integer NOT NULL,
    split integer NOT NULL,
    ts text NOT NULL,
    epoch double precision NOT NULL,
    role text NOT NULL,
    text text NOT NULL,
    ids text NOT NULL,
    digest text NOT NULL,                   -- sha1 of the embedded text: unchanged, not re-embedded
    recalled boolean NOT NULL,
    tokens integer NOT NULL,                -- BM25's document length (text and ids columns)
    embedding vector NOT NULL,
    PRIMARY KEY (user_hash, id),
    UNIQUE (user_hash, conversation_id, chunk)
);
-- Neighbours and a conversation's rows. No approximate vector index: the dense leg scans one
-- user's rows exactly (an index shared by tenants lets one degrade another's recall).
CREATE INDEX chunks_by_turn ON chunks (user_hash, conversation_id, seq);
CREATE TABLE postings (
    user_hash text NOT NULL,
    term text NOT NULL,                     -- a porter stem, as SQLite FTS5 makes it
    chunk_id bigint NOT NULL,
    tf_text integer NOT NULL,
    tf_ids integer NOT NULL,
    PRIMARY KEY (user_hash, term, chunk_id)
);
CREATE INDEX postings_by_chunk ON postings (user_hash, chunk_id);
CREATE TABLE terms (
    user_hash text NOT NULL,
    term text NOT NULL,
    docs integer NOT NULL,                  -- searchable pieces holding the term
    PRIMARY KEY (user_hash, term)
);

CREATE TABLE recall_schema (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""
    + _QUEUE_INDEXES_V1
    + _isolation(USER_TABLES)
    + _SHARED_V1
    + _FUNCTIONS_V1,
    2: """
-- A replica's cached matrix of a user's vectors (recall/ranking/vectors.py) is valid
-- for one value: every change to the user's searchable chunks (an index run's flush, a forget,
-- an erase, a rebuild) sets a new one from the sequence, so a value never comes back.
ALTER TABLE users ADD COLUMN generation bigint NOT NULL DEFAULT 0;
CREATE SEQUENCE chunk_generations;
""",
}


async def migrate(owner_url: str, app_role: str = APP_ROLE) -> list[int]:
    """Apply the migrations the database lacks, as the tables' owner, and grant ``app_role``
    what the server needs; the versions applied (none when up to date). Two runs at once are
    safe: they take turns under one advisory lock, and the second finds nothing to do."""
    conn = await connect(owner_url)
    async with conn:
        await conn.execute("SET search_path = public")
        await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK,))
        try:
            await _ensure_app_role(conn, app_role)
            await _ensure_pgvector(conn)
            applied = []
            current = await _version(conn)
            for version in sorted(v for v in MIGRATIONS if v > current):
                async with conn.transaction():
                    await conn.execute(MIGRATIONS[version].encode())
                    await conn.execute(
                        "INSERT INTO recall_schema (version) VALUES (%s)", (version,)
                    )
                applied.append(version)
            async with conn.transaction():
                await _grant(conn, app_role)
        except psycopg.Error as exc:
            raise MigrationError(f"migration failed: {_reason(exc)}") from exc
    # (the advisory lock is the session's: it went with the connection)
    return applied


async def _version(conn: psycopg.AsyncConnection) -> int:
    """The newest migration applied (0: none; the table itself is migration 1's)."""
    cur = await conn.execute("SELECT to_regclass('public.recall_schema') IS NOT NULL")
    if not (await cur.fetchone() or (False,))[0]:
        return 0
    cur = await conn.execute("SELECT coalesce(max(version), 0) FROM public.recall_schema")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _ensure_app_role(conn: psycopg.AsyncConnection, app_role: str) -> None:
    cur = await conn.execute("SELECT current_user = %s", (app_role,))
    if (row := await cur.fetchone()) and row[0]:
        raise MigrationError(
            f"--app-role {app_role} is the role migrate runs as (the tables' owner): the server "
            "must connect as another role, which row-level security binds"
        )
    cur = await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (app_role,))
    if await cur.fetchone():
        return
    try:
        await conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(app_role)))
    except psycopg.errors.DuplicateObject:
        return  # another database's migrate made it meanwhile (roles are cluster-wide)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise MigrationError(
            f"role {app_role} does not exist and this role may not create it: create it "
            f"(CREATE ROLE {app_role} LOGIN PASSWORD '...') and run migrate again"
        ) from exc
    log.warning(
        "created role %s NOLOGIN: let the server connect as it with "
        "ALTER ROLE %s LOGIN PASSWORD '...'",
        app_role,
        app_role,
    )


async def _ensure_pgvector(conn: psycopg.AsyncConnection) -> None:
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        raise MigrationError(
            f"pgvector: CREATE EXTENSION vector failed ({_reason(exc)}): install pgvector on the "
            "database server, or have a superuser run CREATE EXTENSION vector in this database"
        ) from exc


async def _grant(conn: psycopg.AsyncConnection, app_role: str) -> None:
    """What the server needs, on every run (idempotent): rows of the user tables, reading the
    shared ones, the sequences, the cross-user functions. No TRUNCATE (it skips row-level
    security), no REFERENCES or TRIGGER, nothing it could own."""
    role = sql.Identifier(app_role)
    tables = sql.SQL(", ").join(map(sql.Identifier, USER_TABLES))
    statements = [
        sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(role),
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(tables, role),
        *(
            sql.SQL("GRANT {} ON {} TO {}").format(sql.SQL(rights), sql.Identifier(t), role)
            for t, rights in SHARED_TABLES.items()
        ),
        sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(
            sql.SQL(", ").join(map(sql.Identifier, SEQUENCES)), role
        ),
        *(
            sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(f), role)
            for f in FUNCTIONS
        ),
    ]
    for statement in statements:
        await conn.execute(statement)


async def connect(url: str) -> psycopg.AsyncConnection:
    """One autocommit connection for a command; MigrationError, in one line naming no
    password, when there is none."""
    try:
        return await psycopg.AsyncConnection.connect(url, autocommit=True)
    except psycopg.OperationalError as exc:
        raise MigrationError(f"cannot connect to the database: {_reason(exc)}") from exc
    except psycopg.Error as exc:  # libpq's parse errors may quote the URL: never shown
        raise MigrationError("DATABASE_URL is not a PostgreSQL connection URL") from exc


def key_id(key: bytes) -> str:
    """How server_keys names a tombstone key: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(key).hexdigest()[:8]


def _reason(exc: psycopg.Error) -> str:
    """The server's (or libpq's) first line: it names roles and hosts, never a password."""
    text = (exc.diag.message_primary or str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def check_version(conn: psycopg.AsyncConnection) -> None:
    """ConfigError, in one line, unless the database has exactly this server's schema."""
    version = await _version(conn)
    if version < SCHEMA_VERSION:
        state = "has no recall schema" if version == 0 else f"has schema version {version}"
        raise ConfigError(
            f"the database {state}, this server needs {SCHEMA_VERSION}: run recall-server "
            "migrate (DATABASE_URL naming the tables' owner)"
        )
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"the database has schema version {version}, newer than this server's "
            f"({SCHEMA_VERSION}): upgrade the server"
        )


async def check_schema(conn: psycopg.AsyncConnection) -> None:
    """Refuse, with one line, to serve from this connection's database: no schema or an older
    one (run migrate), a newer one (upgrade the server), or a role row-level security would not
    bind (a superuser, BYPASSRLS, the tables' owner or a member of it)."""
    cur = await conn.execute(
        "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
    )
    role, superuser, bypass = await cur.fetchone() or ("?", False, False)
    unbound = f"DATABASE_URL's role {role} {{}}: row-level security would not bind it; " + (
        f"connect as the app role ({APP_ROLE}, see recall-server migrate)"
    )
    if superuser:
        raise ConfigError(unbound.format("is a superuser"))
    if bypass:
        raise ConfigError(unbound.format("has BYPASSRLS"))
    await check_version(conn)
    cur = await conn.execute(
        "SELECT pg_has_role(current_user, relowner, 'USAGE') FROM pg_class "
        "WHERE oid = 'public.users'::regclass"
    )
    if (row := await cur.fetchone()) and row[0]:
        raise ConfigError(unbound.format("owns the tables (or is a member of their owner)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="recall-server migrate",
        description="Create or upgrade the PostgreSQL schema (STORE=postgres) and grant the app "
        "role what the server needs. DATABASE_URL names the tables' owner (not the app role). "
        "Safe to run again, and from several replicas at once.",
        epilog="Exit status: 0 the schema is up to date; 1 it could not be brought up to date; "
        "2 no DATABASE_URL.",
    )
    parser.add_argument(
        "--app-role",
        default=APP_ROLE,
        help=f"the role the servers connect as (default {APP_ROLE}); made NOLOGIN if missing",
    )
    args = parser.parse_args(argv)
    if not (url := os.environ.get("DATABASE_URL")):
        print("recall-server migrate: set DATABASE_URL to the tables' owner", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="recall-server migrate: %(message)s")
    try:
        applied = asyncio.run(migrate(url, args.app_role))
    except MigrationError as exc:
        print(f"recall-server migrate: {exc}", file=sys.stderr)
        return 1
    done = f"applied {', '.join(map(str, applied))}" if applied else "up to date"
    print(
        f"recall-server migrate: schema version {SCHEMA_VERSION}, {done}; "
        f"role {args.app_role} granted",
        file=sys.stderr,
    )
    return 0
