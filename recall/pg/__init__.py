"""The PostgreSQL store (STORE=postgres): the truth and the index of every user in one database,
shared by any number of stateless replicas. Its modules, one line each: docs/architecture.md.

Every table is keyed by the user hash first (the column Citus distributes by); row-level
security, forced, on a per-transaction setting is the second lock after every query's own filter.
"""
