"""`recall-server import-chats --format F --user U PATH`: the operator imports one person's
chat export (a file, a folder or the export's zip) into that person's memory, on either store.

The export is read and checked whole first (nothing written when it is refused), then written
conversation by conversation with a progress bar, then indexed; the summary says what was
imported, what was already there, what stayed forgotten and what was skipped and why. On the
files store it holds DATA_DIR as a server does: beside a running server it refuses and points
to the memory page, which imports through the server itself.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from recall.domain.conversation import user_dir_name
from recall.files.backfill import Progress
from recall.files.store import DataDirTaken, hold_data_dir
from recall.importing import importer
from recall.importing.errors import ImportRefused
from recall.importing.formats.base import Format
from recall.importing.registry import FORMATS
from recall.settings import ConfigError, Settings, load_settings

PROG = "recall-server import-chats"
INDEX_WAIT = 600.0  # seconds the command waits for the index to take the import in


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Import one person's chat export into their memory (docs/import.md).",
        epilog="Exit status: 0 imported (skipped conversations are listed); 2 the export was "
        "refused (nothing written) or the settings or store cannot be used.",
    )
    parser.add_argument("--format", required=True, choices=sorted(FORMATS), dest="fmt")
    parser.add_argument("--user", required=True, help="the person's user id, as tokens name it")
    parser.add_argument("path", type=Path, help="the export: a file, a folder or its zip")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    if not args.user.strip() or len(args.user) > 256:
        return _fail("--user: must be 1 to 256 characters")
    if not args.path.exists():
        return _fail(f"{args.path}: no such file or directory")
    try:
        settings = load_settings()
    except ConfigError as exc:
        return _fail(str(exc))
    owned = None
    if settings.store == "files":  # one owner per DATA_DIR: not beside a running server
        try:
            owned = hold_data_dir(settings.data_dir, "import-chats")
        except DataDirTaken as exc:
            return _fail(
                f"{exc}. While the server runs, the person imports on their memory page "
                '(GET /memory, "Bring your history"); or stop the server and run this again'
            )
        except ConfigError as exc:
            return _fail(str(exc))
    try:
        return _run(settings, FORMATS[args.fmt], user_dir_name(args.user), args.path)
    finally:
        if owned is not None:
            os.close(owned)


def _run(settings: Settings, fmt: Format, user: str, path: Path) -> int:
    try:
        limits = settings.limits()
        planned = importer.plan(path, fmt, user, limits, settings.import_max_bytes)
    except ImportRefused as exc:
        return _fail(f"refused, nothing written: {exc}")
    except ConfigError as exc:
        return _fail(str(exc))
    started = time.monotonic()
    try:
        summary = asyncio.run(_write(settings, fmt, user, path, planned))
    except ImportRefused as exc:  # the export changed between the two passes
        return _fail(f"refused part way: {exc}")
    except ConfigError as exc:
        return _fail(str(exc))
    for line in summary.lines():
        print(line)
    print(f"done in {time.monotonic() - started:.1f}s")
    return 0


async def _write(
    settings: Settings, fmt: Format, user: str, path: Path, planned: importer.Summary
) -> importer.Summary:
    """Open the configured store in this process, write, wait for the index, close."""
    from recall.app.context import make_store  # the server's own store, built as it builds it
    from recall.metrics import Metrics

    writes = ThreadPoolExecutor(4, thread_name_prefix="import-write")
    store = make_store(settings, writes, Metrics())
    try:
        await store.start()
        progress = Progress("import-chats", planned.to_import)
        progress.update(0)
        limits, most = settings.limits(), settings.import_max_bytes
        summary = await importer.write(
            store, user, path, fmt, limits, most, planned, progress.update
        )
        deadline = time.monotonic() + INDEX_WAIT
        while await store.indexing() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # searchable when the command returns
        return summary
    finally:
        await store.close()
        writes.shutdown()


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2
