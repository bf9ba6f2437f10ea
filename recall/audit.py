"""The recall audit: every tool call appends one line to the user's own log, home/audit.jsonl.

A line says when, which client (the token's `client_id`), the query searched, the outcome, and
which passages were served: the time of each hit's turn (and its role, when the engine prints
it), never their text. The audit is the user's data: it lives in their directory, so it goes
with them, and only the ingest key's holder (`POST /audit`) and the user's own token (the memory
page's `GET /api/me/audit`) read it back.

Which passages were served is read from the answer itself, so the engine seam stays one text:
both engines start each hit with a dated header line (the embedded engine's
``[2026-10-08 14:05 UTC] user``, funes' ``[2026-10-08T14:05:07Z] gateway /work/x text  score=``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recall.conversations import fsync_dir, private_file
from recall.engines.base import NO_MEMORY, NOTHING_FOUND, UNAVAILABLE

AUDIT_FILE = "audit.jsonl"
OUTCOMES = {NO_MEMORY: "no_memory", NOTHING_FOUND: "nothing_found", UNAVAILABLE: "unavailable"}
EMBEDDED_HEADER = re.compile(
    r"^\[(?P<day>\d{4}-\d{2}-\d{2}) (?P<clock>\d{2}:\d{2}) UTC\] (?P<role>[a-z]+)$", re.MULTILINE
)
FUNES_HEADER = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z)\] \S+ \S+ \S+[ \t]+score=",
    re.MULTILINE,
)


def now() -> str:
    """The current time as the audit writes it (and `since` is compared with)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def served(answer: str) -> list[dict[str, str]]:
    """The passages an answer holds: each hit's turn time (UTC) and role where shown."""
    hits = [
        (m.start(), {"ts": f"{m['day']}T{m['clock']}:00Z", "role": m["role"]})
        for m in EMBEDDED_HEADER.finditer(answer)
    ]
    hits += [(m.start(), {"ts": m["ts"]}) for m in FUNES_HEADER.finditer(answer)]
    return [hit for _, hit in sorted(hits, key=lambda h: h[0])]


def entry(client: str | None, query: str, answer: str) -> dict[str, Any]:
    """One audit line for a tool call that searched ``query`` and answered ``answer``."""
    outcome = OUTCOMES.get(answer, "passages")
    return {
        "at": now(),
        "client": client,
        "query": query,
        "outcome": outcome,
        "served": served(answer) if outcome == "passages" else [],
    }


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
