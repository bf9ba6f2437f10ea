"""The embedded engine: hybrid search in-process, one SQLite file per user, no subprocess.

    index:  home/src/*.funes.jsonl -> turns -> pieces of ~1,200 chars -> embed what is new
            -> home/embedded/recall.db (rows + FTS5 + float32 vectors), reconciled with the sources
    recall: query -> BM25 (FTS5) + exact cosine (numpy, matrix cached per user)
            -> weighted reciprocal rank fusion -> optional recency -> top k -> passages with the
            turns before and after, under max_chars

The sources are the truth; the db is a disposable index. A db that cannot be read is moved aside
and rebuilt by the next index run; until then recall raises EngineError (the server fails soft).
Index runs and recalls each run in their own bounded thread pool; an index run past its
INDEX_TIMEOUT stops between flushes (each flush is one transaction, so the db stays consistent).
Rows are keyed like funes' chunks, sha1("session:turn:block:split"), and carry a hash of the text
that was embedded, so an index run embeds only new or changed text.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
import threading
import time
import urllib.parse
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from recall.concurrency import run_in
from recall.conversations import SOURCE_SUFFIX, read_source, source_files
from recall.embedder import Embedder, release_freed_memory
from recall.engines.base import EngineError

log = logging.getLogger("recall.embedded")

DB_DIR = "embedded"
DB_NAME = "recall.db"
SCHEMA = "1"  # bump when the table layout or the embedded text changes: the db is then rebuilt

PIECE_CHARS = 1_200  # funes' split size; also about what MiniLM reads before its 256-token cut
# What is embedded for a piece: the piece itself, then the first CONTEXT_CHARS of the turn before
# it. The context comes second so the model's token cut eats context, never the turn; it lets an
# answer ("Dana, from platform") be found by the question it answers ("who owns MT-4471?").
# Measured (fused, hit@8 long / short queries): piece alone 95 / 89, with context 99 / 97.
CONTEXT_CHARS = 300
FLUSH_TEXTS = 256  # embed and commit after this many new pieces: bounded memory, steady progress

# Fusion. Ranks, not scores, are fused (BM25 and cosine live on different scales); RRF_K = 60 is
# the usual constant. Measured on benchmark/history.py (1,000 conversations, 100 questions asked
# long and short, hit@3 / hit@8): BM25 alone 95-93 / 100-100, dense alone 52-43 / 67-55, equal
# weights 91-89 / 95-94, these weights 97-97 / 99-99. At half weight a passage only the model
# finds cannot push out a lexical hit; the model reorders the lexical pool and lifts what both
# legs found.
RRF_K = 60
LEXICAL_WEIGHT = 1.0
DENSE_WEIGHT = 0.5
# bm25 weight of the identifier column: an exact id (mt4471) is the strongest evidence there is
# (weight 1 / 4 / 8: short queries hit@3 91 / 95 / 97).
IDS_COLUMN_WEIGHT = 8.0
# With recency on, a hit's score is scaled between RECENCY_FLOOR (very old) and 1 (newest), so
# recency reorders comparable hits without burying a strong old one under a weak new one.
RECENCY_FLOOR = 0.5
MAX_QUERY_TERMS = 32
LEXICAL_POOL = 6  # x candidates: the BM25 rows re-ordered by query coverage
ID_COVERAGE = 4
COMMON_SHARE, COMMON_MIN = 0.02, 200  # a word in more passages than this is "common"

# Output.
NEIGHBOUR_MIN = 160  # chars a neighbour keeps before the passage itself is shortened
ELLIPSIS = "…"

WORD = re.compile(r"\w+")
# An identifier: letters and digits joined by -_./#: as in MT-4471, N-11, F-204, v2.3.1.
# Linear on any text: a match may only start where a run of letters and digits starts (the
# lookbehind), and runs are taken whole (possessive), so a long run without a separator (a hex or
# base64 blob) is read once, not once per starting position (that was quadratic: 70 ms for 1,200
# chars). Separators are never letters or digits, so the matches are the same as without both.
IDENTIFIER = re.compile(r"(?<![^\W_])[^\W_]++(?:[-_./#:][^\W_]++)+")
# Longer than this is a blob (a hash, a key, a path), not something one searches for by name.
MAX_IDENTIFIER_CHARS = 64
NON_WORD = re.compile(r"[\W_]+")
STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a about after again all also am an and any are as at be because been before being both "
        "but by can could did do does doing for from had has have having he her here him his how "
        "i if in into is it its just me more most my no nor not of off on once only or other our "
        "out over own same she should so some such than that the their them then there these they "
        "this those through to too under until up very was we were what when where which while "
        "who whom whose why will with would you your",
    )
)

SCHEMA_SQL = """
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
    UNIQUE (conv, chunk)             -- per file: two files claiming one session cannot collide
);
CREATE INDEX IF NOT EXISTS chunks_by_turn ON chunks (conv, seq);  -- neighbours
CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5 (
    text, ids, content='chunks', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS chunks_ins AFTER INSERT ON chunks BEGIN
    INSERT INTO fts (rowid, text, ids) VALUES (new.id, new.text, new.ids);
END;
CREATE TRIGGER IF NOT EXISTS chunks_del AFTER DELETE ON chunks BEGIN
    INSERT INTO fts (fts, rowid, text, ids) VALUES ('delete', old.id, old.text, old.ids);
END;
"""


def db_path(home: Path) -> Path:
    return home / DB_DIR / DB_NAME


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


class _RunStop:
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


# ---------------------------------------------------------------------------------------------
# Text: pieces, identifiers, the FTS query


def split_text(text: str, size: int = PIECE_CHARS) -> list[str]:
    """Pieces of about ``size`` chars, cut at a paragraph, line, sentence or word where possible."""
    text = text.strip()
    pieces: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            window = text[start + size // 2 : end]  # never cut shorter than half a piece
            for sep in ("\n\n", "\n", ". ", " "):
                cut = window.rfind(sep)
                if cut != -1:
                    end = start + size // 2 + cut + len(sep)
                    break
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        start = end
    return pieces


def identifiers(text: str) -> list[str]:
    """The identifiers in ``text`` as written, in order, up to MAX_IDENTIFIER_CHARS each."""
    return [
        token
        for token in (match.group(0) for match in IDENTIFIER.finditer(text))
        if len(token) <= MAX_IDENTIFIER_CHARS
    ]


def identifier_forms(text: str) -> list[str]:
    """``MT-4471`` -> ``mt4471``: one term for the whole id (unicode61 sees ``mt`` + ``4471``)."""
    forms = []
    for token in identifiers(text):
        if any(c.isdigit() for c in token) and any(c.isalpha() for c in token):
            forms.append(NON_WORD.sub("", token.lower()))
    return forms


def query_terms(query: str) -> list[str]:
    """The words worth searching for, then the joined forms of the identifiers in the query.

    Stopwords are dropped unless nothing else is left: they match nearly every row, which costs
    time and adds noise.
    """
    words = WORD.findall(query.lower())
    # One-letter parts of ids (the "v" of V-1415, which "v1415" matches exactly) match thousands
    # of rows and cost a third of the search time; a one-letter word on its own stays.
    id_letters = {p for token in identifiers(query.lower()) for p in WORD.findall(token)}
    terms = [w for w in words if w not in STOPWORDS and not (len(w) == 1 and w in id_letters)]
    terms = terms or words
    terms += identifier_forms(query)
    return list(dict.fromkeys(terms))[:MAX_QUERY_TERMS]


def fts_query(terms: list[str]) -> str:
    """An OR of quoted terms: no FTS syntax (quotes, NEAR, *, :, -, AND) survives.

    Every term is a run of word characters wrapped in double quotes, so FTS5 reads it as a plain
    string (tokenised and stemmed like the indexed text).
    """
    return " OR ".join(f'"{t}"' for t in terms)


def is_common(word: str, common_stems: frozenset[str]) -> bool:
    """Whether a query word is one of the index's common words. The index holds porter stems
    ("valv" for "valves"), so the word itself or the word less a suffix of up to 3 letters."""
    return any(word[:n] in common_stems for n in range(max(len(word) - 3, 3), len(word) + 1))


def coverage(terms: list[str], text: str) -> int:
    """How much of the query a passage contains (a word counts by its stem-ish prefix; a whole
    identifier counts as ID_COVERAGE words, so the id always outweighs a few shared words).

    BM25 sums evidence per term, so a short passage with the id alone can beat the one passage
    that has the id *and* the rest of the question ("line L-382 impeller QC"): among lexical
    candidates, the one covering more of the query ranks first.
    """
    words = set(WORD.findall(text.lower()))
    ids = set(identifier_forms(text))
    return sum(
        ID_COVERAGE if t in ids else 1
        for t in terms
        if t in ids or t in words or any(w.startswith(t[: max(4, len(t) - 2)]) for w in words)
    )


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# Index: sources -> rows


@dataclass
class _Row:
    chunk: str
    conv: str
    turn: str
    seq: int
    block: int
    split: int
    ts: str
    role: str
    text: str
    embed_text: str
    vec: bytes | None = None  # reused from the db when the embedded text is unchanged

    @property
    def digest(self) -> str:
        return _digest(self.embed_text)


@dataclass
class _FileWork:
    """What one changed source file needs: rows to drop, rows to write, its new stamp."""

    conv: str
    stamp: str
    drop: list[int] = field(default_factory=list)
    write: list[_Row] = field(default_factory=list)


def _rows_of(conv: str, turns: list[dict[str, Any]]) -> list[_Row]:
    """The pieces of one conversation, in order; raises KeyError/TypeError on a malformed turn."""
    rows: list[_Row] = []
    previous = ""
    for turn in turns:
        session, turn_id = str(turn["session_id"]), str(turn["turn_uuid"])
        seq, ts, role = int(turn["seq"]), str(turn["ts"]), str(turn["role"])
        _epoch(ts)  # a bad timestamp fails the file here, not the search later
        texts = []
        for block_idx, block in enumerate(turn["blocks"]):
            text = block.get("text")
            if not isinstance(text, str) or not text.strip():
                continue
            texts.append(text)
            for split_idx, piece in enumerate(split_text(text)):
                key = f"{session}:{turn_id}:{block_idx}:{split_idx}"
                embed = f"{piece}\n{previous}" if previous else piece
                rows.append(
                    _Row(
                        chunk=hashlib.sha1(key.encode("utf-8")).hexdigest()[:16],
                        conv=conv,
                        turn=turn_id,
                        seq=seq,
                        block=block_idx,
                        split=split_idx,
                        ts=ts,
                        role=role,
                        text=piece,
                        embed_text=embed,
                    )
                )
        if texts:
            previous = " ".join(" ".join(texts).split())[:CONTEXT_CHARS]
    return rows


def _stamp(path: Path) -> str:
    # os.replace gives every post a new inode, so this changes whenever the file is rewritten.
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _connect(path: Path, *, create: bool) -> sqlite3.Connection:
    # Autocommit mode with explicit BEGIN: every transaction is visible in the code. Recall opens
    # with mode=rw so that it never creates an empty db where an index run just moved one aside.
    uri = f"file:{urllib.parse.quote(str(path))}?mode={'rwc' if create else 'rw'}"
    # check_same_thread=False: recall hands its connection to a worker for the BM25 leg.
    con = sqlite3.connect(
        uri, uri=True, timeout=10.0, isolation_level=None, check_same_thread=False
    )
    con.execute("PRAGMA busy_timeout = 10000")
    return con


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    """Not a database, or a malformed one; a locked or busy db is not corrupt."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
    return not isinstance(exc, sqlite3.OperationalError)


def _discard(path: Path) -> None:
    """Move a bad db aside (one copy kept for a post-mortem) with its WAL files."""
    if path.exists():
        path.replace(path.with_name(path.name + ".corrupt"))
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# Recall: the cached matrix, fusion, rendering


@dataclass(frozen=True)
class _Vectors:
    """One user's vectors as a matrix, valid for one db generation."""

    generation: str
    ids: np.ndarray  # int64 chunk rowids, row i of the matrix is ids[i]
    matrix: np.ndarray  # float32, n x dim, unit rows
    newest: float  # epoch of the newest turn: recency is relative to the user's own history
    common: frozenset[str]  # stems found in more than COMMON_SHARE of the passages

    @property
    def nbytes(self) -> int:
        """What the cache counts against its budget: the arrays (the common stems are small)."""
        return self.ids.nbytes + self.matrix.nbytes


@dataclass
class _Load:
    """One user's matrix being loaded; recalls that miss the cache meanwhile wait for it."""

    done: threading.Event = field(default_factory=threading.Event)
    vectors: _Vectors | None = None  # set when the load succeeded


@dataclass
class _Hit:
    id: int
    conv: str
    seq: int
    ts: str
    epoch: float
    role: str
    text: str
    score: float


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return ""
    cut = text[: limit - len(ELLIPSIS)]
    space = cut.rfind(" ")
    if space > limit * 0.6:  # end at a word when that loses little
        cut = cut[:space]
    return cut.rstrip() + ELLIPSIS


def focus_terms(query: str) -> list[str]:
    """What to keep in view when a passage must be cut: identifiers first, then other words."""
    ids = [token.lower() for token in identifiers(query)]
    words = [w for w in WORD.findall(query.lower()) if w not in STOPWORDS and len(w) > 2]
    return ids + words


def _excerpt(text: str, terms: list[str], limit: int) -> str:
    """``text`` cut to ``limit`` chars, around the first query term when the start lacks it."""
    if len(text) <= limit:
        return text
    lower = text.lower()
    for term in terms:
        at = lower.find(term)
        if at == -1:
            continue
        if at + len(term) <= limit * 0.75:
            break  # already near the start: a plain cut keeps it
        start = text.find(" ", max(at - limit // 4, 0), at)  # begin at a word
        start = at if start == -1 else start + 1
        return ELLIPSIS + _shorten(text[start:], limit - len(ELLIPSIS))
    return _shorten(text, limit)


def _render_hit(hit: _Hit, neighbours: list[tuple[str, str]], terms: list[str], budget: int) -> str:
    """One hit as a block of at most ``budget`` chars; "" when not even a useful line fits."""
    when = datetime.fromisoformat(hit.ts.replace("Z", "+00:00")).astimezone(UTC)
    header = f"[{when:%Y-%m-%d %H:%M} UTC] {hit.role}\n"
    footer = "---\n"
    room = budget - len(header) - len(footer)
    if room < 40:
        return ""
    # The passage comes first; neighbours keep a little room (whole when short) unless the
    # passage alone would not fit.
    reserve = sum(min(len(lbl) + len(txt), len(lbl) + NEIGHBOUR_MIN) + 1 for lbl, txt in neighbours)
    limit = max(room - reserve, min(room, 200)) - 1
    passage = _excerpt(hit.text.strip(), terms, limit) + "\n"
    room -= len(passage)
    # Share what is left between the neighbours, shortest first so a short one leaves its
    # unused share to the other.
    lines: dict[int, str] = {}
    order = sorted(range(len(neighbours)), key=lambda i: len(neighbours[i][1]))
    for n, i in enumerate(order):
        label, text = neighbours[i]
        share = room // (len(order) - n) - len(label) - 1
        if share < 20:
            continue
        line = label + _shorten(text, share) + "\n"
        lines[i] = line
        room -= len(line)
    return header + passage + "".join(lines[i] for i in sorted(lines)) + footer


def render(hits: list[tuple[_Hit, list[tuple[str, str]]]], query: str, max_chars: int) -> str:
    """The hits in order, each given a fair share of what the ones before it left."""
    terms = focus_terms(query)
    out: list[str] = []
    remaining = max_chars
    for n, (hit, neighbours) in enumerate(hits):
        block = _render_hit(hit, neighbours, terms, remaining // (len(hits) - n))
        out.append(block)
        remaining -= len(block)
    return "".join(out)[:max_chars]


# ---------------------------------------------------------------------------------------------
# The engine


class EmbeddedEngine:
    """Hybrid BM25 + dense recall over one user's sources, stored in ``home/embedded``."""

    name = "embedded"

    def __init__(
        self,
        embedder: Embedder,
        *,
        k: int = 3,
        candidates: int = 8,
        max_chars: int = 4000,
        half_life_days: float = 0.0,
        cache_bytes: int = 256 * 2**20,
        index_timeout: float = 300.0,
        index_concurrency: int = 2,
        recall_concurrency: int = 4,
    ) -> None:
        self.embedder = embedder
        self.k = k
        self.candidates = max(candidates, k)
        self.max_chars = max_chars
        self.half_life_days = half_life_days
        # The matrices of recent users, least recently used first, at most cache_bytes in all.
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, _Vectors] = OrderedDict()
        self._cached_bytes = 0
        self._loads: dict[str, _Load] = {}  # db path -> the load in progress (one per user)
        self._cache_lock = threading.Lock()  # guards the three above
        self.index_timeout = index_timeout
        # Own bounded pools, never asyncio's shared default one (see recall/concurrency.py).
        self._index_pool = ThreadPoolExecutor(index_concurrency, thread_name_prefix="recall-index")
        self._recall_pool = ThreadPoolExecutor(recall_concurrency, thread_name_prefix="recall")
        # One BM25 leg at a time per recall thread.
        self._pool = ThreadPoolExecutor(recall_concurrency, thread_name_prefix="recall-bm25")

    # -- the Engine protocol -------------------------------------------------------------------

    def has_memory(self, home: Path) -> bool:
        # The header, not just the file: a db overwritten with garbage counts as no index, so
        # the server rebuilds it rather than failing every recall until the user posts again.
        try:
            with open(db_path(home), "rb") as handle:
                return handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER
        except OSError:
            return False

    async def index(self, home: Path) -> None:
        stop = _RunStop(self.index_timeout)
        await run_in(self._index_pool, self._index, home, stop, on_cancel=stop.cancelled.set)

    async def recall(self, home: Path, query: str) -> str:
        if not query.strip():
            return ""
        return await run_in(self._recall_pool, self._recall, home, query)

    # -- index ----------------------------------------------------------------------------------

    def _index(self, home: Path, stop: _RunStop) -> None:
        stop.begin()
        path = db_path(home)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._reconcile(home, path, stop)
            except sqlite3.DatabaseError as exc:
                if not _is_corrupt(exc):
                    raise
                log.warning("embedded index of %s unreadable (%s); rebuilding", home.name, exc)
                _discard(path)
                self._reconcile(home, path, stop)
        except sqlite3.Error as exc:
            raise EngineError(f"embedded index run failed: {exc}") from exc
        except OSError as exc:
            raise EngineError(f"embedded index run failed: {exc.strerror or exc}") from exc
        finally:
            release_freed_memory()

    def _reconcile(self, home: Path, path: Path, stop: _RunStop) -> None:
        con = _connect(path, create=True)
        try:
            con.execute("PRAGMA journal_mode = WAL")
            con.executescript(SCHEMA_SQL)
            schema = con.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if schema is None:
                con.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA,))
            elif schema[0] != SCHEMA:
                # An older layout or embedded text: start over (the sources are the truth).
                raise sqlite3.DatabaseError("index schema changed")
            known = dict(con.execute("SELECT conv, stamp FROM files").fetchall())
            sources = {p.name[: -len(SOURCE_SUFFIX)]: p for p in source_files(home)}

            gone = sorted(known.keys() - sources.keys())
            if gone:
                con.execute("BEGIN IMMEDIATE")
                for conv in gone:
                    con.execute("DELETE FROM chunks WHERE conv = ?", (conv,))
                    con.execute("DELETE FROM files WHERE conv = ?", (conv,))
                self._bump(con)
                con.execute("COMMIT")

            pending: list[_FileWork] = []
            to_embed = 0
            for conv, source in sources.items():
                work = self._plan(con, conv, source, known.get(conv))
                if work is None:
                    continue
                pending.append(work)
                to_embed += sum(1 for row in work.write if row.vec is None)
                if to_embed >= FLUSH_TEXTS or len(pending) >= FLUSH_TEXTS:
                    stop.check()
                    self._flush(con, pending)
                    pending, to_embed = [], 0
            if pending:
                stop.check()
                self._flush(con, pending)
        finally:
            con.close()

    def _plan(
        self, con: sqlite3.Connection, conv: str, source: Path, known_stamp: str | None
    ) -> _FileWork | None:
        """What a source file needs, or None when it is unchanged or unreadable."""
        try:
            stamp = _stamp(source)
            if stamp == known_stamp:
                return None
            wanted = _rows_of(conv, read_source(source))
        except FileNotFoundError:
            return None  # deleted since the listing: the next run removes its rows
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # The file name is a conversation id, never user text; the exception may hold text.
            log.warning("skipping unreadable source %s (%s)", source.name, type(exc).__name__)
            return None
        have = {
            chunk: (rowid, seq, ts, role, text, digest, vec)
            for rowid, chunk, seq, ts, role, text, digest, vec in con.execute(
                "SELECT id, chunk, seq, ts, role, text, digest, vec FROM chunks WHERE conv = ?",
                (conv,),
            )
        }
        work = _FileWork(conv, stamp)
        for row in wanted:
            old = have.pop(row.chunk, None)
            if old is not None:
                rowid, *stored, vec = old
                if tuple(stored) == (row.seq, row.ts, row.role, row.text, row.digest):
                    continue  # unchanged
                digest = stored[-1]
                work.drop.append(rowid)
                if digest == row.digest:
                    row.vec = vec  # same embedded text: keep its vector
            work.write.append(row)
        work.drop.extend(rowid for rowid, *_ in have.values())  # turns the file no longer has
        return work

    def _flush(self, con: sqlite3.Connection, pending: list[_FileWork]) -> None:
        """Embed what the pending files need (batched), then write them in one transaction."""
        todo = [r for w in pending for r in w.write if r.vec is None]
        if todo:
            vectors = self.embedder.embed([r.embed_text for r in todo])
            for row, vec in zip(todo, vectors, strict=True):
                row.vec = np.asarray(vec, dtype=np.float32).tobytes()
        con.execute("BEGIN IMMEDIATE")
        try:
            for work in pending:
                con.executemany("DELETE FROM chunks WHERE id = ?", [(i,) for i in work.drop])
                con.executemany(
                    "INSERT INTO chunks (chunk, conv, turn, seq, block, split, ts, epoch, role,"
                    " text, ids, digest, vec) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            r.chunk, r.conv, r.turn, r.seq, r.block, r.split, r.ts, _epoch(r.ts),
                            r.role, r.text, " ".join(identifier_forms(r.text)), r.digest, r.vec,
                        )
                        for r in work.write
                    ],
                )  # fmt: skip
                con.execute("INSERT OR REPLACE INTO files VALUES (?, ?)", (work.conv, work.stamp))
            self._bump(con)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    @staticmethod
    def _bump(con: sqlite3.Connection) -> None:
        # A random generation, not a counter: a rebuilt db must never reuse a cached one's value.
        con.execute("INSERT OR REPLACE INTO meta VALUES ('generation', ?)", (uuid.uuid4().hex,))

    # -- recall ---------------------------------------------------------------------------------

    def _recall(self, home: Path, query: str) -> str:
        path = db_path(home)
        if not path.is_file():
            return ""
        try:
            con = _connect(path, create=False)
            try:
                con.execute("BEGIN")  # one snapshot for the matrix, the FTS and the rows
                hits = self._search(con, str(path), query)
                with_neighbours = [(hit, self._neighbours(con, hit)) for hit in hits]
                con.execute("COMMIT")
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise EngineError(f"embedded index unreadable: {type(exc).__name__}") from exc
        return render(with_neighbours, query, self.max_chars)

    def _search(self, con: sqlite3.Connection, key: str, query: str) -> list[_Hit]:
        vectors = self._vectors(con, key)
        fused: dict[int, float] = {}
        # BM25 runs on a worker thread while this one embeds the query: the two take about as
        # long, and SQLite and onnxruntime both release the GIL. The connection is used by one
        # thread at a time (this one waits for the result before touching it again).
        terms = query_terms(query)
        future = self._pool.submit(self._bm25, con, terms, vectors.common) if terms else None
        try:
            qvec = self.embedder.embed([query])[0]
        finally:
            if future is not None:
                wait([future])  # the connection must be idle before it is used or closed
        lexical = future.result() if future is not None else []

        if len(vectors.ids):
            scores = vectors.matrix @ qvec
            n = min(self.candidates, len(scores))
            top = np.argpartition(-scores, n - 1)[:n]
            for rank, i in enumerate(top[np.argsort(-scores[top])]):
                rowid = int(vectors.ids[i])
                fused[rowid] = fused.get(rowid, 0.0) + DENSE_WEIGHT / (RRF_K + rank + 1)

        for rank, rowid in enumerate(lexical):
            fused[rowid] = fused.get(rowid, 0.0) + LEXICAL_WEIGHT / (RRF_K + rank + 1)

        if not fused:
            return []
        marks = ",".join("?" * len(fused))
        hits = [
            _Hit(rowid, conv, seq, ts, epoch, role, text, fused[rowid])
            for rowid, conv, seq, ts, epoch, role, text in con.execute(
                f"SELECT id, conv, seq, ts, epoch, role, text FROM chunks WHERE id IN ({marks})",
                list(fused),
            )
        ]
        if self.half_life_days > 0:
            for hit in hits:
                age_days = max(vectors.newest - hit.epoch, 0.0) / 86_400
                decay = 0.5 ** (age_days / self.half_life_days)
                hit.score *= RECENCY_FLOOR + (1 - RECENCY_FLOOR) * decay
        hits.sort(key=lambda h: (-h.score, h.id))
        return hits[: self.k]

    def _bm25(self, con: sqlite3.Connection, terms: list[str], common: frozenset[str]) -> list[int]:
        # Common words ("line", "valves") add almost nothing to BM25 but make FTS5 score much
        # of the table: they count toward coverage only.
        searched = [t for t in terms if not is_common(t, common)] or terms
        # A wider BM25 pool, re-ordered by how much of the query each passage covers.
        rows = con.execute(
            "SELECT rowid, text FROM fts WHERE fts MATCH ? ORDER BY bm25(fts, 1.0, ?) LIMIT ?",
            (fts_query(searched), IDS_COLUMN_WEIGHT, self.candidates * LEXICAL_POOL),
        ).fetchall()
        ranked = sorted(enumerate(rows), key=lambda r: (-coverage(terms, r[1][1]), r[0]))
        return [rowid for _, (rowid, _) in ranked[: self.candidates]]

    def _neighbours(self, con: sqlite3.Connection, hit: _Hit) -> list[tuple[str, str]]:
        """The turns just before and after the hit's, each as (label, one-line text)."""
        parts: dict[int, tuple[str, list[str]]] = {}
        for seq, role, text in con.execute(
            "SELECT seq, role, text FROM chunks WHERE conv = ? AND seq IN (?, ?)"
            " ORDER BY seq, block, split",
            (hit.conv, hit.seq - 1, hit.seq + 1),
        ):
            parts.setdefault(seq, (role, []))[1].append(text)
        out = []
        for seq, where in ((hit.seq - 1, "before"), (hit.seq + 1, "after")):
            if seq in parts:
                role, texts = parts[seq]
                out.append((f"  ~ {where} ({role}): ", " ".join(" ".join(texts).split())))
        return out

    def _vectors(self, con: sqlite3.Connection, key: str) -> _Vectors:
        """The user's matrix from the cache, reloaded when an index run changed the db.

        Single flight: recalls that miss for the same user wait for one load instead of each
        building the full matrix; different users load in parallel.
        """
        row = con.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
        generation = row[0] if row else ""
        while True:
            with self._cache_lock:
                cached = self._cache.get(key)
                if cached is not None and cached.generation == generation:
                    self._cache.move_to_end(key)
                    return cached
                load = self._loads.get(key)
                if load is None:
                    load = self._loads[key] = _Load()
                    break  # this recall loads
            load.done.wait()
            # The load may have read another generation (an index run committed in between),
            # failed, or been too large to cache: then check the cache again or load ourselves.
            if load.vectors is not None and load.vectors.generation == generation:
                return load.vectors
        try:
            load.vectors = self._load_vectors(con, generation)
        finally:
            with self._cache_lock:
                del self._loads[key]
                if load.vectors is not None:
                    self._keep(key, load.vectors)
                cached_bytes = self._cached_bytes
            load.done.set()
        vectors = load.vectors
        # The db path names the user's directory, a hash; never the user id.
        log.debug(
            "vectors of %s: %d rows, %.1f MB (cache %.1f of %.1f MB)",
            Path(key).parent.parent.name,
            len(vectors.ids),
            vectors.nbytes / 2**20,
            cached_bytes / 2**20,
            self.cache_bytes / 2**20,
        )
        return vectors

    @property
    def cached_bytes(self) -> int:
        """What the cached matrices hold now (at most cache_bytes)."""
        with self._cache_lock:
            return self._cached_bytes

    def _keep(self, key: str, vectors: _Vectors) -> None:
        """Cache a matrix, evicting the least recently used until the cache fits its budget.

        A matrix larger than the whole budget is not cached: it serves the recall (and any that
        waited for it) and is then freed, so the budget holds even for one huge user, who pays a
        reload per recall. Called with the cache lock held.
        """
        old = self._cache.pop(key, None)
        if old is not None:
            self._cached_bytes -= old.nbytes
        if vectors.nbytes > self.cache_bytes:
            return
        self._cache[key] = vectors
        self._cached_bytes += vectors.nbytes
        while self._cached_bytes > self.cache_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= evicted.nbytes

    def _load_vectors(self, con: sqlite3.Connection, generation: str) -> _Vectors:
        """Build the user's matrix (and common stems) from the db, in the caller's snapshot."""
        count = con.execute("SELECT count(*) FROM chunks").fetchone()[0]
        ids = np.empty(count, dtype=np.int64)
        matrix = np.empty((count, self.embedder.dim), dtype=np.float32)
        newest = 0.0
        # Filled row by row, so loading never holds the blobs and the matrix twice.
        for n, (rowid, epoch, vec) in enumerate(
            con.execute("SELECT id, epoch, vec FROM chunks ORDER BY id")
        ):
            ids[n] = rowid
            matrix[n] = np.frombuffer(vec, dtype=np.float32)
            newest = max(newest, epoch)
        con.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab USING fts5vocab(main, fts, row)")
        floor = max(COMMON_SHARE * count, COMMON_MIN)
        common = frozenset(
            t for (t,) in con.execute("SELECT term FROM vocab WHERE doc > ?", (floor,))
        )
        return _Vectors(generation, ids, matrix, newest, common)
