"""Ranking rules of the embedded engine that the benchmarks measured, each shown on a small real
history (the real model, real SQLite): rarity-weighted coverage, meaning within the lexical pool,
and "nothing relevant"."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from test_embedded_engine import CORPUS, hits, post

from recall.domain.answers import MORE_MATCH, NEAR_MISSES, NEVER_MENTIONED
from recall.embedder import OnnxEmbedder
from recall.files.engines.embedded.engine import EmbeddedEngine
from recall.files.engines.embedded.store import (
    bm25_pool,
    candidate_rows,
    common_stems,
    connect,
    db_path,
    doc_counts,
)
from recall.models import load_embedder
from recall.ranking.pipeline import Ranking, fused_legs, run_blocking
from recall.ranking.search import (
    LEXICAL_POOL,
    PLACES,
    Candidate,
    Lexical,
    common_floor,
    dense,
    lexical,
    order_pool,
    top_hits,
)
from recall.ranking.text import Query

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
        found = bm25_pool(con, query, common, 3 * LEXICAL_POOL, passages)
        pool = lexical(query, found.counts, found.rows, found.passages)
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


def test_once_a_row_covers_the_whole_query_rows_with_little_of_it_get_no_lexical_vote() -> None:
    # Given a pool where row 1 holds every word of the query and rows 2 and 3 a quarter of it
    # (the common words only), row 2 closest in meaning
    pool = Lexical(pool=[1, 2, 3], shares=[1.0, 0.25, 0.6], unknown_ids=False)
    ids = np.array([1, 2, 3])
    similarity = np.array([0.1, 0.9, 0.2], dtype=np.float32)

    # When the pool is ordered, then the rows holding under half of the query are left to the
    # dense leg (a lexical rank 2 would have scored almost what rank 1 does in the fusion)
    assert order_pool(pool, ids, similarity, candidates=3) == [1, 3]
    # and with no row covering all of it, every row keeps its place
    partial = Lexical(pool=[1, 2, 3], shares=[0.9, 0.25, 0.6], unknown_ids=False)
    assert order_pool(partial, ids, similarity, candidates=3) == [1, 3, 2]


async def test_the_one_note_holding_every_word_of_a_short_query_ranks_first_among_lookalikes(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given eighty notes alike but for a short code with no separator (not an identifier):
    # "b1" is in one note, "b10" to "b19" are in others
    home = tmp_path / "user"
    for prefix in "ab":
        for n in range(40):
            code = f"{prefix}{n}"
            turns = [("user", f"Load note {code}: pelicanbrioche {code}."), ("assistant", "Ok.")]
            post(home, code, "2026-10-08T09:00:00Z", turns)
    engine = EmbeddedEngine(embedder)
    await engine.index(home)

    # When the agent asks for it by the code, then that note comes first
    for code in ("b1", "a3", "b12"):
        found = hits((await engine.recall(home, f"load note {code}")).text)
        assert found and f"Load note {code}:" in found[0], (code, found[:2])


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

    # When the user asks about a topic and identifiers the history never mentions
    unrelated = await engine.recall(memory, "What did the vet say about the parrot's feathers?")
    unknown_id = await engine.recall(memory, "ticket MT-5120 for motor P-7")

    # Then no passage comes back (the server answers "Nothing relevant found ..."); for the
    # identifiers, the answer says which ones no conversation mentions
    assert unrelated.text == ""
    assert unknown_id.text == NEVER_MENTIONED.format("MT-5120 or P-7")
    assert unknown_id.passages == ()


async def test_a_never_mentioned_identifier_is_named_and_its_closest_passages_labelled_no_match(
    embedder: OnnxEmbedder, memory: Path
) -> None:
    engine = EmbeddedEngine(embedder, k=3, candidates=8)

    # When the query names an identifier no conversation holds, but its other words match a
    # passage strongly (a mix-up of MT-4471's number)
    answer = await engine.recall(memory, "MT-5120 mobile app login timeouts owner")

    # Then the answer says so first, labels what follows as no match, and still shows the
    # closest passage, at most k of them
    lines = answer.text.splitlines()
    assert lines[0] == NEVER_MENTIONED.format("MT-5120")
    assert lines[1] == NEAR_MISSES.format("MT-5120")
    assert "MT-4471 tracks the login timeouts" in hits(answer.text)[0]
    assert 1 <= len(answer.passages) <= 3


async def test_related_questions_still_find_their_passages(
    embedder: OnnxEmbedder, memory: Path
) -> None:
    engine = EmbeddedEngine(embedder, k=3, candidates=8)

    # When the question paraphrases, or names a known identifier next to an unknown one
    paraphrase = (await engine.recall(memory, "who looks after the broken cooling upstairs?")).text
    known_id = (await engine.recall(memory, "MT-4471 or MT-9999 owner")).text

    # Then the passages are found, as matches; the unknown one is named
    assert any("Marcus Lee" in block for block in hits(paraphrase))
    assert known_id.startswith(NEVER_MENTIONED.format("MT-9999") + "\n[")
    assert "Priya Raman" in hits(known_id)[0]


async def test_the_relevance_floor_can_be_turned_off(embedder: OnnxEmbedder, memory: Path) -> None:
    engine = EmbeddedEngine(embedder, k=3, candidates=8, min_similarity=0.0)
    answer = (await engine.recall(memory, "What did the vet say about the parrot's feathers?")).text
    assert len(hits(answer)) == 3


def test_a_month_that_names_the_subject_is_no_date_but_one_that_tells_the_time_is() -> None:
    # A month right before a noun, no time word before it: part of what is asked about
    assert Query.parse("the July pallets").months == ()
    assert Query.parse("What was wrong with the March delivery to Ashford?").months == ()
    assert Query.parse("Ashford September delivery shortfall").months == ()
    # A month after a time word, before a year or a day, or on its own: a time
    assert Query.parse("back in January").months == ((None, 1),)
    assert Query.parse("when did we order pallets in May 2023").months == ((2023, 5),)
    assert Query.parse("the painting shown on October 13, 2023").months == ((None, 10),)
    assert Query.parse("Back in January we talked about the September delivery").months == (
        (None, 1),
    )


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


async def test_a_turn_naming_the_month_asked_about_counts_as_much_as_one_dated_in_it(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given a turn dated in July and one dated in September that names July, the latter a
    # little ahead after fusion
    home = tmp_path / "user"
    post(home, "dated", "2026-07-10T09:00:00Z", [("user", "The delivery came 40 pallets short.")])
    post(home, "named", "2026-09-09T09:00:00Z", [("user", "The delivery in July came 12 short.")])
    await EmbeddedEngine(embedder).index(home)
    con = connect(db_path(home), create=False)
    try:
        rows = dict(con.execute("SELECT conv, id FROM chunks").fetchall())
        fused = {rows["named"]: 0.0250, rows["dated"]: 0.0245}

        # When the query asks about July as a time
        months = Query.parse("how short did the delivery come in July?").months
        found = top_hits(
            candidate_rows(con, fused), fused, k=1, newest=0.0, half_life_days=0.0, months=months
        )
    finally:
        con.close()

    # Then the turn whose text names July is lifted as much as the one dated in July
    assert found[0].conv == "named"


async def test_a_month_naming_the_subject_lifts_no_turn_dated_in_it_above_the_one_naming_it(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given the July delivery's shortfall told in September, and July's chats at the same site
    home = tmp_path / "user"
    fact = "The July delivery for Ashford came 12 pallets short, Dana is chasing it."
    post(home, "fact", "2026-09-09T09:00:00Z", [("user", fact), ("assistant", "Noted.")])
    for day in range(1, 6):
        turns = [
            ("user", f"Quick update from Ashford, pallets stacked on day {day}."),
            ("assistant", "Okay."),
        ]
        post(home, f"july-{day}", f"2026-07-0{day}T09:00:00Z", turns)
    engine = EmbeddedEngine(embedder, k=1, candidates=8)
    await engine.index(home)

    # When the question names July as the delivery's, not as a time
    answer = await engine.recall(home, "What was wrong with the July delivery for Ashford?")

    # Then the turn that names it comes first: July's own turns are not lifted over it
    assert "12 pallets short" in hits(answer.text)[0]


async def test_the_last_line_says_when_clearly_more_passages_match_than_are_shown(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given five chats that each hold open follow-ups, and chats about other things
    home = tmp_path / "user"
    for n in range(5):
        turns = [("user", f"Open follow-ups from the review {n}: call the vendor, fix invoice."),
                 ("assistant", "Noted.")]  # fmt: skip
        post(home, f"review-{n}", f"2026-03-0{n + 1}T09:00:00Z", turns)
    for n in range(6):
        turns = [("user", f"The lunch menu on day {n} was soup."), ("assistant", "Nice.")]
        post(home, f"lunch-{n}", f"2026-04-0{n + 1}T09:00:00Z", turns)
    engine = EmbeddedEngine(embedder, k=3, candidates=8)
    await engine.index(home)

    # When the agent asks for the open follow-ups (three passages shown), and for a lunch
    listed = await engine.recall(home, "open follow-ups from the review")
    single = await engine.recall(home, "what soup was on the lunch menu on day 4")

    # Then the first answer's last line says that two more match and how to find them; the
    # second, with nothing else matching as fully, has no such line
    assert len(listed.passages) == 3
    assert listed.text.endswith(MORE_MATCH.format(2) + "\n")
    assert listed.passages[-1].end < len(listed.text)
    assert "more passages match" not in single.text


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


def test_past_the_first_places_a_turn_next_to_a_hit_keeps_its_rank() -> None:
    # Given fused rows best first: turns 0 and 1 of one conversation, then five elsewhere
    def row(rowid: int, conv: str, seq: int) -> Candidate:
        ts = "2026-03-10T09:00:00Z"
        return Candidate(rowid, conv, f"t{rowid}", seq, ts, 0.0, "user", "x", ())

    rows = [row(1, "a", 0), row(2, "a", 1), *(row(n, f"c{n}", 0) for n in range(3, 8))]
    fused = {rowid: 1.0 / rowid for rowid in range(1, 8)}

    # When the top k are taken at each k
    ranked = [
        [hit.id for hit in top_hits(rows, fused, k=k, newest=0.0, half_life_days=0.0)]
        for k in range(1, 8)
    ]

    # Then turn 1 gives its place among the first PLACES (it shows as turn 0's neighbour), and
    # comes right after them, before the rows it outranks; each list starts the next
    assert PLACES == 3
    assert ranked[2] == [1, 3, 4]
    assert ranked[-1] == [1, 3, 4, 2, 5, 6, 7]
    assert all(ranked[-1][: len(top)] == top for top in ranked)


def test_a_deeper_dense_leg_starts_with_the_shallower_one_even_among_equal_cosines() -> None:
    # Given cosines with ties (a repeated turn embeds alike), across the cut at 3
    ids = np.arange(10, 20)
    scores = np.array([0.5, 0.9, 0.7, 0.7, 0.7, 0.1, 0.7, 0.2, 0.9, 0.3], dtype=np.float32)

    # When the leg is read at each depth
    legs = [dense(ids, scores, depth)[0] for depth in range(1, 11)]

    # Then each is the next one's start, equal cosines in row order
    assert legs[-1] == [11, 18, 12, 13, 14, 16, 10, 19, 17, 15]
    assert all(legs[-1][: len(leg)] == leg for leg in legs)


def test_rows_of_a_wider_pool_are_served_after_every_fused_row() -> None:
    # Given two fused rows and, appended, a row holding the identifier asked for
    def row(rowid: int, conv: str, ids: tuple[str, ...] = ()) -> Candidate:
        return Candidate(rowid, conv, f"t{rowid}", 0, "2026-03-10T09:00:00Z", 0.0, "user", "x", ids)

    rows = [row(1, "a"), row(2, "b"), row(3, "c", ("mt4471",))]
    fused = {1: 0.03, 2: 0.02}

    # When the top k are taken at each k
    ranked = [
        [hit.id for hit in top_hits(
            rows, fused, k=k, newest=0.0, half_life_days=0.0, ids=("mt4471",), after=[3]
        )]
        for k in (1, 2, 3)
    ]  # fmt: skip

    # Then the appended row follows the fused ones, and each list starts the next
    assert ranked == [[1], [1, 2], [1, 2, 3]]


def test_the_legs_fuse_at_their_depths_and_the_wider_dense_rows_follow_unfused() -> None:
    # Given twenty rows, row 1 closest in meaning, and a pool where only row 10 covers the query
    ids = np.arange(1, 21)
    similarity = np.linspace(0.9, 0.52, 20, dtype=np.float32)
    by_words = Lexical([10, 20], [1.0, 0.4], False)

    # When the legs are composed at RECALL_CANDIDATES 12
    legs = fused_legs(by_words, ids, similarity, Ranking(k=3, candidates=12))

    # Then the dense leg's first 8 rows and row 10 are fused; the dense rows to 12 not fused
    # follow, in cosine order
    assert legs is not None
    assert sorted(legs.fused) == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    assert legs.widened == [9, 11, 12]


def test_a_query_that_finds_nothing_orders_and_fuses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given rows far from the query in meaning, and a pool that covers little of it
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("ordered or fused for a query that finds nothing")

    monkeypatch.setattr("recall.ranking.pipeline.order_pool", never)
    monkeypatch.setattr("recall.ranking.pipeline.fuse", never)
    by_words = Lexical([3], [0.2], False)

    # When the legs are composed, then there are none: the floor is checked first
    assert fused_legs(by_words, np.arange(1, 6), np.full(5, 0.1), Ranking()) is None


def test_the_blocking_driver_runs_a_pipeline_to_its_end_and_refuses_one_that_suspends() -> None:
    async def read() -> int:  # a source's method: a blocking read, then its value
        return 7

    async def blocking() -> int:
        return await read() * 6

    async def suspends() -> int:
        await asyncio.sleep(0)  # yields to an event loop, which a recall thread has not
        return 42

    assert run_blocking(blocking()) == 42
    with pytest.raises(RuntimeError, match="suspended"):
        run_blocking(suspends())
