"""Which engine searches a files store's sources, as the settings say (ENGINE)."""

from __future__ import annotations

from recall.files.engines.base import Engine
from recall.files.engines.funes import FunesEngine, find_funes
from recall.indexing.configured import configured_embedder, configured_reranker, index_workers
from recall.settings import ConfigError, Settings


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
    from recall.files.engines.embedded.engine import EmbeddedEngine

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
        reranker=configured_reranker(settings),
    )
