"""Ranking both stores share: query analysis and tokenisation (text), the ranking stages
(search), the user's vectors held for concurrent callers (vectors) and what the agent reads
(render). Neither store owns it; both import it."""
