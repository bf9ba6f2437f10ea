"""The embedded engine, one stage per module: words (text.py), storage (store.py), ranking
(search.py), the agent-facing format (render.py), and the seam that joins them (engine.py); its
index worker program (worker.py). The pieces it indexes are recall/indexing/pieces.py's."""
