"""A larger RECALL_K or RECALL_CANDIDATES never loses a question a smaller one found (issue 34):
our own histories (ops, clinic; German, Spanish, Chinese), indexed by the embedded engine, each
question asked long and short at every setting of RECALL_K (3, 5, 8) x RECALL_CANDIDATES (8,
16, 32) at the issue's MAX_RESULT_CHARS (12,000), and at the default settings
(benchmark/monotone.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmark.monotone import GRID_CHARS, Setting, found_at, grid, losses
from benchmark.run import HISTORIES
from recall.models import load_embedder
from recall.ranking.search import MIN_SIMILARITY

# Small enough to index in seconds, large enough that today's near-identical facts compete.
SIZES = {"ops": 40, "clinic": 40, "de": 40, "es": 40, "zh": 40}
QUESTIONS = 20
DEFAULT = Setting(3, 8, 4_000)  # the default settings: every larger one finds what they find


@pytest.fixture(scope="module")
def embedder() -> Any:
    return load_embedder()


@pytest.mark.parametrize("name", sorted(SIZES))
async def test_a_larger_setting_finds_every_question_a_smaller_one_found(
    name: str, embedder: Any, tmp_path: Path
) -> None:
    make_history, _ = HISTORIES[name]
    history = make_history(SIZES[name], questions=QUESTIONS)
    settings = [*grid(GRID_CHARS), DEFAULT]
    found = await found_at(history, tmp_path / "home", embedder, settings, MIN_SIMILARITY)
    lost = [
        f"{mode} {history.questions[n].question!r}: found at k={a.k} candidates={a.candidates} "
        f"chars={a.max_chars}, not at k={b.k} candidates={b.candidates} chars={b.max_chars}"
        for a, b, mode, n in losses(found)
    ]
    assert not lost, "\n".join(lost[:10])
    assert found[settings[0]]["found"], "the history's questions find nothing: nothing compared"
