"""The LoCoMo benchmark's loader and metric, on a tiny LoCoMo-shaped sample written here (the real
data never enters the repository), and one run through a real server and the MCP tool."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmark import locomo
from benchmark.locomo import (
    Answers,
    evidence_key,
    is_hit,
    locomo_server,
    measure_locomo,
    score,
    session_hit,
    session_ts,
    to_history,
    turn_ndcg,
    turn_recall,
)
from benchmark.report import write_report
from devtools.testing import ROOT
from recall.domain.answers import NEAR_MISSES, NEVER_MENTIONED, NOTHING_FOUND
from recall.domain.conversation import parse_conversation

POTTERY = "I moved to   Valparaiso last spring for a POTTERY apprenticeship with a master glazer."


def sample() -> dict[str, Any]:
    """Two sessions between Ada (speaker_a) and Bo, five questions of every kind."""
    return {
        "sample_id": "sample-1",
        "speaker_a": "Ada",
        "speaker_b": "Bo",
        "session_2_date_time": "9:05 am on 3 January, 2024",
        "session_2": [
            {"speaker": "Bo", "dia_id": "D2:1", "text": "How is the new studio going?"},
            {"speaker": "Ada", "dia_id": "D2:2", "text": "Busy! The kiln arrives on Friday."},
        ],
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ada", "dia_id": "D1:1", "text": "Hey Bo, long time no see!"},
            {"speaker": "Bo", "dia_id": "D1:2", "text": "Ada! What have you been up to lately?"},
            {"speaker": "Ada", "dia_id": "D1:3", "text": POTTERY},
            {
                "speaker": "Bo",
                "dia_id": "D1:4",
                "text": "Look at this bowl I made.",
                "img_url": ["https://example.invalid/bowl.jpg"],
                "blip_caption": "a photo of a blue ceramic bowl",
            },
        ],
        "session_3": [],  # an empty session is no conversation
        "qa": [
            {"question": "Where did Ada move for her apprenticeship?", "answer": "Valparaiso",
             "evidence": ["D1:3"], "category": 4},
            {"question": "When does Ada's kiln arrive?", "answer": "5 January 2024",
             "evidence": ["D2:2; D1:3", "D 2:1"], "category": 2},
            {"question": "What does Bo think of Ada's studio?", "answer": "",
             "evidence": [], "category": 3},
            {"question": "What kind of apprenticeship did Bo do?", "adversarial_answer": "pottery",
             "evidence": ["D1:3"], "category": 5},
            {"question": "What did Ada sell at the fair?", "answer": "?",
             "evidence": ["D9:9", "D"], "category": 1},
        ],
    }  # fmt: skip


def test_each_session_becomes_one_conversation_of_speaker_prefixed_turns() -> None:
    history = to_history(sample())

    assert history.user == "sample-1"
    assert [body["conversation_id"] for body in history.bodies] == ["session-1", "session-2"]
    first = history.bodies[0]
    assert first["user"] == "sample-1"
    assert [turn["id"] for turn in first["turns"]] == ["D1-1", "D1-2", "D1-3", "D1-4"]
    assert [turn["role"] for turn in first["turns"]] == ["user", "assistant", "user", "assistant"]
    assert first["turns"][2]["text"] == f"Ada: {POTTERY}"
    assert {turn["ts"] for turn in first["turns"]} == {"2023-05-08T13:56:00Z"}
    assert history.bodies[1]["turns"][0] == {
        "id": "D2-1", "role": "assistant", "text": "Bo: How is the new studio going?",
        "ts": "2024-01-03T09:05:00Z",
    }  # fmt: skip


def test_a_shared_image_counts_by_its_text_alone_and_marks_its_questions() -> None:
    with_a_photo_question = sample()
    with_a_photo_question["qa"].append(
        {"question": "What colour is Bo's bowl?", "answer": "blue", "evidence": ["D1:4"],
         "category": 4}
    )  # fmt: skip

    history = to_history(with_a_photo_question)

    photo_turn = history.bodies[0]["turns"][3]
    assert photo_turn["text"] == "Bo: Look at this bowl I made."
    assert history.turns == 6 and history.turns_with_images == 1
    assert [q.photo_evidence for q in history.questions] == [False, False, False, True]


def test_every_body_is_accepted_by_the_turns_route() -> None:
    for body in to_history(sample()).bodies:
        conversation = parse_conversation(body)

        assert [line["turn_uuid"] for line in conversation.lines] == [
            turn["id"] for turn in body["turns"]
        ]


def test_session_dates_are_read_as_utc() -> None:
    assert session_ts("1:56 pm on 8 May, 2023") == "2023-05-08T13:56:00Z"
    assert session_ts("12:09 am on 13 September, 2023") == "2023-09-13T00:09:00Z"
    assert session_ts("12:30 pm on 1 July, 2022") == "2022-07-01T12:30:00Z"


def test_only_categories_one_to_four_with_evidence_are_asked_as_written() -> None:
    history = to_history(sample())

    assert [(q.text, q.category) for q in history.questions] == [
        ("Where did Ada move for her apprenticeship?", 4),
        ("When does Ada's kiln arrive?", 2),
        ("What did Ada sell at the fair?", 1),
    ]
    assert history.adversarial == ["What kind of apprenticeship did Bo do?"]


def test_slipped_evidence_ids_are_read_and_ids_of_no_turn_are_counted() -> None:
    history = to_history(sample())
    kiln, fair = history.questions[1], history.questions[2]

    assert kiln.keys == (
        evidence_key("Busy! The kiln arrives on Friday."),
        evidence_key(POTTERY),
        evidence_key("How is the new studio going?"),
    )
    assert fair.keys == ()  # still asked: a certain miss
    assert vars(history.evidence) == {
        "references": 6, "normalised": 3, "unresolved": 2, "questions_without_evidence": 1,
    }  # fmt: skip


def test_a_hit_needs_the_first_sixty_characters_of_an_evidence_turn_case_and_space_blind() -> None:
    key = evidence_key(POTTERY)
    shown = (
        "[2023-05-08 13:56 UTC] user\n"
        "Ada: i moved to valparaiso last spring\n for a Pottery  APPRENTICESHIP with…"
    )
    cut_short = "[2023-05-08 13:56 UTC] user\nAda: I moved to Valparaiso last spring for a…"

    assert key == "i moved to valparaiso last spring for a pottery apprenticesh"
    assert is_hit(shown, key)
    assert not is_hit(cut_short, key)
    assert not is_hit(NOTHING_FOUND, key)
    assert not is_hit(shown, "")


def test_off_topic_questions_leave_out_what_the_history_talks_about() -> None:
    talks_of_a_plumber = sample()
    talks_of_a_plumber["session_2"][1]["text"] = "Busy! The plumbers come on Friday."

    kept = to_history(talks_of_a_plumber).off_topic

    assert "Which plumber fixed the boiler leak?" not in kept
    assert len(kept) == len(locomo.OFF_TOPIC) - 1


def test_scores_per_category_with_evidence_recall_and_false_positives() -> None:
    history = to_history(sample())
    pottery_only = f"[2023-05-08 13:56 UTC] user\nAda: {POTTERY}\n---\n"
    # questions: single-hop, temporal, multi-hop; then the adversarial one; then the off-topic
    at_3 = [pottery_only, pottery_only, pottery_only, pottery_only]
    at_3 += [NOTHING_FOUND] * len(history.off_topic)
    at_8 = [NOTHING_FOUND] * 3 + [NOTHING_FOUND] + [pottery_only] * len(history.off_topic)
    answers = {
        3: {history.user: Answers(at_3, [1.0] * len(at_3))},
        8: {history.user: Answers(at_8, [1.0] * len(at_8))},
    }

    figures = score([history], answers)["figures"]

    rows = figures["by_category"]
    assert list(rows) == ["single-hop", "temporal", "multi-hop", "overall"]
    assert rows["single-hop"] == {
        "questions": 1, "hit@3": 1.0, "evidence_recall@3": 1.0, "hit@8": 0.0,
        "evidence_recall@8": 0.0,
    }  # fmt: skip
    assert rows["temporal"]["hit@3"] == 1.0 and rows["temporal"]["evidence_recall@3"] == 0.333
    assert rows["multi-hop"]["hit@3"] == 0.0
    assert rows["overall"]["hit@3"] == 0.667 and rows["overall"]["evidence_recall@3"] == 0.444
    fp = figures["false_positive"]
    assert fp["k3"]["adversarial"] == {"queries": 1, "rate": 1.0, "near_miss_rate": 0.0}
    assert fp["k3"]["unseen_entities"]["rate"] == 0.0
    assert fp["k8"]["unseen_entities"]["rate"] == 1.0
    assert fp["k8"]["all"]["queries"] == 1 + len(history.off_topic)


# A ranked list as the audit serves it: each passage's own (conversation, turn), best first.
RANKED = [
    ("session-1", "D1-1"),
    ("session-1", "D1-2"),
    ("session-1", "D1-4"),
    ("session-3", "D3-1"),
    ("session-2", "D2-2"),
    ("session-1", "D1-5"),
    ("session-4", "D4-1"),
    ("session-4", "D4-2"),
    ("session-5", "D5-1"),
    ("session-1", "D1-3"),
    ("session-2", "D2-1"),  # eleventh: beyond R@10
]


def test_turn_recall_is_the_share_of_evidence_turns_among_the_top_k_ranked_turns() -> None:
    evidence = (("session-2", "D2-2"), ("session-1", "D1-3"), ("session-2", "D2-1"))

    assert turn_recall(RANKED, evidence, 4) == 0.0
    assert turn_recall(RANKED, evidence, 5) == 1 / 3  # D2-2 is fifth
    assert turn_recall(RANKED, evidence, 10) == 2 / 3  # D1-3 is tenth, D2-1 eleventh
    assert turn_recall(RANKED, (("session-1", "D1-1"),), 1) == 1.0
    # a turn of the same session is not the evidence turn; no evidence: a miss
    assert turn_recall(RANKED, (("session-3", "D3-2"),), 10) == 0.0
    assert turn_recall(RANKED, (), 10) == 0.0


def test_ndcg_gains_each_evidence_turn_by_its_rank_against_the_evidence_ranked_first() -> None:
    two = (("session-2", "D2-2"), ("session-1", "D1-3"))  # fifth and tenth in RANKED

    # gains 1/log2(6) + 1/log2(11), ideal 1/log2(2) + 1/log2(3)
    found = 1 / math.log2(6) + 1 / math.log2(11)
    assert turn_ndcg(RANKED, two, 10) == pytest.approx(found / (1 + 1 / math.log2(3)))
    assert turn_ndcg(RANKED, two, 9) == pytest.approx((1 / math.log2(6)) / (1 + 1 / math.log2(3)))
    assert turn_ndcg(RANKED, (("session-1", "D1-1"),), 10) == 1.0  # first: ideal
    # an evidence turn ranked twice gains once; eleven evidence turns: the ideal stops at k
    assert turn_ndcg([RANKED[0], RANKED[0]], (RANKED[0], RANKED[4]), 10) == pytest.approx(
        1 / (1 + 1 / math.log2(3))
    )
    assert turn_ndcg(RANKED, tuple(RANKED), 10) == 1.0
    assert turn_ndcg(RANKED, (), 10) == 0.0


def test_session_hit_reads_distinct_sessions_in_rank_order() -> None:
    # distinct sessions in rank order: 1, 3, 2, 4, 5
    assert session_hit(RANKED, (("session-1", "D1-9"),), 1)
    assert not session_hit(RANKED, (("session-2", "D2-9"),), 2)
    assert session_hit(RANKED, (("session-2", "D2-9"),), 3)  # fifth turn, third session
    assert session_hit(RANKED, (("session-5", "D5-9"),), 5)  # ninth turn, fifth session
    assert not session_hit(RANKED, (("session-6", "D6-1"),), 5)


def test_the_field_metrics_read_the_served_turns_in_rank_order_never_their_neighbours() -> None:
    history = to_history(sample())
    # At k=10 the answer's text shows every evidence turn (the pottery passage with its
    # neighbours), but the audit served one passage: D1-3's own turn.
    everything = "\n".join(
        f"Ada: {text}" for text in (POTTERY, "Busy! The kiln arrives on Friday.",
                                    "How is the new studio going?")
    )  # fmt: skip
    asked = 4 + len(history.off_topic)
    nothing = Answers([NOTHING_FOUND] * asked, [1.0] * asked, [[]] * asked)
    served = [[("session-1", "D1-3")], [("session-1", "D1-3")], [("session-2", "D2-1")]]
    at_10 = Answers(
        [everything] * asked, [1.0] * asked, served + [[("session-1", "D1-3")]] * (asked - 3)
    )
    answers = {3: {history.user: nothing}, 8: {history.user: nothing}, 10: {history.user: at_10}}

    rows = score([history], answers)["figures"]["by_category"]

    # single-hop: its one evidence turn D1-3 served first
    field = ("R@5", "R@10", "session_hit@1", "session_hit@5")
    assert {m: rows["single-hop"][m] for m in field} == dict.fromkeys(field, 1.0)
    # temporal: evidence D2-2, D1-3, D2-1; only D1-3 served (its neighbours in the text: no)
    assert rows["temporal"]["R@5"] == 0.333 and rows["temporal"]["R@10"] == 0.333
    assert rows["temporal"]["session_hit@1"] == 1.0
    # multi-hop: no evidence resolved: a miss, whatever was served
    assert rows["multi-hop"]["R@10"] == 0.0 and rows["multi-hop"]["session_hit@5"] == 0.0
    assert rows["overall"]["R@5"] == 0.444 and rows["overall"]["session_hit@1"] == 0.667
    # NDCG@10: 1 (single-hop), D1-3 first of three evidence turns (temporal), 0 (multi-hop)
    temporal = 1 / (1 + 1 / math.log2(3) + 1 / math.log2(4))
    assert rows["temporal"]["NDCG@10"] == round(temporal, 3)
    assert rows["overall"]["NDCG@10"] == round((1 + temporal) / 3, 3)


def test_near_misses_under_their_label_are_counted_apart_from_false_positives() -> None:
    history = to_history(sample())
    block = f"[2023-05-08 13:56 UTC] user\nAda: {POTTERY}\n---\n"
    unknown = NEVER_MENTIONED.format("INV-20931")
    near = f"{unknown}\n{NEAR_MISSES.format('INV-20931')}\n{block}"
    # the off-topic queries: one near miss, one note alone, one match after a note, the rest none
    off_topic = [near, unknown, f"{unknown}\n{block}"]
    off_topic += [NOTHING_FOUND] * (len(history.off_topic) - len(off_topic))
    got = [NOTHING_FOUND] * 4 + off_topic
    answers = {k: {history.user: Answers(got, [1.0] * len(got))} for k in (3, 8)}

    fp = score([history], answers)["figures"]["false_positive"]["k3"]["unseen_entities"]

    # only the passage shown as a match is a false positive; the labelled one is a near miss
    assert fp["rate"] == round(1 / len(history.off_topic), 3)
    assert fp["near_miss_rate"] == round(1 / len(history.off_topic), 3)


def test_the_misses_are_kept_out_of_the_committed_figures() -> None:
    history = to_history(sample())
    nothing = [NOTHING_FOUND] * (4 + len(history.off_topic))
    answers = {k: {history.user: Answers(nothing, [1.0] * len(nothing))} for k in (3, 8)}

    scored = score([history], answers)

    assert "Valparaiso" not in json.dumps(scored["figures"])
    assert "apprenticeship" not in json.dumps(scored["figures"])
    assert scored["misses"]["single-hop"][0]["question"] == history.questions[0].text


@pytest.fixture(scope="module")
def other_checkouts_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The recorded run with --server-tree, and the log of what that checkout started. Its
    recall_server.py runs ours: the same figures as a run of this checkout, for one run's CPU
    (a backfill and three servers) instead of two."""
    tmp = tmp_path_factory.mktemp("locomo")
    data = tmp / "tiny-locomo.json"
    data.write_text(json.dumps([sample()]))
    started = tmp / "started.log"
    figures, _ = measure_locomo(data, server_tree=other_checkout(tmp / "other", started))
    return figures, started


