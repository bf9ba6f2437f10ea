"""Two benchmark runs side by side: are the answers the same, to the byte, and the figures.

    python -m benchmark.compare BEFORE.json AFTER.json [--show 20]

A and B are `--out` files of benchmark/locomo.py or benchmark/run.py (the same benchmark and
data); beside each, its OUT.answers.local.json holds every answer's SHA-256 (benchmark/common.py).
Printed: how many answers are identical of how many both runs gave, per run and k and overall;
which differ (their place: run, k, mode or history, question number and, for the synthetic
histories, the query); answers only one run gave; then every figure of the two runs, side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.common import answers_path

Digests = dict[tuple[str, ...], dict[str, Any]]  # an answer's place -> its record


def digests(tree: Any, place: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict]]:
    """Every answer record of an answers file with its place: the keys down to it and, in a
    list, its number (from 1, as the question's)."""
    if isinstance(tree, dict) and "sha256" in tree:
        yield place, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from digests(value, (*place, str(key)))
    elif isinstance(tree, list):
        for number, value in enumerate(tree, start=1):
            yield from digests(value, (*place, f"#{number}"))


def numbers(tree: Any, place: str = "") -> Iterator[tuple[str, float]]:
    """Every number of a figures tree, by its dotted place (lists by position)."""
    if isinstance(tree, bool):
        return
    if isinstance(tree, int | float):
        yield place, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from numbers(value, f"{place}.{key}" if place else str(key))
    elif isinstance(tree, list):
        for number, value in enumerate(tree):
            yield from numbers(value, f"{place}[{number}]")


@dataclass
class Comparison:
    # [same, of] by the places' first key ("clinic-300-embedded k3"; LoCoMo: the k)
    identical: dict[str, list[int]]
    differ: list[tuple[str, ...]]
    only_in_a: list[tuple[str, ...]]
    only_in_b: list[tuple[str, ...]]
    queries: dict[tuple[str, ...], str]  # the query of an answer, where the record names it


def compare_answers(a: Digests, b: Digests) -> Comparison:
    result = Comparison({}, [], [], [], {})
    for place, record in a.items():
        if place not in b:
            result.only_in_a.append(place)
            continue
        same = record["sha256"] == b[place]["sha256"]
        counts = result.identical.setdefault(place[0], [0, 0])
        counts[0] += same
        counts[1] += 1
        if not same:
            result.differ.append(place)
            if "query" in record:
                result.queries[place] = record["query"]
    result.only_in_b = [place for place in b if place not in a]
    return result


def load(out: Path) -> tuple[list[dict[str, Any]], Digests]:
    figures = json.loads(out.read_text())
    answers = json.loads(answers_path(out).read_text())
    return figures, dict(digests(answers))


def figures_table(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """One row per number either run has (runs paired by position), A and B side by side."""
    rows = ["| figure | A | B |", "| --- | --- | --- |"]
    for number, (one, other) in enumerate(zip(a, b, strict=False)):
        mine, theirs = dict(numbers(one)), dict(numbers(other))
        prefix = f"[{number}] " if len(a) > 1 else ""
        for place in dict.fromkeys([*mine, *theirs]):
            left, right = mine.get(place, "-"), theirs.get(place, "-")
            rows.append(f"| {prefix}{place} | {left} | {right} |")
    return rows


def report(a_path: Path, b_path: Path, show: int = 20) -> list[str]:
    a_figures, a_answers = load(a_path)
    b_figures, b_answers = load(b_path)
    found = compare_answers(a_answers, b_answers)
    same = sum(counts[0] for counts in found.identical.values())
    both = sum(counts[1] for counts in found.identical.values())
    lines = [f"A: {a_path}", f"B: {b_path}", f"identical answers: {same} of {both}"]
    lines += [f"  {key}: {n} of {of}" for key, (n, of) in found.identical.items()]
    if found.differ:
        lines.append(f"differ ({len(found.differ)}, the first {min(show, len(found.differ))}):")
        for place in found.differ[:show]:
            query = f"  {found.queries[place]!r}" if place in found.queries else ""
            lines.append(f"  {'/'.join(place)}{query}")
    for name, missing in (("only in A", found.only_in_a), ("only in B", found.only_in_b)):
        if missing:
            lines.append(f"{name}: {len(missing)} ({', '.join('/'.join(p) for p in missing[:5])})")
    if len(a_figures) != len(b_figures):
        lines.append(f"runs: {len(a_figures)} in A, {len(b_figures)} in B (paired by position)")
    return [*lines, "", *figures_table(a_figures, b_figures)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compare two benchmark --out files.")
    parser.add_argument("a", type=Path, help="one run's --out file (e.g. before)")
    parser.add_argument("b", type=Path, help="the other's (e.g. after)")
    parser.add_argument("--show", type=int, default=20, help="differing answers listed")
    args = parser.parse_args(argv)
    for out in (args.a, args.b):
        if not out.is_file() or not answers_path(out).is_file():
            parser.error(f"{out}: wants the --out file and its {answers_path(out).name}")
    print("\n".join(report(args.a, args.b, args.show)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
