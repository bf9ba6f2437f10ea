"""A quality guard: the benchmark at 100 conversations, through the real server and MCP tool."""

from __future__ import annotations

from typing import Any

import pytest

from benchmark.run import measure


@pytest.fixture(scope="module")
def small_benchmark() -> dict[str, Any]:
    # (the in-process engine's latencies are not checked here: not measured)
    return measure(100, "embedded", questions=100, engine_alone_too=False)


@pytest.mark.parametrize("mode", ["long", "short"])
def test_the_right_passage_is_among_eight_for_almost_every_question(
    small_benchmark: dict[str, Any], mode: str
) -> None:
    assert small_benchmark[f"hit@8_{mode}"] >= 0.95, small_benchmark["misses_k8"]


@pytest.mark.parametrize("mode", ["long", "short"])
def test_the_right_passage_is_among_three_for_nine_questions_in_ten(
    small_benchmark: dict[str, Any], mode: str
) -> None:
    assert small_benchmark[f"hit@3_{mode}"] >= 0.9, small_benchmark["misses_k3"]


def test_a_new_conversation_becomes_searchable(small_benchmark: dict[str, Any]) -> None:
    assert small_benchmark["searchable_after_s"] != float("inf")
