"""Index runs in worker processes at background priority, so embedding never takes the server's
GIL or its cores from a request.

In the server's process an index run, even on a low-priority thread, shares the GIL with the
event loop: a background thread holding it while the kernel favours everything else stalled
every request behind it (benchmark/README.md, "Load": p99 of posts 21 ms without index runs, up
to 450 ms with them in-process). A worker is its own process: it can be given the leftovers of
the CPU without ever holding up the server.

Server side, `IndexWorkers`: at most `size` workers, started when first needed and kept (each
loads the model once), one request at a time each. A request is a line of JSON on the worker's
stdin, answered by a line of JSON on its stdout, ``{"error": null, ...}`` or ``{"error": "..."}``:

- ``{"home": ..., "timeout": ...}``: an index run of a files-store user (the embedded engine);
- ``{"embed": [text, ...]}``: the texts' vectors, ``{"error": null, "vectors": <base64 of the
  float32 rows>}`` (the PostgreSQL store's index runs, recall/pg/index.py: their reads and writes
  stay in the server, the embedding does not).

A request whose caller gives up (shutdown) or that overruns its timeout by far kills its
worker's process group: safe, since each flush is one SQLite or PostgreSQL transaction
(tests/test_crash.py kills whole servers mid-run), and the next request starts a fresh worker. An
idle worker found gone when a request reaches it (killed while idle, its exit not yet seen) is
replaced for that request; one that dies mid-request fails that run (EngineError), and the run
is retried later (the files store: at the next write or failed recall; PostgreSQL: when the
user is due again).

Worker side, ``python -m recall.files.engines.embedded.worker`` (`main` below, given the embedded
engine's index run; one program for both stores' workers): lowers its priority, dies with the
server (PR_SET_PDEATHSIG), loads the model, then answers requests until its stdin closes. With
EMBED_MODEL=multilingual-e5-small the model's engine runs in a child of the worker
(recall/multilingual.py), at its priority and in its process group (a kill takes both); a text
that crashes that engine is indexed without a vector, so no run fails on it again and again.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recall.concurrency import kill_group
from recall.domain.errors import EngineError
from recall.indexing.pieces import FLUSH_TEXTS
from recall.logs import configure_logging

if TYPE_CHECKING:  # onnxruntime is heavy: loaded in the worker process only
    from recall.embedder import Embedder

# Runs a files-store user's index run in the worker (home, embedder, timeout): the embedded
# engine's worker program passes it.
RunHome = Callable[[Path, "Embedder", float], None]

# A worker past its run's own deadline still stops at its next flush; past this much more, it is
# stuck (or one flush is enormous) and is killed.
KILL_AFTER_DEADLINE = 60.0
KILL_GRACE = 1.0  # seconds from SIGTERM to SIGKILL when a worker is killed (kill_group)
STARTUP_TIMEOUT = 120.0  # loading the model takes a second or two; far more means it is broken
# How much lower than the server a worker runs where SCHED_IDLE is missing (run_in_background):
# a worker gets about a tenth of a contended core; on an idle machine, all of it.
BACKGROUND_NICENESS = 10
# An answer is one line: a short one, or the vectors of one embed request (EMBED_TEXTS rows);
# anything longer is a broken worker.
EMBED_TEXTS = FLUSH_TEXTS  # texts per embed request: an index flush's worth
MAX_ANSWER_BYTES = 16 * 2**20
# What a broken or dead worker raises here: a closed pipe, an answer that is not ours, no answer.
WORKER_FAILURES = (OSError, ValueError, KeyError, TypeError, TimeoutError)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent thread ends
READY = b'{"ready": true}\n'  # the worker's first line: the model is loaded
# The workers' program, for both stores: `main` with the embedded engine's index run. Named, not
# imported: a server on PostgreSQL never loads the embedded engine's store in its own process.
WORKER_PROGRAM = "recall.files.engines.embedded.worker"


class WorkerExited(EngineError):
    """The worker's process was gone: its pipe closed before its answer."""


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.retirement: asyncio.TimerHandle | None = None  # while idle: when it is let go

    async def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request; the worker's answer (its "error" None when it succeeded)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise WorkerExited("embedded index worker exited before a run") from exc
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout + KILL_AFTER_DEADLINE)
        if not line.endswith(b"\n"):
            raise WorkerExited("embedded index worker exited during a run")
        answer = json.loads(line)
        if not isinstance(answer, dict) or "error" not in answer:
            raise ValueError("not an answer")
        return answer

    async def kill(self) -> None:
        await kill_group(self.proc, KILL_GRACE)


