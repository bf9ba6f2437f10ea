"""Open WebUI's chat export (Settings, Chats, Export: `chat-export-<time>.json`): an array of
chats, each with its `chat.history`, a tree of `messages` by id linked by `parentId`; the chat
as shown is the branch that ends at `currentId` (or `chat.messages` in order, where an export
has no history). Messages' `content` is kept; their files and images are skipped and counted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from recall.importing.archive import BoundedReader
from recall.importing.formats.base import (
    Exported,
    Format,
    Record,
    follow_branch,
    from_epoch,
    json_array,
    stable_id,
    wrong_format,
)


def read(reader: BoundedReader, member: str, skipped: Counter[str]) -> Iterator[Exported]:
    for number, record in enumerate(json_array(reader, member), 1):
        where = f"{member} #{number}"
        chat = record.get("chat") if isinstance(record, dict) else None
        raw_id = record.get("id") if isinstance(record, dict) else None
        if not isinstance(chat, dict) or not isinstance(raw_id, str) or not raw_id:
            raise wrong_format(where, OPEN_WEBUI, record)
        started = from_epoch(record.get("created_at"))
        turns = [t for m in _branch(chat, where) if (t := _turn(m, started, skipped))]
        yield Exported(where, stable_id("open-webui", raw_id), turns)


def _branch(chat: Record, where: str) -> list[Any]:
    history = chat.get("history")
    if isinstance(history, dict) and isinstance(history.get("messages"), dict):
        return follow_branch(history["messages"], history.get("currentId"), "parentId", where)
    messages = chat.get("messages")
    return messages if isinstance(messages, list) else []


def _turn(message: Any, fallback_ts: str | None, skipped: Counter[str]) -> Record | None:
    if not isinstance(message, dict):
        skipped["not a message"] += 1
        return None
    for extra in ("files", "images"):
        if isinstance(message.get(extra), list) and message[extra]:
            skipped[extra[:-1]] += len(message[extra])
    text = message.get("content")
    if not isinstance(text, str) or not text.strip():
        skipped["empty message"] += 1
        return None
    ts = from_epoch(message.get("timestamp")) or fallback_ts
    return {"id": message.get("id"), "role": message.get("role"), "text": text, "ts": ts}


OPEN_WEBUI = Format(
    name="open-webui",
    label="Open WebUI",
    wanted=lambda name: name.endswith(".json"),
    read=read,
)
