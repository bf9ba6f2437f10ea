"""The files store's write path: a conversation (recall/domain/conversation.py) laid out on disk
in funes format, durably and atomically, under its lock.

On-disk layout (the contract both engines read, see docs/CONTRACTS.md):

    DATA_DIR/<first 24 hex of sha256(user)>/src/<conversation_id>.funes.jsonl

One file per conversation, the whole conversation, rewritten atomically on every post that
changes it; a post that the stored file already holds (the same version, or an older snapshot of a
longer one) writes nothing. Writers of one conversation take its lock, src/.<conversation_id>.lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from recall.domain.conversation import SOURCE_SUFFIX, Conversation, stored_holds

# Everything under DATA_DIR is the owner's only (conversations, indexes, tombstones, receipts,
# keys): explicit modes where we create things, and this umask for what libraries create
# (SQLite's database and WAL files, funes' memory, index worker processes, which inherit it).
PRIVATE_UMASK = 0o077
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def write_conversation(
    home: Path,
    conversation: Conversation,
    admit: Callable[[Conversation], Conversation] | None = None,
) -> bool:
    """Store the whole conversation durably and atomically; returns whether the file was written.

    Nothing is written when the stored file already holds this post: byte for byte, or as a longer
    version this post is a strict prefix of (see `_holds`), so a delayed retry of an older
    snapshot cannot shorten the conversation. Any other change replaces the file. The
    conversation's lock makes reading, deciding and replacing one step against every other
    writer, in this process or another (the backfill command); a unique temporary name (never
    .jsonl, so no engine reads it) and a rename install one complete file. ``admit``, called
    under the lock, decides what of the post may be stored (the tombstones,
    recall/files/lifecycle.py) and may raise to store nothing.
    """
    data = conversation.to_jsonl().encode("utf-8")  # fails before any mkdir, leaving nothing
    src = home / "src"
    target = src / f"{conversation.conversation_id}{SOURCE_SUFFIX}"
    created = [d for d in (home, src) if not d.exists()]
    try:
        home.mkdir(PRIVATE_DIR, parents=True, exist_ok=True)
        src.mkdir(PRIVATE_DIR, exist_ok=True)
        with conversation_lock(home, conversation.conversation_id):
            if admit is not None:
                conversation = admit(conversation)
                data = conversation.to_jsonl().encode("utf-8")
            if _holds(target, data, conversation.lines):
                # Acknowledged as stored, so make sure it is durable even if its writer died
                # between its rename and its fsyncs.
                _fsync_file(target)
                for directory in (src, home, home.parent):
                    fsync_dir(directory)
                return False
            tmp = src / f".{conversation.conversation_id}.{uuid.uuid4().hex}.tmp"
            try:
                with open(tmp, "wb", opener=private_file) as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            fsync_dir(src)  # the rename
            for directory in created:  # a new user or src directory: its entry must be durable
                fsync_dir(directory.parent)
    except BaseException:
        for directory in reversed(created):  # a failed write leaves no directory behind
            with contextlib.suppress(OSError):  # not empty: another writer is using it
                directory.rmdir()
        raise
    return True


def _holds(target: Path, data: bytes, lines: list[dict[str, Any]]) -> bool:
    """Whether the stored file already holds this post (`data`, the serialised `lines`).

    True when it is byte for byte the same, or when it has more lines and its first len(lines)
    lines have the same turn_uuid, role, ts and blocks (the text), in order, as `lines`.
    A missing or unreadable stored file holds nothing.
    """
    try:
        stored = target.read_bytes()
    except FileNotFoundError:
        return False
    return stored_holds(stored, data, lines)


@contextlib.contextmanager
def conversation_lock(home: Path, conversation_id: str, wait: bool = True) -> Iterator[None]:
    """Hold the write lock of one conversation, across threads and processes.

    An flock (per open file, so threads of one process exclude each other too, unlike POSIX
    record locks) on src/.<conversation_id>.lock, which needs src to exist. The holder removes
    the file before releasing it, so no lock files pile up; a waiter that then gets the lock of
    the removed file sees that the path no longer leads to it and locks the new one instead.
    With ``wait=False``, BlockingIOError when another writer holds it.
    """
    path = home / "src" / f".{conversation_id}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _is_open_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # while still locked: see the docstring
        os.close(fd)


def remove_leftovers(home: Path) -> int:
    """Remove what writers killed mid-write left in src (their temporary and lock files), so
    that only conversations remain where the engines read; returns how many files went.

    Each conversation's leftovers go under its lock, so a live writer's (the backfill command
    in another process) are left alone: its lock is held, or its temporary file is its own.
    """
    src = home / "src"
    leftovers: dict[str, list[Path]] = {}
    for path in src.glob(".*") if src.is_dir() else []:
        if path.suffix in (".tmp", ".lock"):  # .<conversation_id>[.<rand>].tmp|lock
            leftovers.setdefault(path.name[1:].split(".", 1)[0], []).append(path)
    removed = 0
    for conversation_id, paths in leftovers.items():
        try:
            # Taking the lock replaces a stale lock file, and releasing it removes the file.
            with conversation_lock(home, conversation_id, wait=False):
                for path in paths:
                    if path.suffix == ".tmp":
                        path.unlink(missing_ok=True)
        except BlockingIOError:
            continue  # a writer is at work on it: its own finally removes its temporary file
        removed += len(paths)
    if removed:
        fsync_dir(src)
    return removed


def private_file(path: str | os.PathLike[str], flags: int) -> int:
    """An ``opener`` for ``open()``: a file it creates is the owner's only (0600), whatever the
    umask; an existing one keeps its mode."""
    return os.open(path, flags | os.O_CLOEXEC, PRIVATE_FILE)


def _is_open_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_source(path: Path) -> list[dict[str, Any]]:
    """The turns of one source file, in order (shared by the engines and the tools)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def source_files(home: Path) -> list[Path]:
    src = home / "src"
    return sorted(src.glob(f"*{SOURCE_SUFFIX}")) if src.is_dir() else []
