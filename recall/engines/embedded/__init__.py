"""The embedded engine, one stage per module: words (text.py), storage (store.py), ranking
(search.py), the agent-facing format (render.py), and the seam that joins them (engine.py)."""

from recall.engines.embedded.engine import EmbeddedEngine
from recall.engines.embedded.store import FLUSH_TEXTS, db_path
from recall.engines.embedded.text import (
    Query,
    coverage,
    focus_terms,
    fts_query,
    identifier_forms,
    is_common,
    query_terms,
)

__all__ = [
    "FLUSH_TEXTS",
    "EmbeddedEngine",
    "Query",
    "coverage",
    "db_path",
    "focus_terms",
    "fts_query",
    "identifier_forms",
    "is_common",
    "query_terms",
]
