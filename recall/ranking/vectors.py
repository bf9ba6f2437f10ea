"""Users' vector matrices held in memory: the dense leg is one matrix product, not a scan.

Each matrix is valid for one generation of its user's index (the SQLite db's meta generation;
users.generation in PostgreSQL, which every change to a user's searchable chunks sets anew from a
sequence). A recall reads the current generation in its own snapshot and uses a cached matrix
only when it matches, so nothing an index run, a forget or an erase removed (on this replica or
another) is scored from memory. Least recently used users are dropped past a byte budget.

Callers that miss the cache for one user wait for one load rather than each reading the whole
matrix (VectorLoads): the embedded engine's recall threads block on it, the PostgreSQL store's
coroutines await it; the bookkeeping is the same.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Vectors:
    """One user's vectors as a matrix, valid for one generation."""

    generation: str
    ids: np.ndarray  # int64 chunk ids, ascending: row i of the matrix is ids[i]
    matrix: np.ndarray  # float32, n x dim, unit rows
    newest: float  # epoch of the newest turn: recency is relative to the user's own history
    common: dict[str, int] = field(default_factory=dict)  # the embedded engine's common stems

    @property
    def nbytes(self) -> int:
        """What the cache counts against its budget: the arrays (the common stems are small)."""
        return self.ids.nbytes + self.matrix.nbytes


class VectorCache:
    """Matrices by key (a db path, a user hash), at most ``budget`` bytes in all. Thread-safe."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._matrices: OrderedDict[str, Vectors] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str, generation: str) -> Vectors | None:
        """The cached matrix of ``key`` when it is of ``generation``, else None."""
        with self._lock:
            cached = self._matrices.get(key)
            if cached is None or cached.generation != generation:
                return None
            self._matrices.move_to_end(key)
            return cached

    def keep(self, key: str, vectors: Vectors) -> None:
        """Cache a matrix, evicting the least recently used until the cache fits its budget.

        A matrix larger than the whole budget is not cached: it serves the recall (and any that
        waited for it) and is then freed, so the budget holds even for one huge user, who pays a
        reload per recall.
        """
        with self._lock:
            old = self._matrices.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            if vectors.nbytes > self.budget:
                return
            self._matrices[key] = vectors
            self._bytes += vectors.nbytes
            while self._bytes > self.budget:
                _, evicted = self._matrices.popitem(last=False)
                self._bytes -= evicted.nbytes

    @property
    def cached_bytes(self) -> int:
        """What the cached matrices hold now (at most the budget)."""
        with self._lock:
            return self._bytes


@dataclass
class _Flight:
    """One user's matrix being loaded; callers that miss the cache meanwhile wait for it."""

    done: Any  # a threading.Event (threads wait) or an asyncio.Event (coroutines of one loop)
    vectors: Vectors | None = None  # set when the load succeeded


class VectorLoads:
    """The cache, loaded single flight: one load per key at a time, different keys in parallel.

    ``get`` is for threads, ``aget`` for coroutines of one event loop; one instance serves one
    kind (``asynchronous``), as its waiters block on a threading.Event or await an asyncio.Event.
    """

    def __init__(self, cache: VectorCache, *, asynchronous: bool) -> None:
        self.cache = cache
        self._event = asyncio.Event if asynchronous else threading.Event
        self._flights: dict[str, _Flight] = {}  # key -> the load in progress
        self._lock = threading.Lock()  # never held across a load or a wait

    def get(self, key: str, generation: str, load: Callable[[], Vectors]) -> Vectors:
        """The matrix of ``key`` at ``generation``: cached, another thread's load, or ``load()``."""
        while True:
            flight, leads = self._claim(key, generation)
            if isinstance(flight, Vectors):
                return flight
            if leads:
                vectors = None
                try:
                    vectors = load()
                finally:
                    self._land(key, flight, vectors)
                return vectors
            flight.done.wait()
            if (vectors := self._landed(flight, generation)) is not None:
                return vectors

    async def aget(
        self, key: str, generation: str, load: Callable[[], Awaitable[Vectors]]
    ) -> Vectors:
        """``get`` for coroutines: waiting and loading suspend rather than block."""
        while True:
            flight, leads = self._claim(key, generation)
            if isinstance(flight, Vectors):
                return flight
            if leads:
                vectors = None
                try:
                    vectors = await load()
                finally:  # a cancelled load lets a waiter load instead
                    self._land(key, flight, vectors)
                return vectors
            await flight.done.wait()
            if (vectors := self._landed(flight, generation)) is not None:
                return vectors

    def _claim(self, key: str, generation: str) -> tuple[Vectors | _Flight, bool]:
        """The cached matrix; or the load under way (False: wait for it) or a new one (True:
        this caller loads)."""
        with self._lock:
            if (cached := self.cache.get(key, generation)) is not None:
                return cached, False
            if (flight := self._flights.get(key)) is not None:
                return flight, False
            flight = self._flights[key] = _Flight(self._event())
            return flight, True

    def _land(self, key: str, flight: _Flight, vectors: Vectors | None) -> None:
        with self._lock:
            del self._flights[key]
            if vectors is not None:
                flight.vectors = vectors
                self.cache.keep(key, vectors)
        flight.done.set()

    @staticmethod
    def _landed(flight: _Flight, generation: str) -> Vectors | None:
        """What a waited-for load gives: its matrix when of ``generation``; else None (it read
        another generation, an index run committed in between, or it failed): try again."""
        vectors = flight.vectors
        return vectors if vectors is not None and vectors.generation == generation else None
