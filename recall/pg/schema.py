"""Versioned migrations and the start-up check of the schema version.

`recall-server migrate` (DATABASE_URL naming the tables' owner) applies what is missing under
an advisory lock, so two replicas starting at once apply each migration once. The server itself
connects as another role (not the owner, not a superuser: row-level security binds it) and
refuses, with one line, a schema it does not know.
"""

from __future__ import annotations

SCHEMA_VERSION = 1  # the newest migration this server knows
MIGRATE_LOCK = 0x7265_6361_6C6C  # "recall": the advisory lock migrations run under
APP_ROLE = "recall_app"  # the role the server connects as, granted what it needs by migrate
USER_SETTING = "recall.user_hash"  # SET LOCAL per transaction; every policy reads it

# Every table that holds a user's data: keyed by user_hash first, row-level security forced.
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
""",
}
