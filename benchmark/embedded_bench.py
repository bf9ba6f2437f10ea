"""Measure the embedded engine on one synthetic user: load, backfill, recall latency and quality.

    python -m benchmark.embedded_bench [N] [--questions 100] [--seed 7] [--dir DIR]

Builds a user with N six-turn conversations (default 10,000) through the write path's own
functions, indexes them from scratch, then asks 100 questions twice (the long paraphrased
question and the short agent-style query) at k=3 and k=8. A hit means the answer string is in
the text the agent would read. Prints the figures the brief sets targets for (2-core machine,
10,000 conversations): recall p50 <= 30 ms and p95 <= 80 ms, model load <= 2 s, RSS <= 400 MB
with the index cached, backfill <= 10 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recall.conversations import parse_conversation, write_conversation
from recall.embedder import load_embedder
from recall.engines.embedded import EmbeddedEngine, db_path


@dataclass
class Question:
    question: str
    short_query: str
    answer: str


def synthetic(n: int, seed: int, questions: int) -> tuple[list[dict[str, Any]], list[Question]]:
    """benchmark.history when it is there (ground truth with paraphrases), else plain text."""
    try:
        from benchmark.history import generate
    except ImportError:
        return _plain(n, questions)
    history = generate(n, seed=seed, questions=questions)
    qs = [Question(q.question, q.short_query, q.answer) for q in history.questions]
    return history.conversations, qs


def _plain(n: int, questions: int) -> tuple[list[dict[str, Any]], list[Question]]:
    bodies = []
    for i in range(n):
        day = f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}"
        texts = [
            f"Morning, checking on the work for site {i % 97}.",
            "Noted, anything specific?",
            f"Ticket QX-{i:05d} is open for the pump {i % 311} seal leak.",
            "Logged it.",
            "Thanks, that's all.",
            "Have a good shift.",
        ]
        turns = [
            {"role": ("user", "assistant")[t % 2], "text": text, "ts": f"{day}T09:0{t}:00Z"}
            for t, text in enumerate(texts)
        ]
        bodies.append({"user": "bench", "conversation_id": f"c{i:06d}", "turns": turns})
    step = max(n // questions, 1)
    qs = [
        Question(
            f"which ticket covers the pump {i % 311} seal leak",
            f"pump {i % 311} seal",
            f"QX-{i:05d}",
        )
        for i in range(0, n, step)
    ][:questions]
    return bodies, qs


def rss_mb() -> tuple[float, float]:
    """Current and peak resident memory of this process, in MB."""
    status = Path("/proc/self/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    current = int(fields["VmRSS"].split()[0]) / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return current, peak


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


async def run(n: int, seed: int, questions: int, root: Path) -> None:
    home = root / "user"
    bodies, qs = synthetic(n, seed, questions)
    started = time.perf_counter()
    for body in bodies:
        write_conversation(home, parse_conversation(body))
    turns = sum(len(body["turns"]) for body in bodies)
    took = time.perf_counter() - started
    print(f"sources: {n} conversations, {turns} turns written in {took:.1f} s")

    started = time.perf_counter()
    embedder = load_embedder()
    print(f"model load: {time.perf_counter() - started:.2f} s")

    engine3 = EmbeddedEngine(embedder, k=3, candidates=8)
    engine8 = EmbeddedEngine(embedder, k=8, candidates=16)
    started = time.perf_counter()
    await engine3.index(home)
    took = time.perf_counter() - started
    print(f"backfill: {took:.1f} s, {turns / took:.0f} turns/s, {n / took:.1f} conversations/s")
    path = db_path(home)
    size = sum(p.stat().st_size for p in path.parent.iterdir() if p.name.startswith(path.name))
    print(f"db size: {size / 1e6:.1f} MB ({size / turns:.0f} B per turn)")

    started = time.perf_counter()
    await engine3.recall(home, "warm up")  # loads and caches the matrix
    print(f"first recall (loads the matrix): {(time.perf_counter() - started) * 1000:.0f} ms")
    started = time.perf_counter()
    await engine3.index(home)
    print(f"index run with nothing new: {(time.perf_counter() - started) * 1000:.0f} ms")
    await engine3.recall(home, "warm up")

    for label, pick in (
        ("question", lambda q: q.question),
        ("short query", lambda q: q.short_query),
    ):
        latencies: list[float] = []
        hit3 = hit8 = 0
        for q in qs:
            started = time.perf_counter()
            out3 = await engine3.recall(home, pick(q))
            latencies.append((time.perf_counter() - started) * 1000)
            hit3 += q.answer in out3
            hit8 += q.answer in await engine8.recall(home, pick(q))
        print(
            f"{label}: hit@3 {hit3}/{len(qs)}, hit@8 {hit8}/{len(qs)}; recall latency "
            f"p50 {statistics.median(latencies):.1f} ms, p95 {percentile(latencies, 0.95):.1f} ms"
        )
    current, peak = rss_mb()
    print(f"RSS: {current:.0f} MB now (index cached for one user), peak {peak:.0f} MB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int, nargs="?", default=10_000, help="conversations")
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", type=Path, help="keep the user's home here (default: a temp dir)")
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="embedded-bench-"))
    try:
        asyncio.run(run(args.n, args.seed, args.questions, root))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
