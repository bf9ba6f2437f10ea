"""Storage: one SQLite file per user (rows + FTS5 + float32 vectors), reconciled with the sources.

    home/src/*.funes.jsonl -> turns -> pieces (recall/indexing/pieces.py) -> embed what is new
        -> home/embedded/recall.db

The sources are the truth; the db is a disposable index. Everything that changes what is stored
(the table layout, the piece size, the embedded text, and the identifier rules in text.py that
fill `ids`) needs a bump of pieces.SCHEMA: the next index run then rebuilds the db, as it does
when the embedder's fingerprint (the model and how it is run) is not the one the db was built
with.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recall.domain.conversation import SOURCE_SUFFIX
from recall.embedder import Embedder, packaged_fingerprint
from recall.files.layout import read_source, source_files
from recall.indexing.pieces import (
    FTS_TOKENIZER,
    Row,
    Stored,
    batch_full,
    built_by,
    changed_rows,
    embed_missing,
    rows_of,
)
from recall.ranking.bm25 import IDS_COLUMN_WEIGHT
from recall.ranking.pipeline import Piece, Pool
from recall.ranking.search import Candidate, Hit, Pooled, known_counts, searched_terms
from recall.ranking.text import Query, fts_query, fts_text

log = logging.getLogger("recall.embedded")

DB_DIR = "embedded"
DB_NAME = "recall.db"
SCHEMA_SQL = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- the stat stamp of each source file as last indexed: an unchanged file is not even read
CREATE TABLE IF NOT EXISTS files (conv TEXT PRIMARY KEY, stamp TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    chunk TEXT NOT NULL,             -- sha1("session:turn:block:split"), 16 hex, as funes
    conv TEXT NOT NULL, turn TEXT NOT NULL,
    seq INTEGER NOT NULL, block INTEGER NOT NULL, split INTEGER NOT NULL,
    ts TEXT NOT NULL, epoch REAL NOT NULL, role TEXT NOT NULL,
    text TEXT NOT NULL,              -- the piece, shown to the agent
    ids TEXT NOT NULL,               -- normalised identifiers in it (MT-4471 -> mt4471)
    digest TEXT NOT NULL,            -- sha1 of the text that was embedded
    vec BLOB NOT NULL,               -- float32 unit vector
    -- 1: a turn answered with recall: kept for neighbours, never in the FTS or the matrix
    recalled INTEGER NOT NULL DEFAULT 0,
    UNIQUE (conv, chunk)             -- per file: two files claiming one session cannot collide
);
CREATE INDEX IF NOT EXISTS chunks_by_turn ON chunks (conv, seq);  -- neighbours
CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5 (
    text, ids, content='chunks', content_rowid='id', tokenize='{FTS_TOKENIZER}'
);
CREATE TRIGGER IF NOT EXISTS chunks_ins AFTER INSERT ON chunks WHEN new.recalled = 0 BEGIN
    INSERT INTO fts (rowid, text, ids) VALUES (new.id, fts_text(new.text), new.ids);
END;
CREATE TRIGGER IF NOT EXISTS chunks_del AFTER DELETE ON chunks WHEN old.recalled = 0 BEGIN
    INSERT INTO fts (fts, rowid, text, ids) VALUES ('delete', old.id, fts_text(old.text), old.ids);
END;
"""


