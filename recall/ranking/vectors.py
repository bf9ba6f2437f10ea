"""Users' vector matrices held in memory: the dense leg is one matrix product, not a scan.

Each matrix is valid for one generation of its user's index (the SQLite db's meta generation;
users.generation in PostgreSQL, which every change to a user's searchable chunks sets anew from a
sequence). A recall reads the current generation in its own snapshot and uses a cached matrix
only when it matches, so nothing an index run, a forget or an erase removed (on this replica or
another) is scored from memory. Least recently used users are dropped past a byte budget.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

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
