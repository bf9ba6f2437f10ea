"""Claude Code's session transcripts: one JSON Lines file per session (under
`~/.claude/projects/<project>/<session id>.jsonl`), a line per message with its `sessionId`,
`uuid`, `timestamp` and `message` (`role`, `content`: a string or typed blocks). Text is kept;
tool calls, tool results, thinking, the harness's own lines (`isMeta`), subagents' side chains
and summaries are skipped and counted. An answer after a call of our own recall tool is marked
recalled, as the gateway marks it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from recall.importing.archive import BoundedReader
from recall.importing.formats.base import (
    RECALL_TOOL,
    Exported,
    Format,
    basename,
    json_lines,
    looks_like,
    stable_id,
    text_blocks,
    wrong_format,
)

MESSAGE_TYPES = ("user", "assistant")


def read(reader: BoundedReader, member: str, skipped: Counter[str]) -> Iterator[Exported]:
    session, lines, turns = None, 0, []
    recalled = False  # our tool was called since the person last spoke
    for number, line in json_lines(reader, member):
        lines += 1
        kind = line.get("type") if isinstance(line, dict) else None
        if (
            not isinstance(line, dict)
            or (kind in MESSAGE_TYPES) != ("sessionId" in line)
            or looks_like(line) not in (None, "claude-code")
        ):
            raise wrong_format(f"{member} line {number}", CLAUDE_CODE, line)
        session = session or line.get("sessionId")
        if kind not in MESSAGE_TYPES:
            skipped[f"{kind or 'untyped'} line"] += 1
            continue
        if line.get("isSidechain") or line.get("isMeta"):
            skipped["subagent or harness line"] += 1
            continue
        message = line.get("message") if isinstance(line.get("message"), dict) else {}
        content = message.get("content")
        if kind == "assistant" and _calls_recall(content):
            recalled = True
        text = text_blocks(content, skipped)
        if not text.strip():
            continue  # a line of tool calls or results only: counted by text_blocks
        if kind == "user":
            recalled = False
        turns.append(
            {
                "id": line.get("uuid"),
                "role": message.get("role", kind),
                "text": text,
                "ts": line.get("timestamp"),
                "recalled": recalled and kind == "assistant",
            }
        )
    if not lines:
        return
    if session is None:  # not one message line: not a session transcript
        raise wrong_format(member, CLAUDE_CODE, None)
    raw_id = session if isinstance(session, str) and session else basename(member)
    yield Exported(member, stable_id("claude-code", raw_id), turns)


def _calls_recall(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(b, dict)
        and b.get("type") == "tool_use"
        and str(b.get("name", "")).endswith(RECALL_TOOL)
        for b in content
    )


CLAUDE_CODE = Format(
    name="claude-code",
    label="Claude Code",
    wanted=lambda name: name.endswith(".jsonl"),
    read=read,
)
