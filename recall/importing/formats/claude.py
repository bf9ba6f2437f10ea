"""Claude's data export: `conversations.json`, an array of conversations, each with its
`chat_messages` in order (`sender` human or assistant). The text blocks of a message are kept
(or its `text` where it has no blocks); tool calls, tool results, images and attachments are
skipped and counted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from recall.importing.archive import BoundedReader
from recall.importing.formats.base import (
    Exported,
    Format,
    Record,
    basename,
    json_array,
    stable_id,
    text_blocks,
    wrong_format,
)

SENDERS = {"human": "user", "assistant": "assistant"}


def read(reader: BoundedReader, member: str, skipped: Counter[str]) -> Iterator[Exported]:
    for number, record in enumerate(json_array(reader, member), 1):
        where = f"{member} #{number}"
        if not isinstance(record, dict) or not isinstance(record.get("chat_messages"), list):
            raise wrong_format(where, CLAUDE, record)
        raw_id = record.get("uuid")
        if not isinstance(raw_id, str) or not raw_id:
            raise wrong_format(where, CLAUDE, record)
        turns = [t for m in record["chat_messages"] if (t := _turn(m, record, skipped))]
        yield Exported(where, stable_id("claude", raw_id), turns)


def _turn(message: object, record: Record, skipped: Counter[str]) -> Record | None:
    if not isinstance(message, dict):
        skipped["not a message"] += 1
        return None
    for extra in ("attachments", "files"):
        if isinstance(message.get(extra), list) and message[extra]:
            skipped[extra[:-1]] += len(message[extra])
    content = message.get("content")
    text = text_blocks(content, skipped) if content else message.get("text")
    if not isinstance(text, str) or not text.strip():
        skipped["empty message"] += 1
        return None
    return {
        "id": message.get("uuid"),
        "role": SENDERS.get(message.get("sender"), message.get("sender")),  # type: ignore[arg-type]
        "text": text,
        "ts": message.get("created_at") or record.get("created_at"),
    }


CLAUDE = Format(
    name="claude",
    label="Claude",
    wanted=lambda name: basename(name) == "conversations.json",
    read=read,
)
