"""The PostgreSQL store (STORE=postgres): the truth and the index of every user in one database,
shared by any number of stateless replicas.

    schema.py   versioned migrations (`recall-server migrate`), the start-up schema check
    database.py the async pool, one transaction per user (`SET LOCAL recall.user_hash`), faults
    store.py    the write path and the lifecycle (forget, erase, tombstones, receipts, audit)
    index.py    index runs: due users claimed with FOR UPDATE SKIP LOCKED under a lease
    search.py   recall: BM25 from per-user term statistics + exact pgvector, ranked by the
                shared core (recall/engines/embedded/search.py)

Every table is keyed by the user hash first (the column Citus distributes by); row-level
security, forced, on a per-transaction setting is the second lock after every query's own filter.
"""
