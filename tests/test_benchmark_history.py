"""The synthetic benchmark history: deterministic, valid, and with an unambiguous ground truth."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from datetime import datetime

import pytest

from benchmark import history
from benchmark.history import History, generate
from recall.domain.conversation import parse_conversation

EQUIPMENT_ID = re.compile(r"\b[PKSCEVL]-\d+\b")  # machine and line IDs; MT-/D- refs never match


def _texts(h: History) -> dict[str, str]:
    return {
        body["conversation_id"]: "\n".join(turn["text"] for turn in body["turns"])
        for body in h.conversations
    }


@pytest.fixture(scope="module")
def large() -> History:
    return generate(1000)


@pytest.fixture(scope="module")
def medium() -> History:
    return generate(300, seed=11)


def test_same_seed_gives_byte_identical_history() -> None:
    first, second = generate(200, seed=3), generate(200, seed=3)

    assert json.dumps(first.conversations) == json.dumps(second.conversations)
    assert first.questions == second.questions


def test_different_seed_gives_different_history() -> None:
    first, second = generate(200, seed=3), generate(200, seed=4)

    assert json.dumps(first.conversations) != json.dumps(second.conversations)
    assert [q.answer for q in first.questions] != [q.answer for q in second.questions]


def test_every_body_is_accepted_by_the_turns_route(large: History) -> None:
    for body in large.conversations:
        conversation = parse_conversation(body)

        assert conversation.user == "bench-user"
        assert len(conversation.lines) == 6
        assert [line["role"] for line in conversation.lines] == ["user", "assistant"] * 3


def test_conversation_ids_are_unique_and_sequential(large: History) -> None:
    ids = [body["conversation_id"] for body in large.conversations]

    assert ids[:2] == ["c00001", "c00002"]
    assert len(set(ids)) == len(ids) == 1000


def test_timestamps_are_utc_ordered_and_spread_over_a_past_year(large: History) -> None:
    def moment(ts: str) -> datetime:
        assert ts.endswith("Z")
        return datetime.fromisoformat(ts.replace("Z", "+00:00"))

    per_conversation = [[moment(t["ts"]) for t in body["turns"]] for body in large.conversations]
    starts = [moments[0] for moments in per_conversation]

    assert all(moments == sorted(moments) for moments in per_conversation)
    assert starts == sorted(starts)
    assert {m.year for moments in per_conversation for m in moments} == {2025}
    assert (starts[-1] - starts[0]).days >= 300


def test_every_fact_answer_appears_in_exactly_one_conversation(medium: History) -> None:
    texts = _texts(medium)

    for fact in medium.facts:
        holders = [cid for cid, text in texts.items() if fact.answer in text]
        assert holders == [fact.conversation_id], fact.answer


def test_every_question_answer_is_in_its_own_conversation_only(large: History) -> None:
    texts = _texts(large)

    for q in large.questions:
        holders = [cid for cid, text in texts.items() if q.answer in text]
        assert holders == [q.conversation_id], q.answer


def test_each_question_key_has_exactly_one_fact(large: History) -> None:
    # Equipment + detail within one kind of fact is what a question asks for: never shared.
    keys = Counter((f.kind, f.equipment, f.detail) for f in large.facts)

    assert max(keys.values()) == 1


def test_questions_never_contain_their_answer(large: History) -> None:
    for q in large.questions:
        assert q.answer not in q.question
        assert q.answer not in q.short_query


def test_questions_are_paraphrased_away_from_the_fact_wording(large: History) -> None:
    giveaways = {"ticket": "ticket", "owner": "owns", "qc": "rejected", "decision": "decision"}

    for q in large.questions:
        assert giveaways[q.kind] not in q.question.lower(), q.question


def test_hundred_questions_on_distinct_conversations_balanced_by_kind(large: History) -> None:
    assert len(large.questions) == 100
    assert len({q.conversation_id for q in large.questions}) == 100
    assert Counter(q.kind for q in large.questions) == {k: 25 for k in history.KINDS}


def test_questions_are_spread_across_the_whole_history(large: History) -> None:
    positions = sorted(int(q.conversation_id[1:]) for q in large.questions)

    assert positions[0] <= 20 and positions[-1] >= 980
    assert max(b - a for a, b in itertools.pairwise(positions)) <= 25


@pytest.mark.parametrize("n", [100, 101, 250])
def test_hundred_questions_whenever_the_history_has_a_hundred_conversations(n: int) -> None:
    h = generate(n)

    assert len(h.questions) == 100
    assert len({q.conversation_id for q in h.questions}) == 100


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_tiny_histories_get_one_question_per_conversation(n: int) -> None:
    h = generate(n)

    assert len(h.conversations) == n
    assert len(h.questions) == n


def test_each_piece_of_equipment_recurs_in_about_six_conversations(large: History) -> None:
    counts = Counter(
        equipment
        for text in _texts(large).values()
        for equipment in set(EQUIPMENT_ID.findall(text))
    )

    assert min(counts.values()) >= 4
    assert max(counts.values()) <= 7
    assert 5.5 <= sum(counts.values()) / len(counts) <= 6.5


def test_each_site_recurs_in_about_six_conversations(large: History) -> None:
    names = {p + s for p in history.SITE_PREFIXES for s in history.SITE_SUFFIXES}
    counts = Counter(
        word
        for text in _texts(large).values()
        for word in set(re.findall(r"\b[A-Z][a-z]+\b", text))
        if word in names
    )

    assert min(counts.values()) >= 4
    assert max(counts.values()) <= 7
    assert 5.5 <= sum(counts.values()) / len(counts) <= 6.5


def test_equipment_recurs_both_in_facts_and_in_small_talk(large: History) -> None:
    fact_equipment = {f.equipment.rsplit(" ", 1)[1] for f in large.facts}
    small_talk_only = set()
    for fact, text in zip(large.facts, _texts(large).values(), strict=True):
        own = fact.equipment.rsplit(" ", 1)[1]
        small_talk_only |= set(EQUIPMENT_ID.findall(text)) - {own}

    assert len(fact_equipment & small_talk_only) >= 0.8 * len(fact_equipment)


def test_all_twelve_people_recur_across_the_history(large: History) -> None:
    texts = list(_texts(large).values())

    for person in history.PEOPLE:
        assert sum(person in text for text in texts) >= 100, person


def test_same_symptom_is_reported_on_several_machines_of_one_kind(large: History) -> None:
    # The article's misses: "vibration alarm keeps coming back" on K-039, K-019 and K-007.
    tickets = [f for f in large.facts if f.kind == "ticket"]
    by_symptom = Counter((f.equipment.rsplit(" ", 1)[0], f.detail) for f in tickets)

    assert sum(1 for count in by_symptom.values() if count >= 3) >= 10


def test_fact_sits_early_enough_to_survive_neighbour_previews(large: History) -> None:
    # funes shows neighbouring turns as 160-character previews.
    for fact, body in zip(large.facts, large.conversations, strict=True):
        turn = next(t["text"] for t in body["turns"] if fact.answer in t["text"])
        assert turn.index(fact.answer) + len(fact.answer) <= 160, turn


def test_cli_writes_bodies_and_questions(tmp_path) -> None:
    assert history.main(["120", "--out", str(tmp_path), "--seed", "5"]) == 0

    lines = (tmp_path / "conversations.jsonl").read_text().splitlines()
    questions = json.loads((tmp_path / "questions.json").read_text())
    expected = generate(120, seed=5)
    assert [json.loads(line) for line in lines] == expected.conversations
    assert len(questions) == 100
    assert set(questions[0]) == {"question", "short_query", "answer", "conversation_id", "kind"}


def test_month_questions_name_the_subject_by_a_month_other_than_their_conversations(
    large: History,
) -> None:
    # Given the history's month questions (issue 23: "the July delivery", asked as a subject)
    texts = _texts(large)
    dated = {body["conversation_id"]: body["turns"][0]["ts"][5:7] for body in large.conversations}
    asked = {q.conversation_id for q in large.questions}

    assert len(large.month_questions) == 20
    for q in large.month_questions:
        month = next(m for m in history.MONTHS if f"the {m} delivery" in q.question)
        # Then each names a month the conversation is not dated in, its answer is in its own
        # conversation only, and no other question asks about that conversation
        assert f"{history.MONTHS.index(month) + 1:02d}" != dated[q.conversation_id]
        assert [cid for cid, text in texts.items() if q.answer in text] == [q.conversation_id]
        assert q.kind == "month" and q.conversation_id not in asked


def test_month_questions_leave_the_rest_of_the_history_as_drawn(large: History) -> None:
    # Given the same history drawn without them
    original = history.add_month_subjects
    history.add_month_subjects = lambda *args, **kwargs: []  # type: ignore[assignment]
    try:
        plain = generate(1000)
    finally:
        history.add_month_subjects = original
    # Then only the turns that now hold a month fact differ, and the questions are the same
    changed = [
        (a["id"], b["text"])
        for one, other in zip(plain.conversations, large.conversations, strict=True)
        for a, b in zip(one["turns"], other["turns"], strict=True)
        if a != b
    ]
    assert len(changed) == len(large.month_questions)
    assert all("delivery for" in text for _, text in changed)
    assert plain.questions == large.questions
