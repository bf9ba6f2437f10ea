"""recall: the machinery behind recall_server.py.

Write path: conversations (validate a posted conversation, redact credentials, write it in funes
format, atomically) -> scheduler (a debounced index run per user, a bound across users). Read
path: auth (the user from a verified token) -> engines (index a user's sources; recall a query),
funes as a subprocess or the embedded engine -> audit (what was looked up, in the user's own log).

Where new code goes: names HTTP or MCP -> recall_server.py; holds connections and their deadlines ->
transport.py; says what a conversation or a user directory is -> conversations.py; recognises a
credential -> redaction.py; decides when to index -> scheduler.py; runs work on a bounded pool ->
concurrency.py; forgets, erases, keeps tombstones or receipts, applies retention -> lifecycle.py;
records a recall -> audit.py; serves the person's memory page -> memory_api.py (its files in
static/); searches -> one engine behind engines/base.py; reads the environment or refuses a
configuration -> settings.py; turns text into vectors -> embedder.py (the multilingual model:
multilingual.py); formats a log line -> logs.py; tells an operator whether it is ready
or how it is doing (/readyz, /metrics) -> metrics.py; starts a real server for tests, the benchmark
or a demo -> testing.py (the seeded demo in Chromium -> demo.py). In the embedded engine
(engines/embedded/): a word rule -> text.py; what is stored -> store.py (with a SCHEMA bump); how
hits rank -> search.py (judged by the benchmark); what the agent reads -> render.py (a contract);
when and on which thread, caching, recovery -> engine.py.
"""

import os

# One OpenBLAS thread per call. The embedded engine's dense leg multiplies one query vector by a
# user's matrix: memory-bound work that OpenBLAS's own threads only slow down, spinning on the
# cores the recall threads need (benchmark/README.md, "Load": 11 ms -> 0.3 ms per product on a
# busy 2-core machine). The recall pool is the parallelism. Set before numpy loads OpenBLAS (no
# module of ours imports it before this package); an operator's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