def db_path(home: Path) -> Path:
    return home / DB_DIR / DB_NAME


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def looks_like_db(path: Path) -> bool:
    """The file starts like an SQLite database (garbage or a missing file: False)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


@dataclass
class _FileWork:
    """What one changed source file needs: rows to drop, rows to write, its new stamp."""

    conv: str
    stamp: str
    drop: list[int] = field(default_factory=list)
    write: list[Row] = field(default_factory=list)


def _stamp(path: Path) -> str:
    # os.replace gives every post a new inode, so this changes whenever the file is rewritten.
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


# ---------------------------------------------------------------------------------------------
# The db file: connect, corruption, discard


def stored(con: sqlite3.Connection) -> dict[str, str]:
    """What the db itself records of how it was built ({} for a new db)."""
    return dict(con.execute("SELECT key, value FROM meta WHERE key IN ('schema', 'embedder')"))


def read_as_built(found: dict[str, str]) -> dict[str, str]:
    """``stored`` as ``built_by`` would say it: a db from before dbs recorded their embedder
    was built by the packaged model, as it then ran."""
    if found and "embedder" not in found:
        return {**found, "embedder": packaged_fingerprint()}
    return found


def outdated(path: Path, embedder: Embedder) -> bool:
    """Whether the db at ``path`` was built by another schema or model (False when there is
    no readable db: that is for ``looks_like_db`` to tell)."""
    try:
        con = connect(path, create=False)
        try:
            return read_as_built(stored(con)) != built_by(embedder)
        finally:
            con.close()
    except sqlite3.Error:
        return False


def connect(path: Path, *, create: bool) -> sqlite3.Connection:
    # Autocommit mode with explicit BEGIN: every transaction is visible in the code. Recall opens
    # with mode=rw so that it never creates an empty db where an index run just moved one aside.
    uri = f"file:{urllib.parse.quote(str(path))}?mode={'rwc' if create else 'rw'}"
    con = sqlite3.connect(uri, uri=True, timeout=10.0, isolation_level=None)
    con.execute("PRAGMA busy_timeout = 10000")
    # The FTS triggers index fts_text(text): every connection that may write or delete a row.
    con.create_function("fts_text", 1, fts_text, deterministic=True)
    return con


def is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    """Not a database, or a malformed one; a locked or busy db is not corrupt."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
    return not isinstance(exc, sqlite3.OperationalError)


def discard(path: Path) -> None:
    """Move a bad db aside (one copy kept for a post-mortem) with its WAL files."""
    if path.exists():
        path.replace(path.with_name(path.name + ".corrupt"))
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# Index: reconcile the db with the sources


def reconcile(
    home: Path, path: Path, embedder: Embedder, before_flush: Callable[[], None] = lambda: None
) -> None:
    """Bring the db up to date with the sources. ``before_flush`` may raise to stop the run
    between transactions (a deadline, a cancelled caller): what was flushed stays consistent."""
    con = connect(path, create=True)
    try:
        con.execute("PRAGMA journal_mode = WAL")
        con.executescript(SCHEMA_SQL)
        wanted, found = built_by(embedder), stored(con)
        if found != wanted:  # a new db, one from before the embedder was recorded, or another
            if found and read_as_built(found) != wanted:
                # Another layout, embedded text or model: start over (the sources are the truth).
                raise sqlite3.DatabaseError("index built by another schema or model")
            con.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", wanted.items())
        known = dict(con.execute("SELECT conv, stamp FROM files").fetchall())
        sources = {p.name[: -len(SOURCE_SUFFIX)]: p for p in source_files(home)}

        gone = sorted(known.keys() - sources.keys())
        if gone:
            con.execute("BEGIN IMMEDIATE")
            for conv in gone:
                con.execute("DELETE FROM chunks WHERE conv = ?", (conv,))
                con.execute("DELETE FROM files WHERE conv = ?", (conv,))
            bump(con)
            con.execute("COMMIT")

        pending: list[_FileWork] = []
        to_embed = 0
        for conv, source in sources.items():
            work = plan(con, conv, source, known.get(conv))
            if work is None:
                continue
            pending.append(work)
            to_embed += sum(1 for row in work.write if row.vec is None)
            if batch_full(len(pending), to_embed):
                before_flush()
                flush(con, pending, embedder)
                pending, to_embed = [], 0
        if pending:
            before_flush()
            flush(con, pending, embedder)
    finally:
        con.close()


