"""The EMBED_* model and the index worker processes as the settings configure them, for both
stores: a passage must be embedded as its queries are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recall.settings import ConfigError, Settings

if TYPE_CHECKING:  # onnxruntime is heavy: imported only where a model is loaded
    from recall.embedder import Embedder
    from recall.indexing.workers import IndexWorkers
    from recall.reranker import CrossEncoder


def configured_embedder(settings: Settings, threads: int | None = None) -> Embedder:
    """The EMBED_* model, on ``threads`` intra-op threads (None: the embedder's default);
    ConfigError when it cannot be loaded."""
    from recall.models import load_embedder

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


def configured_reranker(settings: Settings) -> CrossEncoder | None:
    """The cross-encoder when RECALL_RERANK is on, else None; ConfigError when it cannot be
    loaded (the extra not installed, a file with other bytes)."""
    if not settings.recall_rerank:
        return None
    from recall.reranker import CrossEncoder

    try:
        return CrossEncoder()
    except OSError as exc:
        raise ConfigError(f"reranker: {exc}") from exc


def index_workers(settings: Settings) -> IndexWorkers:
    """The index worker processes, loading the EMBED_* model the queries are embedded with."""
    from recall.indexing.workers import IndexWorkers

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
