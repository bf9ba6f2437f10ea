"""Whether a larger setting ever loses what a smaller one found (issue 34), and the synthetic
histories' hit rates in-process, for ranking work:

    python -m benchmark.monotone                          # ops, clinic 300; de, es, zh 80
    python -m benchmark.monotone --histories zh --size 80 --workdir /tmp/idx  # index kept

Each history is written as the files store writes it and indexed once by the embedded engine;
every question, long and short, is then asked of engine objects at each setting of a grid
(RECALL_K x RECALL_CANDIDATES at one MAX_RESULT_CHARS) and at the recorded benchmark's two
settings (k=3 at 4,000 characters, k=8 at 12,000: benchmark/run.py's). A question is found when
its answer string is in the tool's text (run.py's rule). A *loss* is a question found at a
setting and not at one at least as large in every knob: tests/test_monotone.py requires none.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.common import machine, timing
from benchmark.history import History
from benchmark.run import CAP, HISTORIES
from recall.domain.conversation import parse_conversation, user_dir_name
from recall.files.layout import write_conversation

USER = "bench-user"
KS = (3, 5, 8)
CANDIDATES = (8, 16, 32)
GRID_CHARS = 12_000  # the MAX_RESULT_CHARS, with RECALL_K 8 and RECALL_CANDIDATES 30
# The recorded benchmark's settings (run.py: RECALL_CANDIDATES at its default, raised to k).
RECORDED = {3: (3, 8, CAP[3]), 8: (8, 8, CAP[8])}
SIZES = {"ops": 300, "clinic": 300, "de": 80, "es": 80, "zh": 80}


@dataclass(frozen=True, order=True)
class Setting:
    k: int
    candidates: int
    max_chars: int

    def covers(self, other: Setting) -> bool:
        """Whether this setting is at least ``other`` in every knob (and not the same)."""
        return (
            self != other
            and self.k >= other.k
            and self.candidates >= other.candidates
            and self.max_chars >= other.max_chars
        )


def grid(max_chars: int = GRID_CHARS) -> list[Setting]:
    return [Setting(k, c, max_chars) for k, c in itertools.product(KS, CANDIDATES)]


def engine_at(embedder: Any, setting: Setting, min_similarity: float) -> Any:
    from recall.files.engines.embedded.engine import EmbeddedEngine

    return EmbeddedEngine(
        embedder,
        k=setting.k,
        candidates=setting.candidates,
        max_chars=setting.max_chars,
        min_similarity=min_similarity,
        recall_concurrency=1,
    )


async def found_at(
    history: History, home: Path, embedder: Any, settings: Iterable[Setting], min_similarity: float
) -> dict[Setting, dict[str, Any]]:
    """Index ``history`` into ``home`` (once), then per setting: which questions (long, short)
    found their answer, and the recall latencies."""
    home.mkdir(parents=True, exist_ok=True)
    for body in history.conversations:
        write_conversation(home, parse_conversation(body))
    settings = list(settings)
    await engine_at(embedder, settings[0], min_similarity).index(home)
    result: dict[Setting, dict[str, Any]] = {}
    for setting in settings:
        engine = engine_at(embedder, setting, min_similarity)
        found: set[tuple[str, int]] = set()
        latencies: list[float] = []
        for mode in ("long", "short"):
            for n, q in enumerate(history.questions):
                started = time.perf_counter()
                answer = await engine.recall(home, q.question if mode == "long" else q.short_query)
                latencies.append((time.perf_counter() - started) * 1000)
                if q.answer in answer.text:
                    found.add((mode, n))
        result[setting] = {"found": found, "latencies": latencies}
    return result


def losses(found: dict[Setting, dict[str, Any]]) -> list[tuple[Setting, Setting, str, int]]:
    """Every (smaller, larger, mode, question) found at the smaller setting and not the larger."""
    return [
        (small, large, mode, n)
        for small, large in itertools.permutations(found, 2)
        if large.covers(small)
        for mode, n in sorted(found[small]["found"] - found[large]["found"])
    ]


def embedder_and_floor() -> tuple[Any, float]:
    from recall.embedder import PACKAGED
    from recall.models import load_embedder
    from recall.settings import MODEL_MIN_SIMILARITY

    model = os.environ.get("EMBED_MODEL", PACKAGED)
    return load_embedder(None, model=model), MODEL_MIN_SIMILARITY[model]


def measure(name: str, size: int, workdir: Path, embedder: Any, floor: float) -> dict[str, Any]:
    make_history, questions = HISTORIES[name]
    history = make_history(size, questions=questions)
    home = workdir / f"{name}-{size}" / user_dir_name(USER)
    settings = [*grid(), *(Setting(*s) for s in RECORDED.values())]
    found = asyncio.run(found_at(history, home, embedder, dict.fromkeys(settings), floor))
    count = len(history.questions)
    figures: dict[str, Any] = {"history": name, "size": size, "questions": count}
    for k, s in RECORDED.items():
        hits = found[Setting(*s)]["found"]
        for mode in ("long", "short"):
            figures[f"hit@{k}_{mode}"] = round(sum(m == mode for m, _ in hits) / count, 3)
    figures["recall_k3"] = timing(found[Setting(*RECORDED[3])]["latencies"])
    lost = losses({s: found[s] for s in grid()})
    figures["losses"] = len(lost)
    figures["lost_questions"] = len({(mode, n) for _, _, mode, n in lost})
    figures["loss_examples"] = [
        f"{mode} {history.questions[n].answer}: found at k={a.k} c={a.candidates}, "
        f"lost at k={b.k} c={b.candidates}"
        for a, b, mode, n in lost[:5]
    ]
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", nargs="+", choices=sorted(SIZES), default=list(SIZES))
    parser.add_argument("--size", type=int, help="conversations (default: each history's)")
    parser.add_argument("--workdir", type=Path, help="keep the indexes here (reused if there)")
    parser.add_argument("--out", type=Path, help="also write the figures (JSON) here")
    args = parser.parse_args(argv)
    embedder, floor = embedder_and_floor()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-monotone-") as tmp:
        workdir = args.workdir or Path(tmp)
        for name in args.histories:
            figures = measure(name, args.size or SIZES[name], workdir, embedder, floor)
            print(json.dumps(figures), flush=True)
            runs.append(figures)
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
