"""Ranking both stores share: query analysis and tokenisation (text), the ranking stages
(search), FTS5's BM25 formula (bm25), the one pipeline composing them over a small source
protocol each store implements (pipeline), the user's vectors held for concurrent callers
(vectors) and what the agent reads (render). Neither store owns it; both import it."""
