"""What every export format shares: a conversation as the export gives it (a `POST /turns`
body without the user), its stable id, timestamps, streamed JSON and the wrong-format hint."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import ijson

from recall.domain.conversation import CONVERSATION_ID
from recall.importing.archive import BoundedReader
from recall.importing.errors import ImportRefused

Record = dict[str, Any]
# A tool call of ours inside an imported session: the answer after it was built with recall and
# is marked recalled, as the gateway marks it on POST /turns (recall/domain/conversation.py).
RECALL_TOOL = "recall_my_conversations"


@dataclass(frozen=True)
class Exported:
    """One conversation of an export: ``turns`` as POST /turns takes them (id, role, text, ts,
    recalled); ``where`` names it in the summary (member and position, never its text)."""

    where: str
    conversation_id: str
    turns: list[Record]


Read = Callable[[BoundedReader, str, Counter[str]], Iterator[Exported]]


@dataclass(frozen=True)
class Format:
    name: str  # as --format and the page name it
    label: str  # as a person calls it
    wanted: Callable[[str], bool]  # which members of a zip or folder hold chats
    read: Read  # a member's conversations; skipped turns counted by reason


def stable_id(prefix: str, raw: Any) -> str:
    """The conversation's id in our store: the format and the export's own id, so a second
    import of the same export names the same conversations; a hash where the id is unusable."""
    text = str(raw)
    candidate = f"{prefix}-{text}"
    if CONVERSATION_ID.fullmatch(candidate):
        return candidate
    return f"{prefix}-h{hashlib.sha256(text.encode('utf-8', 'replace')).hexdigest()[:32]}"


def from_epoch(value: Any) -> str | None:
    """Seconds since 1970 (ChatGPT, Open WebUI) as RFC 3339 in UTC; None when not a time."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        moment = datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.replace(microsecond=0, tzinfo=None).isoformat() + "Z"


def basename(member: str) -> str:
    return member.rsplit("/", 1)[-1]


def json_array(reader: BoundedReader, member: str) -> Iterator[Any]:
    """The items of a member holding one JSON array, parsed a conversation at a time (memory is
    bounded by the largest conversation, not the export)."""
    head = reader.read(1024).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"["):
        raise ImportRefused(f"{member}: not a JSON array of conversations")
    try:
        yield from ijson.items(_Replay(head, reader), "item", use_float=True)
    except ijson.JSONError as exc:  # its message quotes the text around the error: not shown
        raise ImportRefused(
            f"{member}: not valid JSON (in its first {reader.count} bytes)"
        ) from exc


class _Replay:
    """A reader that gives back the bytes already looked at first."""

    def __init__(self, head: bytes, rest: BoundedReader) -> None:
        self.head, self.rest = head, rest

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson asks for nothing first, to learn bytes from text
            return b""
        if self.head:
            head, self.head = self.head, b""
            return head
        return self.rest.read(size)


def json_lines(reader: BoundedReader, member: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) of a JSON Lines member, blank lines skipped."""
    for number, raw in enumerate(reader.lines(), 1):
        if not raw.strip():
            continue
        try:
            yield number, json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ImportRefused(f"{member} line {number}: not valid JSON") from exc


def looks_like(record: Any) -> str | None:
    """The format a record (a conversation, or a line of a session file) looks like."""
    if not isinstance(record, dict):
        return None
    if "mapping" in record and "current_node" in record:
        return "chatgpt"
    if "chat_messages" in record:
        return "claude"
    if isinstance(record.get("chat"), dict):
        return "open-webui"
    if "sessionId" in record or "leafUuid" in record:
        return "claude-code"
    if "payload" in record or record.get("type") == "message" or "instructions" in record:
        return "codex"
    return None


def wrong_format(where: str, named: Format, record: Any) -> ImportRefused:
    guess = looks_like(record)
    hint = f"; it looks like --format {guess}" if guess and guess != named.name else ""
    return ImportRefused(f"{where}: not a {named.label} export{hint}")


def text_blocks(content: Any, skipped: Counter[str]) -> str:
    """The text of a list of typed content blocks (Claude, Claude Code, Codex); every other
    block counted as skipped by its type."""
    if isinstance(content, str):
        return content
    texts = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in ("text", "input_text", "output_text") and isinstance(block.get("text"), str):
            texts.append(block["text"])
        else:
            skipped[f"{kind or 'unknown'} block"] += 1
    return "\n\n".join(texts)


def follow_branch(nodes: dict[str, Any], leaf: Any, parent_key: str, where: str) -> list[Any]:
    """The nodes from the root to ``leaf`` by their parent links (a ChatGPT or Open WebUI tree
    keeps every edited branch; the one shown ends at the current node). ImportRefused on a
    cycle or a link to a node that is not there."""
    branch, seen = [], set()
    at = leaf
    while at is not None:
        if not isinstance(at, str) or at not in nodes:
            raise ImportRefused(f"{where}: links to a message that is not in the export")
        if at in seen:
            raise ImportRefused(f"{where}: the message tree has a cycle")
        seen.add(at)
        node = nodes[at]
        if not isinstance(node, dict):
            raise ImportRefused(f"{where}: a message that is not an object")
        branch.append(node)
        at = node.get(parent_key)
    branch.reverse()
    return branch
