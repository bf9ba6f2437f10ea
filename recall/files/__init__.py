"""The files store (STORE=files), beside recall/pg/; neither imports the other.

- store.py: `FilesStore`, one directory per user under DATA_DIR, and the data directory's lock.
- layout.py: a conversation on disk in funes format, written atomically under its lock.
- lifecycle.py: forget, erase, tombstones, receipts, retention, on disk.
- audit_file.py: the user's recall audit, home/audit.jsonl.
- scheduler.py: debounced per-user index runs, off the request path.
- backfill.py: `recall-server backfill`, a history imported in bulk.

The engines it runs (funes, the embedded engine) stay in recall/files/engines/.
"""
