"""Ranking rules of the embedded engine that the benchmarks measured, each shown on a small real
history (the real model, real SQLite): rarity-weighted coverage, meaning within the lexical pool,
and "nothing relevant"."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from test_embedded_engine import CORPUS, hits, post

from recall.embedder import OnnxEmbedder, load_embedder
from recall.engines.embedded import EmbeddedEngine, Query, db_path
from recall.engines.embedded.search import Lexical, common_floor, order_pool, top_hits
from recall.engines.embedded.store import (
    candidate_rows,
    common_stems,
    connect,
    doc_counts,
    lexical_leg,
)

# A chat between two people: both names in every turn, as a chat log's speaker labels put them.
CHATTER = [
    "Caroline: Melanie, tell me how the class went, I want to hear everything!",
    "Melanie: Caroline, the class was fine, tell you more later.",
    "Caroline: Melanie, did you tell the kids about the class trip?",
    "Melanie: Caroline, I will tell them tonight after their class.",
]


MACHINE_PARTS = ["pump", "valve", "motor", "belt"]


@pytest.fixture(scope="module")
def embedder() -> OnnxEmbedder:
    return load_embedder()


@pytest.fixture(scope="module")
def chat(embedder: OnnxEmbedder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve chats of names and small talk, and one turn about pottery."""
    home = tmp_path_factory.mktemp("chat") / "user"
    for n in range(12):
        turns = [("user" if i % 2 == 0 else "assistant", text) for i, text in enumerate(CHATTER)]
        if n == 7:
            turns.insert(2, ("user", "Caroline: I signed up for a pottery workshop on Saturday."))
        post(home, f"chat-{n:02d}", f"2026-0{1 + n % 9}-0{1 + n % 9}T10:00:00Z", turns)
    asyncio.run(EmbeddedEngine(embedder).index(home))
    return home


