"""`recall-server backfill FILE`: import a history in bulk, as an operator's batch job.

FILE holds one `POST /turns` body per line (JSON Lines), or is a directory of `*.json` bodies.
Every body is validated exactly as the route validates it; a refused line is reported by number
and skipped (exit status 1 at the end). Conversations are written like the route writes them,
tombstones included (a forgotten turn stays out; a body with only forgotten turns is left out and
counted), then each user's index is brought up to date in batches, so the progress bar moves and
an interrupted import resumes where it stopped. What it creates is the owner's only, as the
server's files are. Run it while the server for this DATA_DIR is
stopped (it holds DATA_DIR as a server does, and a server cannot start beside it, nor it beside a
server): a server started afterwards sees the sources already indexed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from recall.domain.conversation import Conversation, Limits, parse_conversation, user_dir_name
from recall.domain.errors import EngineError, Forgotten, InvalidConversation
from recall.files.engines.base import Engine
from recall.files.engines.factory import make_engine
from recall.files.layout import PRIVATE_DIR, PRIVATE_UMASK, write_conversation
from recall.files.lifecycle import admit_for
from recall.files.scheduler import index_and_mark
from recall.files.store import hold_data_dir
from recall.settings import ConfigError, Settings, load_settings

log = logging.getLogger("recall")

BATCH = 500  # conversations written between index runs: progress granularity vs. run overhead


class Progress:
    """A one-line progress bar with rate and time left on a terminal; a line per 10% elsewhere."""

    def __init__(self, label: str, total: int, stream: TextIO = sys.stderr) -> None:
        self.label, self.total, self.stream = label, total, stream
        self.started = time.monotonic()
        self.tty = stream.isatty()
        self.reported = -1

    def update(self, done: int) -> None:
        elapsed = time.monotonic() - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        left = (self.total - done) / rate if rate > 0 else 0.0
        share = done / self.total if self.total else 1.0
        line = (
            f"{self.label} {done}/{self.total} [{'#' * int(share * 30):<30}] "
            f"{rate:.1f}/s, {_clock(elapsed)} elapsed, {_clock(left)} left"
        )
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done >= self.total else ""))
        elif int(share * 10) > self.reported:
            self.reported = int(share * 10)
            self.stream.write(line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def read_bodies(source: Path) -> Iterator[tuple[str, str]]:
    """(where, raw JSON) pairs: `line N` of a JSONL file, or the file name in a directory."""
    if source.is_dir():
        for path in sorted(source.glob("*.json")):
            yield path.name, path.read_text(encoding="utf-8")
        return
    with open(source, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                yield f"line {number}", line


def load(source: Path, limits: Limits) -> tuple[list[Conversation], list[str]]:
    conversations, refused = [], []
    for where, raw in read_bodies(source):
        try:
            conversation = parse_conversation(json.loads(raw), limits)
        except InvalidConversation as exc:
            refused.append(f"{where}: {exc}")
            continue
        except ValueError:
            refused.append(f"{where}: body: not valid JSON")
            continue
        if conversation.redactions:  # kinds and counts only, never a value; shown at WARNING
            log.warning("%s: redacted %s", where, conversation.redaction_summary())
        conversations.append(conversation)
    return conversations, refused


async def backfill(
    settings: Settings, engine: Engine, conversations: list[Conversation]
) -> tuple[int, int]:
    """Write and index; returns how many conversations are now stored and indexed, and how many
    were left out as forgotten (every turn tombstoned: a post would get 410)."""
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(PRIVATE_DIR, parents=True, exist_ok=True)
    by_user: dict[Path, list[Conversation]] = {}
    for conversation in conversations:
        home = data_dir / user_dir_name(conversation.user)
        by_user.setdefault(home, []).append(conversation)
    progress = Progress("backfill", len(conversations))
    done = forgotten = 0
    progress.update(done)
    try:
        for home, items in by_user.items():
            for start in range(0, len(items), BATCH):
                for conversation in items[start : start + BATCH]:
                    try:
                        write_conversation(home, conversation, admit_for(home))
                    except Forgotten:
                        forgotten += 1
                await index_and_mark(engine, home)
                done += len(items[start : start + BATCH])
                progress.update(done)
    finally:
        await engine.close()
    return done - forgotten, forgotten


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="recall-server backfill",
        description="Import conversations (POST /turns bodies, one per line) and index them.",
        epilog="Exit status: 0 all imported and indexed; 1 some bodies refused (reported by line,"
        " the rest imported) or an index run failed; 2 unreadable source or unusable settings.",
    )
    parser.add_argument(
        "source", type=Path, help="a .jsonl file of bodies, or a directory of .json"
    )
    args = parser.parse_args(argv)
    os.umask(PRIVATE_UMASK)  # everything written under DATA_DIR is the owner's only
    if not args.source.exists():
        print(f"recall-server backfill: {args.source}: no such file or directory", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"recall-server backfill: {exc}", file=sys.stderr)
        return 2
    if settings.store != "files":  # it writes DATA_DIR; a shared store takes POST /turns
        print(
            "recall-server backfill: writes the files store (STORE=files); for PostgreSQL, "
            "backfill a DATA_DIR, then recall-server import DATA_DIR",
            file=sys.stderr,
        )
        return 2
    try:  # one owner per DATA_DIR: not beside a server (or another backfill) using it
        owned = hold_data_dir(settings.data_dir, "backfill")
    except ConfigError as exc:
        print(f"recall-server backfill: {exc}", file=sys.stderr)
        return 2
    try:
        return _import(args.source, settings)
    finally:
        os.close(owned)


def _import(source: Path, settings: Settings) -> int:
    """Load, validate, write and index, with DATA_DIR held; the exit status."""
    try:
        limits = settings.limits()
    except ConfigError as exc:
        print(f"recall-server backfill: {exc}", file=sys.stderr)
        return 2
    try:
        conversations, refused = load(source, limits)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"recall-server backfill: {source}: cannot read ({exc})", file=sys.stderr)
        return 2
    for reason in refused:
        print(f"refused {reason}", file=sys.stderr)
    try:
        engine = make_engine(settings)
    except ConfigError as exc:
        print(f"recall-server backfill: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        count, forgotten = asyncio.run(backfill(settings, engine, conversations))
    except EngineError as exc:
        print(f"recall-server backfill: index run failed: {exc}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - started
    print(
        f"backfilled {count} conversations with the {engine.name} engine in {elapsed:.1f}s"
        f"{f'; left out {forgotten} forgotten' if forgotten else ''}"
        f"{f'; refused {len(refused)}' if refused else ''}",
        file=sys.stderr,
    )
    return 1 if refused else 0
