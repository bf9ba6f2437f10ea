"""The index worker program, ``python -m recall.files.engines.embedded.worker``: the worker of
recall/indexing/workers.py (both stores' embed requests), which also runs a files-store user's
index runs (the ``{"home": ..., "timeout": ...}`` requests of `IndexWorkers.run`)."""

from __future__ import annotations

from pathlib import Path

from recall.embedder import Embedder
from recall.files.engines.embedded.engine import RunStop, index_sources
from recall.indexing import workers


def run_home(home: Path, embedder: Embedder, timeout: float) -> None:
    """One index run of ``home``, stopping at its next flush after ``timeout`` seconds."""
    index_sources(home, embedder, RunStop(timeout))


if __name__ == "__main__":
    workers.main(run_home)