def plan(
    con: sqlite3.Connection, conv: str, source: Path, known_stamp: str | None
) -> _FileWork | None:
    """What a source file needs, or None when it is unchanged or unreadable."""
    try:
        stamp = _stamp(source)
        if stamp == known_stamp:
            return None
        wanted = rows_of(conv, read_source(source))
    except FileNotFoundError:
        return None  # deleted since the listing: the next run removes its rows
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # The file name is a conversation id, never user text; the exception may hold text.
        log.warning("skipping unreadable source %s (%s)", source.name, type(exc).__name__)
        return None
    have = {
        chunk: Stored(rowid, seq, ts, role, text, bool(recalled), digest, vec)
        for rowid, chunk, seq, ts, role, text, recalled, digest, vec in con.execute(
            "SELECT id, chunk, seq, ts, role, text, recalled, digest, vec FROM chunks"
            " WHERE conv = ?",
            (conv,),
        )
    }
    work = _FileWork(conv, stamp)
    work.drop, work.write = changed_rows(wanted, have)
    return work


def flush(con: sqlite3.Connection, pending: list[_FileWork], embedder: Embedder) -> None:
    """Embed what the pending files need (batched), then write them in one transaction."""
    embed_missing([r for w in pending for r in w.write], embedder, np.ndarray.tobytes)
    con.execute("BEGIN IMMEDIATE")
    try:
        for work in pending:
            con.executemany("DELETE FROM chunks WHERE id = ?", [(i,) for i in work.drop])
            con.executemany(
                "INSERT INTO chunks (chunk, conv, turn, seq, block, split, ts, epoch, role,"
                " text, ids, digest, vec, recalled)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        r.chunk, r.conv, r.turn, r.seq, r.block, r.split, r.ts, r.epoch,
                        r.role, r.text, r.ids, r.digest, r.vec, int(r.recalled),
                    )
                    for r in work.write
                ],
            )  # fmt: skip
            con.execute("INSERT OR REPLACE INTO files VALUES (?, ?)", (work.conv, work.stamp))
        bump(con)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def forget_conversation(path: Path, conv: str) -> int:
    """Delete a conversation's rows so that its text is gone from the db's bytes; rows removed.

    secure_delete overwrites freed content with zeros; the FTS index is merged into one segment
    (FTS5 otherwise keeps a deleted row's terms in old segments, only marked deleted); the WAL,
    which held the old pages, is checkpointed into the db and truncated to nothing.
    """
    con = connect(path, create=False)
    try:
        con.execute("PRAGMA secure_delete = ON")
        con.execute("BEGIN IMMEDIATE")
        try:
            removed = con.execute("DELETE FROM chunks WHERE conv = ?", (conv,)).rowcount
            con.execute("DELETE FROM files WHERE conv = ?", (conv,))
            con.execute("INSERT INTO fts (fts) VALUES ('optimize')")
            bump(con)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        # TRUNCATE waits (busy_timeout) for readers of older snapshots; retry until it went
        # through, so no copy of the deleted pages is left in the WAL when we return.
        for _ in range(CHECKPOINT_TRIES):
            busy, _log, _done = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return max(removed, 0)
            time.sleep(0.1)
        raise sqlite3.OperationalError("WAL checkpoint stayed busy")
    finally:
        con.close()


CHECKPOINT_TRIES = 50


def bump(con: sqlite3.Connection) -> None:
    # A random generation, not a counter: a rebuilt db must never reuse a cached one's value.
    con.execute("INSERT OR REPLACE INTO meta VALUES ('generation', ?)", (uuid.uuid4().hex,))


# ---------------------------------------------------------------------------------------------
# Reads for recall (in the caller's snapshot)


def generation(con: sqlite3.Connection) -> str:
    """Changes with every committed index run: the vector cache's validity key."""
    row = con.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
    return row[0] if row else ""


