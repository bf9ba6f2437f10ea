"""EMBED_MODEL's loader: the packaged MiniLM or EMBED_MODEL_DIR's ONNX model (embedder.py), or
multilingual-e5-small (multilingual.py). Its own module, so that neither of those two imports the
other's way back (multilingual.py builds on embedder.py)."""

from __future__ import annotations

from pathlib import Path

from recall.embedder import MODELS, MULTILINGUAL, PACKAGED, THREADS, Embedder, load_onnx_embedder


def load_embedder(
    model_dir: Path | None = None,
    pooling: str = "mean",
    threads: int = THREADS,
    *,
    int8: bool = False,
    cache: Path | None = None,
    model: str = PACKAGED,
) -> Embedder:
    """The packaged MiniLM, or ``model_dir/model.onnx`` (or its single ``*.onnx``) with
    ``model_dir/tokenizer.json``, on ``threads`` intra-op threads; with ``int8``, in its int8
    graph (cached under ``cache``, by default ``model_cache()``). ``model`` names one of
    MODELS: the multilingual one takes none of the other arguments (ValueError)."""
    if model == MULTILINGUAL:
        if model_dir is not None or int8 or pooling != "mean":
            raise ValueError(
                f"EMBED_MODEL={MULTILINGUAL} takes no EMBED_MODEL_DIR, EMBED_POOLING or "
                "EMBED_COMPUTE=int8 (those are for an ONNX model)"
            )
        from recall.multilingual import E5Embedder

        return E5Embedder()
    if model != PACKAGED:
        raise ValueError(f"EMBED_MODEL must be one of {', '.join(MODELS)}")
    return load_onnx_embedder(model_dir, pooling, threads, int8=int8, cache=cache)
