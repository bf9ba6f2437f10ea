"""SQLite FTS5's tokenizer as a library, so PostgreSQL's postings hold the very terms the embedded
engine's FTS5 index holds (porter stems of unicode61 tokens) and BM25 ranks the same terms.

Pieces are tokenised as the embedded engine's table indexes them: text.fts_text of the text (CJK
bigrams, other languages unstemmed), the ids as they are; a query term by each of its
text.fts_forms.

Each call fills a fresh in-memory fts5 table (the embedded engine's columns and tokenizer) and
reads it back through `fts5vocab(..., 'instance')`: one row per token, with its column and
offset. Nothing is stored; the table is gone when the call returns.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass

from recall.indexing.pieces import FTS_TOKENIZER
from recall.ranking.text import fts_forms, fts_text

TEXT, IDS = "text", "ids"  # the columns, as fts5vocab names them


@dataclass(frozen=True)
class Counted:
    """One piece's terms: each stem's count in the text and in the ids column, and its length."""

    tf: dict[str, tuple[int, int]]  # stem -> (count in text, count in ids)
    tokens: int  # tokens in both columns: BM25's document length, as FTS5 counts it


def _instances(
    pieces: Sequence[tuple[str, str]],
    *,
    indexed: bool = True,
    terms: Sequence[str] | None = None,
) -> list[tuple[int, str, str, int]]:
    """(piece index, stem, column, offset) of every token of ``pieces`` (text, ids); with
    ``indexed``, of the text as the index holds it (fts_text); with ``terms``, of those stems
    only (read back in C: the rest never becomes a Python row)."""
    if indexed:
        pieces = [(fts_text(text), ids) for text, ids in pieces]
    with closing(sqlite3.connect(":memory:")) as con:
        con.execute(f"CREATE VIRTUAL TABLE t USING fts5 (text, ids, tokenize='{FTS_TOKENIZER}')")
        con.execute("CREATE VIRTUAL TABLE v USING fts5vocab (t, 'instance')")
        con.executemany(
            "INSERT INTO t (rowid, text, ids) VALUES (?, ?, ?)",
            [(n, text, ids) for n, (text, ids) in enumerate(pieces)],
        )
        read = 'SELECT doc, term, col, "offset" FROM v'
        if terms is None:
            return con.execute(read).fetchall()
        return con.execute(f"{read} WHERE term IN ({','.join('?' * len(terms))})", terms).fetchall()


def count_terms(pieces: Sequence[tuple[str, str]]) -> list[Counted]:
    """The terms of each piece (text, ids), in order."""
    counts: list[Counter[tuple[str, str]]] = [Counter() for _ in pieces]
    for n, term, column, _ in _instances(pieces):
        counts[n][term, column] += 1
    counted = []
    for found in counts:
        tf: dict[str, tuple[int, int]] = {}
        for (term, column), count in sorted(found.items()):
            text, ids = tf.get(term, (0, 0))
            tf[term] = (text + count, ids) if column == TEXT else (text, ids + count)
        counted.append(Counted(tf, sum(found.values())))
    return counted


def phrase_stems(terms: Sequence[str]) -> list[list[list[str]]]:
    """The phrases each query term is searched by, one per fts_forms form, each its stems in
    order: what FTS5 makes of `"form"` (most are one stem; "user_id" is the phrase "user" "id";
    "_" none)."""
    forms = [(n, form) for n, term in enumerate(terms) for form in fts_forms(term)]
    stems: list[list[str]] = [[] for _ in forms]
    instances = _instances([(form, "") for _, form in forms], indexed=False)
    for n, term, _, _ in sorted(instances, key=_by_place):
        stems[n].append(term)
    phrases: list[list[list[str]]] = [[] for _ in terms]
    for (n, _), phrase in zip(forms, stems, strict=True):
        phrases[n].append(phrase)
    return phrases


def phrase_counts(
    phrases: Sequence[Sequence[str]], pieces: Sequence[tuple[str, str]]
) -> list[list[tuple[int, int]]]:
    """How often each of ``phrases`` (stems) occurs in each piece's text and ids: consecutive
    tokens in one column, as FTS5 matches a quoted phrase. ``[phrase][piece]``. The pieces are
    tokenised once for all the phrases, and only the phrases' stems are read back."""
    stems = sorted({stem for phrase in phrases for stem in phrase})
    columns: dict[tuple[int, str], dict[str, set[int]]] = {}  # (piece, column): stem -> offsets
    for n, term, column, offset in _instances(pieces, terms=stems):
        columns.setdefault((n, column), {}).setdefault(term, set()).add(offset)
    found = [[[0, 0] for _ in pieces] for _ in phrases]
    for (n, column), at in columns.items():
        side = 0 if column == TEXT else 1
        for counted, phrase in zip(found, phrases, strict=True):
            if all(stem in at for stem in phrase):
                starts = set(at[phrase[0]])  # where stem i sits i tokens after the start
                for i, stem in enumerate(phrase[1:], 1):
                    starts &= {offset - i for offset in at[stem]}
                counted[n][side] += len(starts)
    return [[(text, ids) for text, ids in counted] for counted in found]


def _by_place(instance: tuple[int, str, str, int]) -> tuple[int, int]:
    n, _, _, offset = instance
    return n, offset
