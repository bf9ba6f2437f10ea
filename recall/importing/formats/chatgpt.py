"""ChatGPT's data export: `conversations.json`, an array of conversations, each a tree of
messages in `mapping` (every edit and regeneration is a branch); the conversation as shown is the
branch that ends at `current_node`. Text parts are kept; images, files, code runs, browsing
results and hidden system messages are skipped and counted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from recall.importing.archive import BoundedReader
from recall.importing.formats.base import (
    Exported,
    Format,
    Record,
    basename,
    follow_branch,
    from_epoch,
    json_array,
    stable_id,
    wrong_format,
)

TEXT_CONTENT = ("text", "multimodal_text")


def read(reader: BoundedReader, member: str, skipped: Counter[str]) -> Iterator[Exported]:
    for number, record in enumerate(json_array(reader, member), 1):
        where = f"{member} #{number}"
        if not isinstance(record, dict) or not isinstance(record.get("mapping"), dict):
            raise wrong_format(where, CHATGPT, record)
        raw_id = record.get("conversation_id") or record.get("id")
        if not isinstance(raw_id, str) or not raw_id:
            raise wrong_format(where, CHATGPT, record)
        mapping = record["mapping"]
        branch = follow_branch(mapping, record.get("current_node"), "parent", where)
        started = from_epoch(record.get("create_time"))
        turns = [t for node in branch if (t := _turn(node, started, skipped))]
        yield Exported(where, stable_id("chatgpt", raw_id), turns)


def _turn(node: dict[str, Any], fallback_ts: str | None, skipped: Counter[str]) -> Record | None:
    message = node.get("message")
    if not isinstance(message, dict):
        return None  # the tree's root holds no message
    author = message.get("author")
    role = author.get("role") if isinstance(author, dict) else None
    metadata = message.get("metadata")
    if isinstance(metadata, dict) and metadata.get("is_visually_hidden_from_conversation"):
        skipped["hidden message"] += 1
        return None
    content = message.get("content")
    kind = content.get("content_type") if isinstance(content, dict) else None
    if kind not in TEXT_CONTENT:
        skipped[f"{kind or 'unknown'} content"] += 1
        return None
    texts = []
    for part in content.get("parts") or []:
        if isinstance(part, str):
            texts.append(part)
        else:
            skipped["image or file part"] += 1
    text = "\n\n".join(t for t in texts if t)
    if not text.strip():
        skipped["empty message"] += 1
        return None
    ts = from_epoch(message.get("create_time")) or fallback_ts
    return {"id": message.get("id") or node.get("id"), "role": role, "text": text, "ts": ts}


CHATGPT = Format(
    name="chatgpt",
    label="ChatGPT",
    wanted=lambda name: basename(name) == "conversations.json",
    read=read,
)
