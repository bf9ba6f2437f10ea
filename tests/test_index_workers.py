"""The embedded engine's index runs embed in worker processes at background priority, on either
store, so that they never hold the server's GIL or its cores when a request needs them; a worker
that dies is replaced, and no worker outlives its server."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import Backing, Server, conversation, make_server, wait_for
from test_embedded_server import long_conversation, timed_posts

from recall.files.scheduler import needs_index
from recall.indexing.workers import BACKGROUND_NICENESS, IndexWorkers

WORKER_MODULE = "recall.files.engines.embedded.worker"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_backing: Backing) -> Iterator[Server]:
    """One server per store for the tests that look at and kill its workers, a user each (a
    start and its first worker are ~3 CPU-s)."""
    settings = {"ENGINE": "embedded", "INDEX_DEBOUNCE": "0.1", **module_backing.settings}
    with make_server(tmp_path_factory.mktemp("workers"), **settings).start() as server:
        yield server


# What either store logs when an index run fails ("index run failed: ...", "index run of user
# <hash> failed: ...").
RUN_FAILED = re.compile(r"index run (of user \S+ )?failed")


def workers(server_pid: int) -> list[psutil.Process]:
    """The server's live index workers."""
    found = []
    for child in psutil.Process(server_pid).children():
        try:
            if WORKER_MODULE in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def thread_scheduling(pid: int) -> set[tuple[int, int]]:
    """The (nice value, scheduling policy) of every thread of a process (onnxruntime's threads
    included), from /proc/PID/task/TID/stat: fields 19 and 41."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # field 3 onwards
        found.add((int(fields[16]), int(fields[38])))
    return found


def pump_post_indexed(server: Server, user: str = "alice") -> int:
    """Post the user's pump conversation and wait for its index run; the server's pid."""
    assert server.post(conversation(user, "pump", "The pump P-7 seal leaks again."))[0] == 202
    server.wait_indexed(user)
    assert server.process is not None
    return server.process.pid


async def test_index_runs_embed_in_a_background_worker_in_the_servers_session(
    server: Server,
) -> None:
    # given a post, indexed
    pid = pump_post_indexed(server)
    # when we look at the server's processes
    found = workers(pid)
    # then the run was a worker's: its own process group (a kill takes all of it), but the
    # server's session (the kernel's autogroup: in a session of its own, a worker would get as
    # much CPU as the server whatever its priority), every thread of it niced and SCHED_IDLE
    assert found, "no index worker: the index run embedded in the server's own process"
    server_nice = os.getpriority(os.PRIO_PROCESS, pid)
    for worker in found:
        assert os.getpgid(worker.pid) == worker.pid != os.getpgid(pid)
        assert os.getsid(worker.pid) == os.getsid(pid)
        assert thread_scheduling(worker.pid) == {(server_nice + BACKGROUND_NICENESS, os.SCHED_IDLE)}
    # the server itself keeps its priority
    assert thread_scheduling(pid) == {(server_nice, os.SCHED_OTHER)}
    # and what it indexed is found
    assert "P-7 seal leaks" in await server.recall("alice", "pump P-7 seal")


async def test_a_killed_worker_is_replaced_and_later_posts_are_still_indexed(
    server: Server,
) -> None:
    # given a worker, idle after indexing bob's first post
    pid = pump_post_indexed(server, "bob")
    killed = workers(pid)
    assert killed
    # when it is killed (the OOM killer, an operator), then bob posts again
    for worker in killed:
        worker.send_signal(signal.SIGKILL)
    wait_for(lambda: not any(alive(w) for w in killed))
    body = conversation("bob", "valve", "Valve V-12 was replaced on Tuesday.")
    assert server.post(body)[0] == 202
    # then a new worker indexes it, and recall finds it
    server.wait_indexed("bob", timeout=300)
    assert "V-12 was replaced" in await server.recall("bob", "valve V-12")
    assert not {w.pid for w in killed} & {w.pid for w in workers(pid)}
    assert not RUN_FAILED.search(server.log())


async def test_a_worker_dead_before_its_exit_is_seen_is_replaced_for_the_same_request() -> None:
    # given one idle worker, after a first embedding
    pool = IndexWorkers(1, None, "mean", idle_exit=60)
    try:
        first = await pool.embed(["Valve V-12 was replaced on Tuesday."], 120)
        (worker,) = workers(os.getpid())
        # when it is killed and the event loop has not yet run since (on a busy machine the
        # loop learns of an exit late): a blocking sleep, so no callback of the loop runs
        worker.send_signal(signal.SIGKILL)
        time.sleep(0.5)
        # then the next request is answered anyway, by a new worker
        again = await pool.embed(["Valve V-12 was replaced on Tuesday."], 120)
        assert np.allclose(first, again)
        assert worker.pid not in {w.pid for w in workers(os.getpid())}
    finally:
        await pool.close()


def busy(process: psutil.Process) -> bool:
    """Whether the process used CPU in the last half second (an index run embedding)."""
    before = sum(process.cpu_times()[:2])
    time.sleep(0.5)
    return sum(process.cpu_times()[:2]) > before + 0.05


def test_a_worker_dies_with_its_server_even_in_the_middle_of_a_run(tmp_path: Path) -> None:
    # given one long index run going on: twenty histories of forty long turns, posted at once
    server = make_server(tmp_path, ENGINE="embedded", INDEX_DEBOUNCE="0.5").start()
    try:
        timed_posts(server, [long_conversation("alice", f"history-{n}", 40) for n in range(20)])
        assert server.process is not None
        pid = server.process.pid
        wait_for(lambda: workers(pid), timeout=60)
        running = workers(pid)
        assert all(busy(w) for w in running), "no run going on: the test would prove nothing"
        # when the server is killed outright, with no chance to stop its workers
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        # then its workers die with it at once, none going on writing an index that the next
        # server writes too (else a worker would finish its run, then see its stdin close)
        wait_for(lambda: not any(alive(w) for w in running), timeout=3)
        assert needs_index(server.home("alice"), "embedded"), "the run ended before the kill"
    finally:
        server.stop()


async def test_an_idle_worker_exits_and_the_next_post_starts_a_new_one(
    tmp_path: Path, backing: Backing
) -> None:
    # given a server whose workers exit after a second idle, and alice's first post indexed
    settings = {"ENGINE": "embedded", "INDEX_DEBOUNCE": "0.1", "INDEX_WORKER_IDLE": "1"}
    settings |= backing.settings
    with make_server(tmp_path, **settings).start() as server:
        pid = pump_post_indexed(server)
        first = workers(pid)
        assert first
        # when nothing is posted for a while
        wait_for(lambda: not workers(pid), timeout=30)
        # then the worker is gone (its model's memory with it), and a later post still indexes
        assert server.post(conversation("alice", "valve", "Valve V-12 was replaced."))[0] == 202
        server.wait_indexed("alice", timeout=300)
        assert "V-12 was replaced" in await server.recall("alice", "valve V-12")
        assert not RUN_FAILED.search(server.log())
