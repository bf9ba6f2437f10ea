"""Engines behind one seam (see base.py); nothing else in the server knows which one runs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from recall.engines.base import Engine
from recall.engines.funes import FunesEngine, find_funes
from recall.settings import ConfigError, Settings

if TYPE_CHECKING:  # onnxruntime is heavy: imported only where a model is loaded
    from recall.embedder import Embedder
    from recall.engines.embedded.worker import IndexWorkers

log = logging.getLogger("recall")


def make_engine(settings: Settings) -> Engine:
    """ENGINE=funes needs the binary; auto takes funes when it resolves, else the embedded one."""
    binary = find_funes(settings.funes_bin) if settings.engine != "embedded" else None
    if settings.engine == "funes" and binary is None:
        raise ConfigError(f"ENGINE=funes but no executable funes ({settings.funes_bin or 'PATH'})")
    if binary is not None:
        return FunesEngine(
            binary,
            k=settings.recall_k,
            candidates=settings.recall_candidates,
            hf_home=settings.hf_home,
            index_timeout=settings.index_timeout,
            # Room for the hint lines we strip and for multi-byte text; the rest is dropped.
            max_output_bytes=4 * settings.max_result_chars,
        )
    # Imported here: onnxruntime is heavy, and a funes deployment never needs it.
    from recall.embedder import QUERY_THREADS
    from recall.engines.embedded import EmbeddedEngine

    # This process embeds queries only; index runs embed in worker processes of their own.
    embedder = configured_embedder(settings, QUERY_THREADS)
    return EmbeddedEngine(
        embedder,
        index_workers=index_workers(settings),
        k=settings.recall_k,
        candidates=settings.recall_candidates,
        max_chars=settings.max_result_chars,
        half_life_days=settings.recall_half_life_days,
        min_similarity=settings.min_similarity(),
        cache_bytes=settings.vector_cache_mb * 2**20,
        index_timeout=settings.index_timeout,
        index_concurrency=settings.index_concurrency,
        recall_concurrency=settings.recall_concurrency,
    )


def configured_embedder(settings: Settings, threads: int | None = None) -> Embedder:
    """The EMBED_* model, on ``threads`` intra-op threads (None: the embedder's default);
    ConfigError when it cannot be loaded."""
    from recall.embedder import load_embedder  # onnxruntime: only where a model is needed

    more = {} if threads is None else {"threads": threads}
    try:
        return load_embedder(
            settings.embed_model_dir,
            settings.embed_pooling,
            int8=settings.embed_compute == "int8",
            model=settings.embed_model,
            **more,
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"embedding model: {exc}") from exc


def index_workers(settings: Settings) -> IndexWorkers:
    """The index worker processes, loading the EMBED_* model the queries are embedded with
    (both stores: a passage must be embedded as its queries are)."""
    from recall.engines.embedded.worker import IndexWorkers

    return IndexWorkers(
        settings.index_concurrency,
        settings.embed_model_dir,
        settings.embed_pooling,
        int8=settings.embed_compute == "int8",
        model_name=settings.embed_model,
        idle_exit=settings.index_worker_idle,
        log_level=settings.log_level,
        log_format=settings.log_format,
    )
