"""What RECALL_RERANK costs a recall: one LoCoMo history in the embedded engine, in this process,
each question asked without and with the cross-encoder, alternately (so load on a shared
machine falls on both alike), at the default settings. Prints p50 / p95 of each and the ratio.

    python -m benchmark.rerank_cost ../shared/data/locomo-dev.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmark.common import percentile
from benchmark.locomo import DEFAULT_DATA, load_locomo
from recall.domain.conversation import parse_conversation, user_dir_name
from recall.files.engines.embedded.engine import EmbeddedEngine
from recall.files.layout import write_conversation
from recall.models import load_embedder
from recall.reranker import CrossEncoder


async def measure(data: Path, workdir: Path) -> dict[str, list[float]]:
    history = load_locomo(data)[0]
    home = workdir / user_dir_name(history.user)
    for body in history.bodies:
        write_conversation(home, parse_conversation(body))
    embedder = load_embedder(None)
    engines = {
        "off": EmbeddedEngine(embedder),
        "on": EmbeddedEngine(embedder, reranker=CrossEncoder()),
    }
    await engines["off"].index(home)
    for engine in engines.values():
        await engine.recall(home, "warm up")
    took: dict[str, list[float]] = {name: [] for name in engines}
    for question in history.questions:
        for name, engine in engines.items():
            started = time.perf_counter()
            await engine.recall(home, question.text)
            took[name].append(1000 * (time.perf_counter() - started))
    return took


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-rerank-") as tmp:
        took = asyncio.run(measure(args.data, Path(tmp)))
    for name, values in took.items():
        print(
            f"RECALL_RERANK={name}: {len(values)} recalls, p50 {statistics.median(values):.1f} ms, "
            f"p95 {percentile(values, 0.95):.1f} ms"
        )
    ratio = statistics.median(took["on"]) / statistics.median(took["off"])
    print(f"p50 ratio on / off: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