@pytest.fixture(scope="module")
def through_the_tool(other_checkouts_run: tuple[dict[str, Any], Path]) -> dict[str, Any]:
    return other_checkouts_run[0]


def test_a_run_through_the_tool_finds_the_evidence_and_measures_false_positives(
    through_the_tool: dict[str, Any],
) -> None:
    assert through_the_tool["by_category"]["single-hop"]["hit@8"] == 1.0
    assert through_the_tool["by_category"]["single-hop"]["R@5"] == 1.0  # read from the audit
    assert through_the_tool["by_category"]["overall"]["questions"] == 3
    assert through_the_tool["unavailable_answers"] == 0
    assert through_the_tool["embed_model"] == "minilm"  # no EMBED_MODEL here: the default
    off_topic = len(to_history(sample()).off_topic)
    assert through_the_tool["false_positive"]["k3"]["all"]["queries"] == 1 + off_topic
    assert 0.0 <= through_the_tool["false_positive"]["k3"]["all"]["rate"] <= 1.0


def test_the_servers_run_the_embed_model_this_process_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given EMBED_MODEL in the benchmark's environment, when it builds a server at each k,
    monkeypatch.setenv("EMBED_MODEL", "multilingual-e5-small")
    servers = [locomo_server(tmp_path, "embedded", k, ["u"]) for k in locomo.SETTINGS_AT]

    # then every one runs that model (how an e5 run through the real server is asked for).
    assert {live.env["EMBED_MODEL"] for live in servers} == {"multilingual-e5-small"}