def load_vectors(con: sqlite3.Connection, dim: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(rowids, n x dim float32 matrix with row i for rowids[i], epoch of the newest turn)."""
    # Recalled answers are left out: the dense leg never finds them (the FTS never holds them).
    count = con.execute("SELECT count(*) FROM chunks WHERE recalled = 0").fetchone()[0]
    ids = np.empty(count, dtype=np.int64)
    matrix = np.empty((count, dim), dtype=np.float32)
    newest = 0.0
    # Filled row by row, so loading never holds the blobs and the matrix twice.
    for n, (rowid, epoch, vec) in enumerate(
        con.execute("SELECT id, epoch, vec FROM chunks WHERE recalled = 0 ORDER BY id")
    ):
        ids[n] = rowid
        matrix[n] = np.frombuffer(vec, dtype=np.float32)
        newest = max(newest, epoch)
    return ids, matrix, newest


def common_stems(con: sqlite3.Connection, floor: float) -> dict[str, int]:
    """The indexed stems found in more than ``floor`` passages, with how many they are in."""
    con.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab USING fts5vocab(main, fts, row)")
    return dict(con.execute("SELECT term, doc FROM vocab WHERE doc > ?", (floor,)).fetchall())


def pieces_around(
    con: sqlite3.Connection, hits: Sequence[Hit], span: int
) -> dict[str, list[Piece]]:
    """By conversation, the pieces of the turns up to ``span`` before and after each hit's (its
    own included), each piece once, in conversation order."""
    near = " OR ".join(["(conv = ? AND seq BETWEEN ? AND ?)"] * len(hits))
    around: dict[str, list[Piece]] = {}
    for conv, seq, role, text, recalled in con.execute(
        "SELECT conv, seq, role, text, recalled FROM chunks"
        f" WHERE {near} ORDER BY conv, seq, block, split, id",
        [v for hit in hits for v in (hit.conv, hit.seq - span, hit.seq + span)],
    ):
        around.setdefault(conv, []).append(Piece(seq, role, text, recalled))
    return around


def doc_counts(con: sqlite3.Connection, terms: Sequence[str]) -> dict[str, int]:
    """How many passages contain each term (stemmed as FTS5 does). A count reads the term's
    whole doclist: ask only for terms that are not common."""
    return {
        term: con.execute(
            "SELECT count(*) FROM fts WHERE fts MATCH ?", (fts_query([term]),)
        ).fetchone()[0]
        for term in terms
    }


def bm25_pool(
    con: sqlite3.Connection, query: Query, common: Mapping[str, int], size: int, passages: int
) -> Pool:
    """The query's term counts and its ``size`` best rows by FTS5's bm25() (``passages``: the
    searchable rows; ``common``: the common stems, loaded with the matrix)."""
    # Counting a word reads its whole doclist, which for a common word is most of a
    # 10,000-conversation recall's time: common words take their count from the vocabulary
    # loaded with the matrix; the others are counted.
    counts = known_counts(query, common)
    counts.update(doc_counts(con, [t for t in query.terms if t not in counts]))
    # A wider BM25 pool, re-ordered by how much of the query each passage covers.
    rows = con.execute(
        "SELECT rowid, text, ids FROM fts WHERE fts MATCH ? ORDER BY bm25(fts, 1.0, ?) LIMIT ?",
        (fts_query(searched_terms(query, common)), IDS_COLUMN_WEIGHT, size),
    ).fetchall()
    return Pool(counts, passages, [Pooled(rowid, text, ids.split()) for rowid, text, ids in rows])


def candidate_rows(con: sqlite3.Connection, ids: Iterable[int]) -> list[Candidate]:
    """The rows of ``ids`` (the fused ones), as search.top_hits ranks them, in any order."""
    wanted = list(ids)
    if not wanted:
        return []
    marks = ",".join("?" * len(wanted))
    return [
        Candidate(rowid, conv, turn, seq, ts, epoch, role, text, held.split())
        for rowid, conv, turn, seq, ts, epoch, role, text, held in con.execute(
            "SELECT id, conv, turn, seq, ts, epoch, role, text, ids FROM chunks"
            f" WHERE id IN ({marks})",
            wanted,
        )
    ]
