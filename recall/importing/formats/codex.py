"""Codex CLI's session transcripts: one JSON Lines "rollout" file per session (under
`~/.codex/sessions/YYYY/MM/DD/`), a `session_meta` line with the session's `id`, then
`response_item` lines whose `payload` is a message (`role`, `content` blocks of `input_text` or
`output_text`), a function call or its output, or reasoning. The messages' text is kept; the
harness's context (developer messages, `<environment_context>`, `<user_instructions>`),
function calls, their output and reasoning are skipped and counted; `event_msg` lines repeat the
messages and are not read. The older layout (a first line with `id` and `timestamp`, then bare
items) is read too. An answer after a call of our own recall tool is marked recalled."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from recall.importing.archive import BoundedReader
from recall.importing.formats.base import (
    RECALL_TOOL,
    Exported,
    Format,
    Record,
    basename,
    json_lines,
    stable_id,
    text_blocks,
    wrong_format,
)

HARNESS_CONTEXT = ("<environment_context>", "<user_instructions>")
UNREAD_LINES = ("event_msg", "turn_context", "compacted")


def read(reader: BoundedReader, member: str, skipped: Counter[str]) -> Iterator[Exported]:
    session: Any = None
    started: Any = None
    turns: list[Record] = []
    recalled, lines = False, 0
    for number, line in json_lines(reader, member):
        lines += 1
        if not isinstance(line, dict):
            raise wrong_format(f"{member} line {number}", CODEX, line)
        kind, item = line.get("type"), line.get("payload", line)
        if kind == "session_meta" or ("instructions" in line and "id" in line):
            meta = item if isinstance(item, dict) else {}
            session, started = meta.get("id"), meta.get("timestamp") or line.get("timestamp")
            continue
        if kind in UNREAD_LINES or line.get("record_type") == "state":
            continue
        if not isinstance(item, dict) or (kind not in ("response_item", "message") and kind):
            raise wrong_format(f"{member} line {number}", CODEX, line)
        if item.get("type") != "message":
            if str(item.get("name", "")).endswith(RECALL_TOOL):
                recalled = True
            skipped[f"{item.get('type') or 'untyped'} item"] += 1
            continue
        turn = _turn(item, line.get("timestamp") or started, skipped)
        if turn is None:
            continue
        recalled = recalled and turn["role"] != "user"
        turns.append({**turn, "recalled": recalled and turn["role"] == "assistant"})
    if not lines:
        return
    if session is None and not turns:
        raise wrong_format(member, CODEX, None)
    raw_id = session if isinstance(session, str) and session else basename(member)
    yield Exported(member, stable_id("codex", raw_id), turns)


def _turn(item: Record, ts: Any, skipped: Counter[str]) -> Record | None:
    role = item.get("role")
    if role in ("developer", "system"):
        skipped["harness context"] += 1
        return None
    text = text_blocks(item.get("content"), skipped)
    if text.lstrip().startswith(HARNESS_CONTEXT):
        skipped["harness context"] += 1
        return None
    if not text.strip():
        skipped["empty message"] += 1
        return None
    return {"id": item.get("id"), "role": role, "text": text, "ts": ts}


CODEX = Format(
    name="codex",
    label="Codex CLI",
    wanted=lambda name: name.endswith(".jsonl"),
    read=read,
)
