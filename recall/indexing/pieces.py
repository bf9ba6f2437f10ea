"""What both stores index of a conversation, and how they tell what changed: its pieces (rows),
what an index already holds of them (`Stored`), the rows a run drops and writes, the turns
around a hit. Pure: the embedded engine keeps the rows in SQLite (recall/files/engines/embedded/
store.py), the PostgreSQL store in its tables (recall/pg/index.py); both build the same rows.

    turns -> pieces of ~1,200 chars -> embed what is new -> the store's index

Rows are keyed like funes' chunks, sha1("session:turn:block:split"), and carry a hash of the
text that was embedded, so an index run embeds only new or changed text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np

from recall.domain.conversation import is_recalled
from recall.embedder import Embedder
from recall.ranking.text import identifier_forms

# Bump when the rows or the embedded text change (or the embedded engine's table layout): every
# index built otherwise is then rebuilt, the SQLite file and the PostgreSQL users' chunks alike.
SCHEMA = "3"

PIECE_CHARS = 1_200  # funes' split size; also about what MiniLM reads before its 256-token cut
# What is embedded for a piece: the piece itself, then the first CONTEXT_CHARS of the turn before
# it. The context comes second so the model's token cut eats context, never the turn; it lets an
# answer ("Dana, from platform") be found by the question it answers ("who owns MT-4471?").
# Measured: see benchmark/README.md, "What moved the numbers".
CONTEXT_CHARS = 300
FLUSH_TEXTS = 256  # embed and commit after this many new pieces: bounded memory, steady progress
# FTS5's tokenizer for the text and ids columns; the PostgreSQL store stems with it too
# (recall/pg/fts.py), so both rank the same terms. The text column holds text.fts_text of each
# piece (CJK bigrams, other languages unstemmed), through the SQL function of that name that
# connect() registers: the table's content stays the piece as stored.
FTS_TOKENIZER = "porter unicode61"


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


def epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def text_digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


@dataclass
class Row:
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
    recalled: bool = False  # an answer built with recall: a neighbour, never a hit
    vec: Any = None  # as the store keeps it; reused when the embedded text is unchanged

    @property
    def digest(self) -> str:
        return text_digest(self.embed_text)

    @property
    def ids(self) -> str:
        """The stored `ids` column: the piece's identifier forms, space-separated."""
        return " ".join(identifier_forms(self.text))

    @property
    def epoch(self) -> float:
        return epoch(self.ts)


class Stored(NamedTuple):
    """What an index holds of a piece already: enough to tell whether it changed."""

    id: int
    seq: int
    ts: str
    role: str
    text: str
    recalled: bool
    digest: str
    vec: Any


def changed_rows(wanted: list[Row], have: dict[str, Stored]) -> tuple[list[int], list[Row]]:
    """What one conversation needs: the ids of stored rows to drop and the rows to write.
    ``have`` maps chunk keys to what is stored (it is emptied). A changed row is dropped and
    written again, keeping its vector when the embedded text is the same."""
    drop: list[int] = []
    write: list[Row] = []
    for row in wanted:
        old = have.pop(row.chunk, None)
        if old is not None:
            if (old.seq, old.ts, old.role, old.text, old.recalled, old.digest) == (
                row.seq, row.ts, row.role, row.text, row.recalled, row.digest,
            ):  # fmt: skip
                continue  # unchanged
            drop.append(old.id)
            if old.digest == row.digest:
                row.vec = old.vec  # same embedded text: keep its vector
        write.append(row)
    drop.extend(old.id for old in have.values())  # turns the conversation no longer has
    return drop, write


def batch_full(works: int, texts: int) -> bool:
    """Whether pending work is one flush's worth: FLUSH_TEXTS pieces to embed, or conversations."""
    return texts >= FLUSH_TEXTS or works >= FLUSH_TEXTS


def embed_missing(rows: list[Row], embedder: Embedder, keep: Callable[[np.ndarray], Any]) -> None:
    """Embed (batched) the rows that have no vector yet; ``keep`` turns a float32 unit vector
    into the store's form of it."""
    todo = [r for r in rows if r.vec is None]
    if todo:
        vectors = embedder.embed([r.embed_text for r in todo])
        for row, vec in zip(todo, vectors, strict=True):
            row.vec = keep(np.asarray(vec, dtype=np.float32))


def rows_of(conv: str, turns: list[dict[str, Any]]) -> list[Row]:
    """The pieces of one conversation, in order; raises KeyError/TypeError on a malformed turn."""
    rows: list[Row] = []
    previous = ""
    for turn in turns:
        session, turn_id = str(turn["session_id"]), str(turn["turn_uuid"])
        seq, ts, role = int(turn["seq"]), str(turn["ts"]), str(turn["role"])
        epoch(ts)  # a bad timestamp fails the file here, not the search later
        recalled = is_recalled(turn)
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
                    Row(
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
                        recalled=recalled,
                    )
                )
        if texts and not recalled:  # a recalled answer is no context for the next turn either
            previous = " ".join(" ".join(texts).split())[:CONTEXT_CHARS]
    return rows


def built_by(embedder: Embedder) -> dict[str, str]:
    """What a db records of how it was built; a db built otherwise is rebuilt. Vectors of two
    models (or of one model run two ways) must never be compared with each other."""
    return {"schema": SCHEMA, "embedder": embedder.fingerprint}
