"""Import a person's existing chats (the exports they can download) into their own memory.

- `archive.py`: the export read safely (a file, a folder or a zip; sizes, paths, links);
- `formats/`: one module per export format, each turning it into `POST /turns` bodies;
- `importer.py`: check everything first, then put each conversation through the store seam as
  `POST /turns` does (validation, redaction, the recalled mark, tombstones);
- `cli.py`: `recall-server import-chats`; `routes.py`: the memory page's `/api/me/import`.

docs/import.md says what is read, what is skipped and why, and the limits.
"""
