"""The files store's recall audit: every tool call appends one line to the user's own log,
home/audit.jsonl (the line itself: recall.domain.audit).

A line says when, which client (the token's `azp`/`client_id`, never the user), the query
searched, the outcome, and which passages were served: for each, the conversation and turn it
came from, the turn's time and its role (when the engine says), never their text. Where the
passages came from is what the engine told (recall.domain.answers.Passage), never read back out of
the answer's text, which holds the user's own words. The audit is the user's data: it lives in
their directory, so it goes with them, and only the ingest key's holder (`POST /audit`) and the
user's own token (the memory page's `GET /api/me/audit`, a page at a time) read it back.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from recall.files.layout import fsync_dir, private_file

AUDIT_FILE = "audit.jsonl"
READ_BLOCK = 64 * 1024  # a page is read from the end backwards, this much at a time


def append(home: Path, line: dict[str, Any]) -> None:
    """Append one line durably: one O_APPEND write (concurrent calls never mix their lines),
    then fsync. Only into an existing user directory: a user with none has nothing served.
    A shared lock keeps it out of a retention prune's way (which takes it exclusively)."""
    path = home / AUDIT_FILE
    created = not path.exists()
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                os.write(fd, (json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
                os.fsync(fd)
                break
        except FileNotFoundError:
            pass  # a prune replaced the file while we waited: write into the new one
        finally:
            os.close(fd)
    if created:  # the new file's directory entry must be durable too
        fsync_dir(home)


def prune(home: Path, before: str) -> int:
    """Drop the audit lines older than ``before`` (a UTC ...Z time), as retention asks; how many.
    The kept lines replace the file atomically, under an exclusive lock."""
    path = home / AUDIT_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        kept = [text for text in lines if _at(text) >= before]
        if len(kept) == len(lines):
            return 0
        tmp = home / f".{AUDIT_FILE}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8", opener=private_file) as handle:
            handle.writelines(kept)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(home)
        return len(lines) - len(kept)
    finally:
        os.close(fd)


def _at(text: str) -> str:
    """A line's time, or "" for a line cut short (dropped by a prune: it is unreadable anyway)."""
    try:
        line = json.loads(text)
    except ValueError:
        return ""
    return str(line.get("at", "")) if isinstance(line, dict) else ""


def page(
    home: Path, limit: int, before: int | None = None
) -> tuple[list[dict[str, Any]], int | None]:
    """Up to ``limit`` audit lines, newest first, of those that start before byte ``before``
    (None: the end), and the cursor of the next page (None: there is none). Read from the end
    backwards, so a page costs what it holds, not what the whole audit holds. A line cut short
    by a crash is skipped."""
    try:
        handle = open(home / AUDIT_FILE, "rb")  # noqa: SIM115 (closed below, after the reads)
    except FileNotFoundError:
        return [], None
    with handle:
        end = os.fstat(handle.fileno()).st_size
        entries: list[dict[str, Any]] = []
        for offset, raw in _lines_backwards(handle, end if before is None else min(before, end)):
            if len(entries) == limit:
                return entries, offset + len(raw) + 1  # the next page starts after this line
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict):
                entries.append(line)
    return entries, None


def _lines_backwards(handle: IO[bytes], end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of each line that starts before ``end``, last first."""
    position, tail = end, b""
    while position > 0:
        step = min(READ_BLOCK, position)
        position -= step
        handle.seek(position)
        parts = (handle.read(step) + tail).split(b"\n")
        tail = parts.pop(0)  # may begin in the block before
        offset = position + len(tail) + 1
        found = []
        for part in parts:
            found.append((offset, part))
            offset += len(part) + 1
        yield from ((at, raw) for at, raw in reversed(found) if raw.strip())
    if tail.strip():
        yield 0, tail


def read(home: Path, since: str | None = None) -> list[dict[str, Any]]:
    """The user's audit lines, oldest first, those at or after ``since`` (a UTC ...Z time).
    A line cut short by a crash is skipped."""
    try:
        raw = (home / AUDIT_FILE).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    entries = []
    for text in raw.splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and (since is None or str(line.get("at", "")) >= since):
            entries.append(line)
    return entries