def test_the_in_process_run_answers_like_the_tool(
    tmp_path: Path, through_the_tool: dict[str, Any]
) -> None:
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps([sample()]))

    figures, _ = locomo.measure_in_process(data)

    assert figures["by_category"] == through_the_tool["by_category"]
    assert figures["false_positive"] == through_the_tool["false_positive"]


def other_checkout(root: Path, marker: Path) -> Path:
    """A checkout the benchmark can start by --server-tree: its `.venv/bin/python` (this
    interpreter) and a `recall_server.py` that notes each start's arguments, then runs ours."""
    venv = root / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / "python").chmod(0o755)
    (root / "recall_server.py").write_text(
        "import runpy, sys\n"
        f"with open({str(marker)!r}, 'a') as log:\n"
        "    log.write(' '.join(sys.argv[1:2]) + '\\n')\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        f"runpy.run_path({str(ROOT / 'recall_server.py')!r}, run_name='__main__')\n"
    )
    return root


def test_server_tree_starts_that_checkouts_server_and_backfill(
    other_checkouts_run: tuple[dict[str, Any], Path],
) -> None:
    figures, started = other_checkouts_run
    # the backfill, then one server per k (3, 8, 10), all the other checkout's
    assert started.read_text().splitlines() == ["backfill", "", "", ""]
    assert figures["server"] == str(started.parent / "other")
    assert figures["by_category"]["single-hop"]["hit@8"] == 1.0


