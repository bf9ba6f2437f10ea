"""The embedded engine's threads: its own bounded pools, cancellation that waits for the thread,
and an index run that stops at INDEX_TIMEOUT between flushes. Real model, real SQLite; the
embedder is the real one, wrapped to hold or slow its calls so the timing is under the test's
control."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from recall.concurrency import usable_cores
from recall.domain.conversation import parse_conversation
from recall.domain.errors import EngineError
from recall.embedder import Embedder, OnnxEmbedder
from recall.files.engines.embedded.engine import EmbeddedEngine
from recall.files.engines.embedded.store import db_path
from recall.files.layout import write_conversation
from recall.indexing.pieces import FLUSH_TEXTS
from recall.models import load_embedder


class HeldEmbedder:
    """The real embedder; each call waits until the test opens the gate, and calls in flight
    are counted."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.fingerprint = inner.fingerprint
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self.embed(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.entered.release()
        try:
            self.gate.wait(30)
            return self.inner.embed(texts)
        finally:
            with self._lock:
                self.running -= 1
            self.finished.set()


class SlowEmbedder:
    """The real embedder, taking `delay` seconds longer per call."""

    def __init__(self, inner: Embedder, delay: float) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.fingerprint = inner.fingerprint
        self.delay = delay

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self.embed(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        time.sleep(self.delay)
        return self.inner.embed(texts)


@pytest.fixture(scope="module")
def embedder() -> OnnxEmbedder:
    return load_embedder()


def post(home: Path, cid: str, *texts: str) -> None:
    turns = [
        {"role": ("user", "assistant")[i % 2], "text": text, "ts": f"2026-03-02T10:{i:02d}:00Z"}
        for i, text in enumerate(texts)
    ]
    body = {"user": "alice", "conversation_id": cid, "turns": turns}
    write_conversation(home, parse_conversation(body))


@pytest.fixture(scope="module")
def memory(embedder: OnnxEmbedder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("threads") / "user"
    post(home, "c-login", "Summarise ticket MT-4471?", "MT-4471 is owned by Priya Raman.")
    post(home, "c-aircon", "Is there a ticket for the aircon?", "Yes, F-204, Marcus Lee.")
    asyncio.run(EmbeddedEngine(embedder).index(home))
    return home


async def wait_entered(held: HeldEmbedder, count: int = 1) -> None:
    for _ in range(count):
        assert await asyncio.to_thread(held.entered.acquire, True, 30)


async def test_a_cancelled_recall_returns_only_once_its_thread_is_done(
    embedder: OnnxEmbedder, memory: Path
) -> None:
    # Given a recall whose thread is inside the model
    held = HeldEmbedder(embedder)
    engine = EmbeddedEngine(held)
    recall = asyncio.create_task(engine.recall(memory, "MT-4471"))
    await wait_entered(held)
    # When it is cancelled (the server's timeout)
    recall.cancel()
    await asyncio.sleep(0.5)
    # Then it has not returned: its thread is still working, so whatever bounds it stays held
    assert not recall.done()
    held.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await recall
    assert held.finished.is_set() and held.running == 0


async def test_recalls_never_use_more_threads_than_recall_concurrency(
    embedder: OnnxEmbedder, memory: Path
) -> None:
    # Given an engine allowed two recalls at once, and six recalls that are all cancelled
    held = HeldEmbedder(embedder)
    engine = EmbeddedEngine(held, recall_concurrency=2)
    recalls = [asyncio.create_task(engine.recall(memory, "MT-4471")) for _ in range(6)]
    await wait_entered(held, 2)
    for recall in recalls:
        recall.cancel()
    await asyncio.sleep(0.5)
    # When the held calls are let go
    held.gate.set()
    await asyncio.gather(*recalls, return_exceptions=True)
    # Then no more than two recall threads ever ran (one, on a single core), and the four
    # queued ones never started
    assert held.most == min(2, usable_cores())
    assert (await asyncio.wait_for(engine.recall(memory, "MT-4471"), 30)).text  # the pool is free


async def test_recalls_compute_on_no_more_threads_than_the_process_has_cores(
    embedder: OnnxEmbedder, memory: Path
) -> None:
    # Given more recalls allowed at once than this process has cores, and that many recalls
    cores = usable_cores()
    held = HeldEmbedder(embedder)
    engine = EmbeddedEngine(held, recall_concurrency=cores + 2)
    recalls = [asyncio.create_task(engine.recall(memory, "MT-4471")) for _ in range(cores + 2)]
    # When one per core is inside the model
    await wait_entered(held, cores)
    await asyncio.sleep(0.5)
    # Then the others wait for a thread rather than contend for the cores, and all are answered
    assert held.most == cores
    held.gate.set()
    answers = await asyncio.wait_for(asyncio.gather(*recalls), 60)
    assert all("MT-4471" in answer.text for answer in answers)


def many_conversations(home: Path, count: int) -> None:
    for n in range(count):
        post(home, f"c-note-{n}", f"Note {n} about the K-{n} line.", f"Noted, K-{n} is fine.")


def indexed_conversations(home: Path) -> int:
    con = sqlite3.connect(db_path(home))
    try:
        return con.execute("SELECT count(*) FROM files").fetchone()[0]
    finally:
        con.close()


async def test_an_index_run_past_its_timeout_stops_between_flushes_and_keeps_what_it_wrote(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given more conversations than one flush embeds, and a model slower than INDEX_TIMEOUT
    home = tmp_path / "user"
    many_conversations(home, FLUSH_TEXTS)  # two pieces each: at least two flushes
    engine = EmbeddedEngine(SlowEmbedder(embedder, delay=2.0), index_timeout=1.0)
    # When the run is past its deadline after its first flush
    with pytest.raises(EngineError, match="timed out after 1s"):
        await engine.index(home)
    # Then what the first flush committed is there and searchable, the rest is not yet
    done = indexed_conversations(home)
    assert 0 < done < FLUSH_TEXTS
    assert "Note 1 about" in (await engine.recall(home, "K-1 line")).text  # in the first flush
    # And the next run with time to spare completes it, from where the first stopped
    await EmbeddedEngine(embedder).index(home)
    assert indexed_conversations(home) == FLUSH_TEXTS


async def test_a_cancelled_index_run_stops_at_its_next_flush_and_returns_only_then(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    # Given an index run whose thread is inside the model, with more flushes to go
    home = tmp_path / "user"
    many_conversations(home, FLUSH_TEXTS)
    held = HeldEmbedder(embedder)
    engine = EmbeddedEngine(held)
    run = asyncio.create_task(engine.index(home))
    await wait_entered(held)
    # When it is cancelled (the server shutting down)
    run.cancel()
    await asyncio.sleep(0.5)
    assert not run.done()  # its thread is still in the model
    held.gate.set()
    # Then it returns once the thread has committed that flush and stopped before the next
    with pytest.raises(asyncio.CancelledError):
        await run
    assert held.running == 0
    assert 0 < indexed_conversations(home) < FLUSH_TEXTS