class IndexWorkers:
    """At most ``size`` index runs at once, each in a worker process of its own."""

    def __init__(
        self,
        size: int,
        model_dir: Path | None,
        pooling: str,
        *,
        int8: bool = False,
        model_name: str = "minilm",
        idle_exit: float = 60.0,
        log_level: str = "info",
        log_format: str = "text",
    ) -> None:
        self.idle_exit = idle_exit
        self._argv = [sys.executable, "-m", WORKER_PROGRAM, "--parent", str(os.getpid())]
        self._argv += ["--pooling", pooling, "--log-level", log_level, "--log-format", log_format]
        if model_dir is not None:
            self._argv += ["--model-dir", str(model_dir)]
        if int8:  # the server's own graph: a query must meet passages embedded the same way
            self._argv += ["--int8"]
        self._argv += ["--model", model_name]  # EMBED_MODEL: the same model as the queries'
        self._slots = asyncio.Semaphore(size)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()

    async def run(self, home: Path, timeout: float) -> None:
        """One index run of ``home`` in a worker, stopping at its next flush after ``timeout``
        seconds (the engine's INDEX_TIMEOUT)."""
        await self._call({"home": str(home), "timeout": timeout}, timeout)

    async def embed(self, texts: list[str], timeout: float) -> np.ndarray:
        """The texts' unit vectors, one float32 row each, embedded in workers (EMBED_TEXTS at a
        time); EngineError when a worker fails or overruns ``timeout`` by far."""
        parts = []
        for start in range(0, len(texts), EMBED_TEXTS):
            batch = texts[start : start + EMBED_TEXTS]
            answer = await self._call({"embed": batch}, timeout)
            try:
                rows = np.frombuffer(base64.b64decode(answer["vectors"]), dtype=np.float32)
                parts.append(rows.reshape(len(batch), -1))
            except (KeyError, TypeError, ValueError) as exc:
                raise EngineError("index worker answered no vectors") from exc
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)

    async def _call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        async with self._slots:
            # One that died while idle (the OOM killer, an operator) is replaced by a new one.
            self._idle = [w for w in self._idle if w.proc.returncode is None]
            if not self._idle:
                answer = await self._ask(await self._start(), request, timeout)
            else:
                try:
                    answer = await self._ask(self._idle.pop(), request, timeout)
                except WorkerExited:
                    # Its death may not have been seen yet (the loop learns of an exit a little
                    # later, longer on a busy machine): once more, on a new worker. Safe: each
                    # flush is one transaction, so a run or an embedding can start over.
                    answer = await self._ask(await self._start(), request, timeout)
        if answer["error"] is not None:
            raise EngineError(str(answer["error"]))
        return answer

    async def _ask(
        self, worker: _Worker, request: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        """``request`` on ``worker``, idle again afterwards; killed when it fails."""
        if worker.retirement is not None:
            worker.retirement.cancel()
        self._busy.add(worker)
        try:
            answer = await worker.ask(request, timeout)
        except BaseException as exc:  # cancelled, overran, died, or answered nonsense
            await worker.kill()
            if isinstance(exc, WORKER_FAILURES):
                raise EngineError(f"index worker failed: {type(exc).__name__}") from exc
            raise
        finally:
            self._busy.discard(worker)
        self._idle.append(worker)
        worker.retirement = asyncio.get_running_loop().call_later(
            self.idle_exit, self._retire, worker
        )
        return answer

    def _retire(self, worker: _Worker) -> None:
        """Let a worker idle for INDEX_WORKER_IDLE go, and the model's memory with it: it exits
        at the end of its input (the loop reaps it). The next run starts a new one."""
        if worker in self._idle:  # not taken by a run (which cancels this) nor found dead
            self._idle.remove(worker)
            assert worker.proc.stdin is not None
            worker.proc.stdin.close()

    async def _start(self) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            *self._argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            # Its own process group, so a kill takes all of it; but not its own session: with
            # the kernel's autogroups (a group per session) a worker in a session of its own gets
            # an equal share of the CPU with the server whatever its nice value.
            process_group=0,
            limit=MAX_ANSWER_BYTES,
        )
        worker = _Worker(proc)
        assert proc.stdout is not None
        try:
            first = await asyncio.wait_for(proc.stdout.readline(), STARTUP_TIMEOUT)
        except BaseException:
            await worker.kill()
            raise
        if first != READY:
            await worker.kill()
            raise EngineError("embedded index worker did not start (see its log lines)")
        return worker

    async def close(self) -> None:
        """Kill every worker: idle ones hold a model's memory, busy ones were cancelled."""
        workers, self._idle = [*self._idle, *self._busy], []
        for worker in workers:
            if worker.retirement is not None:
                worker.retirement.cancel()
        await asyncio.gather(*(w.kill() for w in workers))


# --- the worker process ---------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the server's thread that started it ends (Linux), so a killed
    server never leaves a worker writing an index the next server also writes."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)


def run_in_background() -> None:
    """Take the CPU only when the server and everything else at normal priority leave it idle.

    SCHED_IDLE, not only a nice value: a thread woken for a request preempts a SCHED_IDLE worker
    at once, while at +10 it waited out the worker's time slice, at each hand-off of a request
    (paced at 300 posts/s, p50 8-11 ms instead of 4). The nice value stays for systems without
    SCHED_IDLE."""
    os.nice(BACKGROUND_NICENESS)
    with contextlib.suppress(AttributeError, OSError):  # not Linux
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def main(run_home: RunHome, argv: list[str] | None = None) -> None:
    """The worker process: answers embed requests, and index runs of a files-store user's home
    with ``run_home``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--pooling", default="mean")
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", default="text")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    run_in_background()  # before the model: onnxruntime's threads inherit it
    configure_logging(args.log_level, args.log_format)  # the server's stderr, the server's format

    from recall.models import load_embedder

    embedder = load_embedder(args.model_dir, args.pooling, int8=args.int8, model=args.model)
    out = sys.stdout.buffer
    out.write(READY)
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        answer: dict[str, Any] = {"error": None}
        if "embed" in request:
            vectors = np.ascontiguousarray(embedder.embed(request["embed"]), dtype=np.float32)
            answer["vectors"] = base64.b64encode(vectors.tobytes()).decode("ascii")
        else:
            try:
                run_home(Path(request["home"]), embedder, float(request["timeout"]))
            except EngineError as exc:
                answer["error"] = str(exc)
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()
