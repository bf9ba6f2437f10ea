"""The embedded engine, one stage per module: storage (store.py), the ranking pipeline's source
over one snapshot of it (source.py), and the seam that joins them (engine.py); its index worker
program (worker.py). Words, ranking and the agent-facing format are recall/ranking's; the pieces
it indexes are recall/indexing/pieces.py's."""
