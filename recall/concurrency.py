"""Bounded work: thread hops into dedicated pools, and calls bounded in number and in time.

asyncio's default pool is shared by everything that uses `asyncio.to_thread`; long index runs in
it starved the durable write behind a 202 and the recalls. So each kind of work gets its own
bounded pool, and a bound (a recall slot) is held until the work has really stopped, not merely
until its caller gave up on it: a thread cannot be killed, and a subprocess takes a moment to die.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

T = TypeVar("T")


async def run_in(
    pool: Executor,
    fn: Callable[..., T],
    *args: Any,
    on_cancel: Callable[[], None] | None = None,
) -> T:
    """``fn(*args)`` on a thread of ``pool``.

    On cancellation, a call that has not started is dropped; a running one cannot be stopped,
    so ``on_cancel`` (if given) asks it to stop early and we wait for its thread to finish before
    re-raising. Whoever bounds this call (a slot, a pool) stays bounded until the work has ended.
    """
    work = pool.submit(fn, *args)
    done = asyncio.wrap_future(work)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        if not work.cancel():  # already running on its thread
            if on_cancel is not None:
                on_cancel()
            while not done.done():
                try:
                    await asyncio.wait([done])  # never cancels `done` itself
                except asyncio.CancelledError:
                    continue  # cancelled again: still nothing to do but wait for the thread
            if not done.cancelled():
                done.exception()  # retrieved: nobody is left to read the result
        raise


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a run abandoned at its timeout: its outcome was already answered for


class BoundedRuns:
    """At most ``limit`` runs at once, each answered within ``timeout`` (TimeoutError after it).

    Each run is a task that holds its slot until its work has really ended: on timeout the
    caller gets TimeoutError at once, the task is cancelled, and the slot frees only when the
    cancelled work has finished (the funes process group is dead, the thread has returned).
    """

    def __init__(self, limit: int, timeout: float) -> None:
        self.timeout = timeout
        self.limit = limit
        self.in_use = 0  # slots held now, by running or not-yet-stopped work (for /metrics)
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[Any]] = set()  # strong refs: the loop keeps weak ones

    async def run(self, work: Callable[[], Awaitable[T]]) -> T:
        task = asyncio.create_task(self._in_slot(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.timeout)
        except BaseException:  # timed out, failed, or our own caller went away
            task.cancel()
            raise

    async def _in_slot(self, work: Callable[[], Awaitable[T]]) -> T:
        async with self._slots:
            self.in_use += 1
            try:
                return await work()
            finally:
                self.in_use -= 1

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def kill_group(proc: asyncio.subprocess.Process, grace: float) -> None:
    """Stop a child that leads its own process group, and everything it started: SIGTERM,
    then SIGKILL after ``grace`` seconds. Killing only the child could leave its own children
    holding the pipes, and `wait()` would hang."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
            if sig == signal.SIGTERM:
                # the leader is gone; grandchildren may linger in the group
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            return
        except TimeoutError:
            continue


class Glance(Generic[T]):
    """A figure a probe reads from a dependency without waiting on it (liveness, /metrics): each
    call waits at most ``seconds`` for a read, else answers None, as when the read fails. A read
    that runs longer goes on alone, and the next call waits on it rather than starting another:
    a database that hangs holds one read at a time, never a pile of them."""

    def __init__(self, read: Callable[[], Awaitable[T]], seconds: float) -> None:
        self._read = read
        self._seconds = seconds
        self._task: asyncio.Future[T] | None = None

    async def __call__(self) -> T | None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._read())
            self._task.add_done_callback(_retrieve)
        task = self._task
        done, _ = await asyncio.wait({task}, timeout=self._seconds)
        if not done or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset sets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