def test_the_readme_gets_the_locomo_table_and_never_reads_a_local_file(tmp_path: Path) -> None:
    history = to_history(sample())
    nothing = [NOTHING_FOUND] * (4 + len(history.off_topic))
    answers = {k: {history.user: Answers(nothing, [1.0] * len(nothing))} for k in (3, 8)}
    figures = score([history], answers)["figures"] | {
        "engine": "embedded", "data": "tiny.json", "load": {"how": "backfill", "load_s": 1.0},
        "wall_s": 60, "machine": "a test machine", "date": "2026-01-01",
    }  # fmt: skip
    results = tmp_path / "results"
    results.mkdir()
    (results / "locomo-embedded.json").write_text(json.dumps(figures))
    (results / "locomo-embedded-misses.local.json").write_text('{"misses": "Valparaiso"}')
    readme = tmp_path / "README.md"
    readme.write_text("# Bench\n<!-- locomo:begin -->\nold\n<!-- locomo:end -->\nafter\n")

    write_report(results, synthetic_too=False)

    text = readme.read_text()
    assert "| **overall** | 3 | 0.000 | 0.000 |" in text
    assert "| **all** | 21 | 0.000 | 0.000 |" in text
    assert "old" not in text and "Valparaiso" not in text
    assert text.startswith("# Bench\n<!-- locomo:begin -->\n") and text.endswith("end -->\nafter\n")
