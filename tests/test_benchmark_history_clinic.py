"""The held-out synthetic history (a veterinary practice): deterministic, valid, unambiguous, and
with questions that name their task, procedure or medicine by other words than the fact."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from benchmark import history_clinic as clinic
from benchmark.history import History
from benchmark.report import write_report
from benchmark.run import HISTORIES
from recall.domain.conversation import parse_conversation

BRANCHES = frozenset(p + s for p in clinic.PLACE_PREFIXES for s in clinic.PLACE_SUFFIXES)
# Names a question may share with its fact: staff, patients, branches (lower-cased words).
NAMES = frozenset(
    name.lower() for name in [*clinic.PEOPLE, *clinic.PET_NAMES, *clinic.SURNAMES, *BRANCHES]
)
# Function words, listed here independently of the generator's own list.
FUNCTION_WORDS = frozenset((
    "after", "and", "are", "did", "for", "from", "get", "given", "goes", "how", "its", "that",
    "the", "this", "under", "was", "what", "which", "who", "will", "with",
))  # fmt: skip


def _texts(h: History) -> dict[str, str]:
    return {
        body["conversation_id"]: "\n".join(turn["text"] for turn in body["turns"])
        for body in h.conversations
    }


def _content(text: str) -> list[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return [w for w in words if len(w) >= 3 and w not in FUNCTION_WORDS and w not in NAMES]


def _clashes(question: str, fact: str) -> list[tuple[str, str]]:
    """Word pairs that are one word: equal, or the same first four letters ("test"/"testing")."""
    return [
        (q, f)
        for q in _content(question)
        for f in _content(fact)
        if q == f or (len(q) >= 4 and len(f) >= 4 and q[:4] == f[:4])
    ]


@pytest.fixture(scope="module")
def held_out() -> History:
    return clinic.generate(300)  # the size the benchmark runs


@pytest.fixture(scope="module")
def large() -> History:
    return clinic.generate(1000, seed=11, questions=200)


def test_same_seed_gives_byte_identical_history() -> None:
    first, second = clinic.generate(200, seed=3), clinic.generate(200, seed=3)

    assert json.dumps(first.conversations) == json.dumps(second.conversations)
    assert first.questions == second.questions


def test_different_seed_gives_different_history() -> None:
    first, second = clinic.generate(200, seed=3), clinic.generate(200, seed=4)

    assert json.dumps(first.conversations) != json.dumps(second.conversations)
    assert [q.answer for q in first.questions] != [q.answer for q in second.questions]


def test_every_body_is_accepted_by_the_turns_route(large: History) -> None:
    for body in large.conversations:
        conversation = parse_conversation(body)

        assert conversation.user == "bench-user"
        assert len(conversation.lines) == 6
        assert [line["role"] for line in conversation.lines] == ["user", "assistant"] * 3


def test_sixty_questions_on_distinct_conversations_balanced_by_kind(held_out: History) -> None:
    assert len(held_out.conversations) == 300
    assert len({q.conversation_id for q in held_out.questions}) == 60
    assert Counter(q.kind for q in held_out.questions) == {k: 15 for k in clinic.KINDS}


def test_questions_are_spread_across_the_whole_history(held_out: History) -> None:
    positions = sorted(int(q.conversation_id[1:]) for q in held_out.questions)

    assert positions[0] <= 10 and positions[-1] >= 290
    assert max(b - a for a, b in itertools.pairwise(positions)) <= 15


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_tiny_histories_get_one_question_per_conversation(n: int) -> None:
    h = clinic.generate(n)

    assert len(h.conversations) == len(h.questions) == n


def test_every_answer_is_in_its_own_conversation_only(large: History) -> None:
    texts = _texts(large)

    for q in large.questions:
        assert [cid for cid, text in texts.items() if q.answer in text] == [q.conversation_id]
    for fact in large.facts:
        assert [cid for cid, text in texts.items() if fact.answer in text] == [fact.conversation_id]


def test_each_question_key_has_exactly_one_fact(large: History) -> None:
    # patient + procedure, patient + medicine, branch + task: never shared within a kind
    keys = Counter((f.kind, f.equipment, f.detail) for f in large.facts)

    assert max(keys.values()) == 1


def test_questions_never_contain_their_answer(large: History) -> None:
    for q in large.questions:
        assert q.answer not in q.question
        assert q.answer not in q.short_query


def test_long_questions_share_no_word_with_their_fact_but_names(large: History) -> None:
    facts = {f.conversation_id: f for f in large.facts}

    for q in large.questions:
        assert _clashes(q.question, facts[q.conversation_id].sentence) == [], q.question


def test_duty_and_decision_short_queries_are_branch_and_paraphrase_only(large: History) -> None:
    facts = {f.conversation_id: f for f in large.facts}
    hard = [q for q in large.questions if q.kind in ("duty", "decision")]

    assert len(hard) == 100
    for q in hard:
        fact = facts[q.conversation_id]
        assert fact.equipment in q.short_query  # the branch
        assert not re.search(r"[A-Z]{2}-\d", q.short_query)  # no chart or reference to go on
        clashes = [pair for pair in _clashes(q.short_query, fact.sentence) if pair[0] != "decision"]
        assert clashes == [], q.short_query


def test_booking_and_dose_short_queries_carry_the_chart_number(large: History) -> None:
    facts = {f.conversation_id: f for f in large.facts}

    for q in large.questions:
        if q.kind in ("booking", "dose"):
            chart = re.search(r"PT-\d+", facts[q.conversation_id].equipment)
            assert chart and q.short_query.startswith(chart.group()), q.short_query


def test_every_question_names_a_branch_or_person_that_other_conversations_mention(
    held_out: History,
) -> None:
    texts = _texts(held_out)

    for q in held_out.questions:
        names = [w for w in re.findall(r"[A-Z][a-z]+", q.question) if w in BRANCHES]
        names += [p for p in clinic.PEOPLE if p in q.question]
        elsewhere = [
            name
            for name in names
            if sum(name in text for cid, text in texts.items() if cid != q.conversation_id) >= 3
        ]
        assert elsewhere, q.question


def test_the_branch_a_duty_or_decision_asks_about_recurs_in_small_talk(held_out: History) -> None:
    texts = _texts(held_out)
    facts = {f.conversation_id: f for f in held_out.facts}

    for q in held_out.questions:
        if q.kind in ("duty", "decision"):
            branch = facts[q.conversation_id].equipment
            others = [cid for cid, text in texts.items() if branch in text]
            assert len(others) >= 4, branch  # its own conversation and three or more others


def test_branches_and_patients_recur_in_about_six_conversations(large: History) -> None:
    texts = list(_texts(large).values())
    branches = Counter(
        w for text in texts for w in set(re.findall(r"\b[A-Z][a-z]+\b", text)) if w in BRANCHES
    )
    patient = re.compile(rf"\b(?:{'|'.join(clinic.PET_NAMES)}) (?:{'|'.join(clinic.SURNAMES)})\b")
    patients = Counter(name for text in texts for name in set(patient.findall(text)))

    for counts in (branches, patients):
        assert min(counts.values()) >= 4
        assert max(counts.values()) <= 7
        assert 5.5 <= sum(counts.values()) / len(counts) <= 6.5


def test_small_talk_names_tasks_procedures_and_medicines_by_their_usual_names(
    large: History,
) -> None:
    texts = _texts(large)
    small_talk = [
        text.replace(fact.sentence, "")
        for fact, text in zip(large.facts, texts.values(), strict=True)
    ]

    for term in (*clinic.TASKS, *clinic.PROCEDURES):  # what the questions paraphrase
        assert sum(term.fact in text for text in small_talk) >= 10, term.fact
    for term in clinic.MEDICINES:  # one small-talk line in nine: rarer
        assert any(term.fact in text for text in small_talk), term.fact


def test_the_same_task_appears_at_three_branches_in_near_identical_facts(large: History) -> None:
    for kind in ("duty", "decision"):
        by_task = Counter(f.detail for f in large.facts if f.kind == kind)
        assert sum(1 for count in by_task.values() if count >= 3) >= 10, kind


def test_the_fact_sits_in_the_first_160_characters_of_its_message(large: History) -> None:
    for fact, body in zip(large.facts, large.conversations, strict=True):
        turn = next(t["text"] for t in body["turns"] if fact.answer in t["text"])
        assert turn.index(fact.answer) + len(fact.answer) <= 160, turn


def test_the_check_refuses_an_answer_found_in_a_second_conversation(held_out: History) -> None:
    bodies = copy.deepcopy(held_out.conversations)
    asked = next(q for q in held_out.questions if q.kind == "booking")
    other = next(b for b in bodies if b["conversation_id"] != asked.conversation_id)
    other["turns"][5]["text"] += f" Is {asked.answer} still open?"

    with pytest.raises(RuntimeError, match=asked.answer):
        clinic._check_clinic(bodies, held_out.facts, held_out.questions)


def test_the_check_refuses_a_duty_answer_repeated_in_small_talk(held_out: History) -> None:
    bodies = copy.deepcopy(held_out.conversations)
    asked = next(q for q in held_out.questions if q.kind == "duty")
    other = next(b for b in bodies if b["conversation_id"] != asked.conversation_id)
    other["turns"][1]["text"] += f" Last year {asked.answer}."

    with pytest.raises(RuntimeError, match="not unique"):
        clinic._check_clinic(bodies, held_out.facts, held_out.questions)


def test_the_check_refuses_a_question_in_the_facts_own_words(held_out: History) -> None:
    facts = {f.conversation_id: f for f in held_out.facts}
    questions = list(held_out.questions)
    duty = next(i for i, q in enumerate(questions) if q.kind == "duty")
    fact = facts[questions[duty].conversation_id]
    questions[duty] = dataclasses.replace(
        questions[duty], question=f"Who is on the {fact.detail} at {fact.equipment}?"
    )

    with pytest.raises(RuntimeError, match="repeats the fact"):
        clinic._check_clinic(held_out.conversations, held_out.facts, questions)


def test_the_check_refuses_two_facts_with_one_key(held_out: History) -> None:
    facts = list(held_out.facts)
    first, second = [i for i, f in enumerate(facts) if f.kind == "dose"][:2]
    facts[second] = dataclasses.replace(
        facts[second], equipment=facts[first].equipment, detail=facts[first].detail
    )

    with pytest.raises(RuntimeError, match="share the key"):
        clinic._check_clinic(held_out.conversations, facts, held_out.questions)


def test_the_runner_knows_the_clinic_history_with_sixty_questions() -> None:
    make_history, questions = HISTORIES["clinic"]

    assert make_history is clinic.generate
    assert questions == 60


def test_the_report_puts_clinic_runs_in_their_own_table(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    row = {
        "engine": "embedded", "hit@3_long": 0.9, "hit@3_short": 1.0, "hit@8_long": 1.0,
        "hit@8_short": 1.0, "e2e_k3_short": {"p50_ms": 1, "p95_ms": 2},
        "engine_short": {"p50_ms": 1, "p95_ms": 2}, "server_rss_mb": 1, "load_s": 1,
        "disk_per_user_mb": 1, "machine": "test box", "date": "2026-12-01",
    }  # fmt: skip
    (results / "embedded-1000.json").write_text(json.dumps(row | {"size": 1000}))
    (results / "embedded-clinic-300.json").write_text(
        json.dumps(row | {"size": 300, "history": "clinic", "hit@3_long": 0.5})
    )
    (tmp_path / "README.md").write_text(
        "<!-- results:begin -->\n<!-- results:end -->\n<!-- clinic:begin -->\n<!-- clinic:end -->\n"
    )

    write_report(results, draw_chart=False)

    ops_table, clinic_table = (tmp_path / "README.md").read_text().split("<!-- clinic:begin -->")
    assert "| embedded | 1,000 | 90% / 100%" in ops_table and "| 300 |" not in ops_table
    assert "| embedded | 300 | 50% / 100%" in clinic_table and "1,000" not in clinic_table
    assert "funes" not in clinic_table
