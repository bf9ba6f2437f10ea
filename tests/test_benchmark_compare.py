"""Two benchmark runs compared answer by answer (benchmark/compare.py), and the answers file the
synthetic benchmark writes for it (benchmark/run.py --out), from a real server's tool answers."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from benchmark import compare, history_clinic, run
from benchmark.common import answer_record, answers_path, write_out


def write_run(out: Path, answers: dict[str, str], hit: float, query: str = "kiln") -> None:
    """An --out file of one synthetic run: k3, mode long, the answers given in order."""
    records = [answer_record(text, query=f"{query} {n}") for n, text in enumerate(answers.values())]
    figures = [{"history": "clinic", "size": 300, "hit@3_long": hit, "e2e": {"p50_ms": 12.5}}]
    write_out(out, figures, {"clinic-300-embedded k3": {"long": records}})


def test_compare_counts_identical_answers_and_names_the_ones_that_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    write_run(before, {"a": "first answer", "b": "second answer", "c": "third"}, 0.9)
    write_run(after, {"a": "first answer", "b": "second answer!", "c": "third", "d": "x"}, 0.8)

    assert compare.main([str(before), str(after)]) == 0

    printed = capsys.readouterr().out.splitlines()
    assert "identical answers: 2 of 3" in printed
    assert "  clinic-300-embedded k3: 2 of 3" in printed
    assert "  clinic-300-embedded k3/long/#2  'kiln 1'" in printed  # the second answer differs
    assert "only in B: 1 (clinic-300-embedded k3/long/#4)" in printed
    assert "| [0] hit@3_long | 0.9 | 0.8 |" not in printed  # one run each: no position label
    assert "| hit@3_long | 0.9 | 0.8 |" in printed
    assert "| e2e.p50_ms | 12.5 | 12.5 |" in printed
    assert "| size | 300 | 300 |" in printed
    assert not any(line.startswith("| history") for line in printed)  # numbers only


def test_compare_wants_the_answers_file_beside_each_run(tmp_path: Path) -> None:
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    write_run(before, {"a": "one"}, 0.9)
    write_run(after, {"a": "one"}, 0.9)
    answers_path(after).unlink()

    with pytest.raises(SystemExit):
        compare.main([str(before), str(after)])


def test_the_locomo_answers_file_compares_by_k_and_history(tmp_path: Path) -> None:
    served = [["session-1", "D1-3"]]
    one = {"3": {"conv-1": [answer_record("x", served=served), answer_record("y", served=[])]}}
    other = {"3": {"conv-1": [answer_record("x", served=served), answer_record("z", served=[])]}}
    write_out(tmp_path / "a.json", [{"R@5": 0.5}], one)
    write_out(tmp_path / "b.json", [{"R@5": 0.5}], other)

    lines = compare.report(tmp_path / "a.json", tmp_path / "b.json")

    assert "identical answers: 1 of 2" in lines
    assert "  3/conv-1/#2" in lines


def test_the_answers_file_holds_the_digest_of_each_tool_answer_by_k_mode_and_question(
    tmp_path: Path,
) -> None:
    history = history_clinic.generate(12, seed=3, questions=3)
    live = run.server(tmp_path, "embedded", 3)
    with live.start(timeout=120):
        run.load_by_posting(live, history)
        result = asyncio.run(run.ask(live, history.questions, 3))
        again = {
            query: asyncio.run(live.recall(run.USER, query))
            for q in history.questions
            for query in (q.question, q.short_query)
        }

    records = result["answers_k3"]
    assert [r["query"] for r in records["long"]] == [q.question for q in history.questions]
    assert [r["query"] for r in records["short"]] == [q.short_query for q in history.questions]
    for record in records["long"] + records["short"]:
        text = again[record["query"]]  # the same query asked again: the same answer
        assert record["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert len({r["sha256"] for r in records["long"]}) == len(history.questions)
    assert "answers_k3" not in json.dumps(result["misses_k3"])