@pytest.fixture(scope="module")
def memory(embedder: OnnxEmbedder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("memory") / "user"
    for cid, (start, turns) in CORPUS.items():
        post(home, cid, start, turns)
    asyncio.run(EmbeddedEngine(embedder).index(home))
    return home


def test_a_rare_word_outweighs_names_and_words_every_turn_carries(chat: Path) -> None:
    # Given a history where the names, "tell" and "class" are in nearly every turn
    query = Query.parse("Did Caroline tell Melanie about the pottery class?")
    con = connect(db_path(chat), create=False)
    try:
        passages = con.execute("SELECT count(*) FROM chunks").fetchone()[0]
        counts = doc_counts(con, query.terms)
        common = common_stems(con, common_floor(passages))

        # When the lexical leg ranks its candidates
        pool = lexical_leg(con, query, common, candidates=3, passages=passages)
        best = pool.pool[pool.shares.index(pool.covered)]
        first = con.execute("SELECT text FROM chunks WHERE id = ?", (best,)).fetchone()
    finally:
        con.close()

    # Then the one turn with the rare word comes first, though others share more of the
    # query's words: a word's weight is its rarity in this user's own history
    assert counts["caroline"] > 40 and counts["pottery"] == 1
    assert "pottery" in first[0]


def test_the_lexical_pool_puts_the_closer_meaning_first_among_equal_covers() -> None:
    # Given a pool where rows 1 and 2 cover the same share of the query, row 3 much more
    pool = Lexical(pool=[1, 2, 3], shares=[0.4, 0.4, 0.9], unknown_ids=False)
    ids = np.array([1, 2, 3])
    similarity = np.array([0.2, 0.5, 0.1], dtype=np.float32)

    # When the pool is ordered
    ranked = order_pool(pool, ids, similarity, candidates=3)

    # Then coverage leads, and between equal covers the row closer in meaning comes first
    assert ranked == [3, 2, 1]


async def test_a_question_in_other_words_finds_its_fact_past_small_talk_naming_the_same_place(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given chats that name Ormford in small talk, and one fact about Ormford in other words
    home = tmp_path / "user"
    small_talk = [
        "Morning from Ormford, quiet start today.",
        "The weather looks fine for the Ormford run.",
        "Ormford had a busy weekend, the car park was full.",
        "Lunch at Ormford was late again.",
        "Back from Ormford, a few things to go through.",
        "The coffee machine at Ormford is broken again.",
    ]
    for n, text in enumerate(small_talk):
        post(home, f"talk-{n}", f"2026-03-{10 + n}T09:00:00Z", [("user", text)])
    fact = "Freya tops up the O2 cylinders at Ormford every week."
    post(home, "duty", "2026-03-20T09:00:00Z", [("user", fact)])
    await EmbeddedEngine(embedder).index(home)
    engine = EmbeddedEngine(embedder, k=3, candidates=8)

    # When the question names the duty by other words, and the place
    found = (await engine.recall(home, "Who handles restocking oxygen at Ormford?")).text

    # Then the fact is the first passage, though every small-talk turn covers "Ormford" as well
    assert fact in hits(found)[0]


async def test_an_identifier_asked_alone_comes_first_among_many_alike(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given forty tickets whose ids differ by a digit, in turns the model finds nearly alike
    home = tmp_path / "user"
    for n in range(40):
        ticket = f"KX-{1000 + n}"
        turns = [
            ("user", f"Ticket {ticket}: the {MACHINE_PARTS[n % 4]} on line {n % 5} needs a look."),
            ("assistant", f"Noted, {ticket} is logged."),
        ]
        post(home, f"c{n}", f"2026-03-{1 + n % 28:02d}T09:00:00Z", turns)
    await EmbeddedEngine(embedder).index(home)
    engine = EmbeddedEngine(embedder, k=3, candidates=8)

    # When each id is asked for alone
    firsts = [hits((await engine.recall(home, f"KX-{1000 + n}")).text)[0] for n in range(40)]

    # Then its own ticket comes first every time: similar ids never outvote the exact one
    assert [n for n, first in enumerate(firsts) if f"KX-{1000 + n}" not in first] == []


async def test_a_query_about_something_never_discussed_finds_nothing(
    embedder: OnnxEmbedder, memory: Path
) -> None:
    engine = EmbeddedEngine(embedder, k=3, candidates=8)

    # When the user asks about a topic and an identifier the history never mentions
    unrelated = (
        await engine.recall(memory, "What did the vet say about the parrot's feathers?")
    ).text
    unknown_id = (await engine.recall(memory, "ticket MT-5120 for motor P-7")).text

    # Then nothing comes back (the server answers "Nothing relevant found ...")
    assert unrelated == ""
    assert unknown_id == ""


async def test_related_questions_still_find_their_passages(
    embedder: OnnxEmbedder, memory: Path
) -> None:
    engine = EmbeddedEngine(embedder, k=3, candidates=8)

    # When the question paraphrases, or names a known identifier next to an unknown one
    paraphrase = (await engine.recall(memory, "who looks after the broken cooling upstairs?")).text
    known_id = (await engine.recall(memory, "MT-4471 or MT-9999 owner")).text

    # Then the passages are found
    assert any("Marcus Lee" in block for block in hits(paraphrase))
    assert "Priya Raman" in hits(known_id)[0]


async def test_the_relevance_floor_can_be_turned_off(embedder: OnnxEmbedder, memory: Path) -> None:
    engine = EmbeddedEngine(embedder, k=3, candidates=8, min_similarity=0.0)
    answer = (await engine.recall(memory, "What did the vet say about the parrot's feathers?")).text
    assert len(hits(answer)) == 3


def test_months_named_in_a_query_are_read_with_their_year_and_may_needs_one() -> None:
    assert Query.parse("When did Melanie go camping in June?").months == ((None, 6),)
    assert Query.parse("budget from Jan 2026, or was it February?").months == (
        (2026, 1),
        (None, 2),
    )
    assert Query.parse("in May 2023").months == ((2023, 5),)
    assert Query.parse("may I ask about the marching band?").months == ()


async def test_a_month_named_in_the_query_lifts_that_months_turn_but_filters_nothing(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given the same review in March and in June, March's a little ahead after fusion
    home = tmp_path / "user"
    note = "The quarterly budget review moved the hiring plan to the next quarter."
    post(home, "review-march", "2026-03-10T09:00:00Z", [("user", note)])
    post(home, "review-june", "2026-06-09T09:00:00Z", [("user", note)])
    await EmbeddedEngine(embedder).index(home)
    con = connect(db_path(home), create=False)
    try:
        rows = dict(con.execute("SELECT conv, id FROM chunks").fetchall())
        fused = {rows["review-march"]: 0.0250, rows["review-june"]: 0.0245}

        def first(months: tuple[tuple[int | None, int], ...]) -> str:
            found = candidate_rows(con, fused)
            hits = top_hits(found, fused, k=1, newest=0.0, half_life_days=0.0, months=months)
            return hits[0].conv

        # When the query names no month, June, June 2026, June 2025, or a month without turns
        # Then only a June (of that year) lifts June's turn; nothing is ever filtered out
        assert first(()) == "review-march"
        assert first(((None, 6),)) == "review-june"
        assert first(((2026, 6),)) == "review-june"
        assert first(((2025, 6),)) == "review-march"
        assert first(((None, 10),)) == "review-march"
    finally:
        con.close()


async def test_a_turn_next_to_a_better_hit_gives_its_place_to_another_passage(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given a conversation whose first two turns rank first and second, and another below them
    home = tmp_path / "user"
    post(home, "a", "2026-03-10T09:00:00Z", [("user", "one"), ("assistant", "two")])
    post(home, "b", "2026-03-11T09:00:00Z", [("user", "three")])
    await EmbeddedEngine(embedder).index(home)
    con = connect(db_path(home), create=False)
    try:
        ids = {text: rowid for rowid, text in con.execute("SELECT id, text FROM chunks")}
        fused = {ids["one"]: 0.03, ids["two"]: 0.02, ids["three"]: 0.01}

        # When the top two are taken
        hits = top_hits(candidate_rows(con, fused), fused, k=2, newest=0.0, half_life_days=0.0)
    finally:
        con.close()

    # Then the second place goes to the other conversation: "two" shows as "one"'s neighbour
    assert [hit.text for hit in hits] == ["one", "three"]
