"""An export into one person's memory, in two passes over the same stream: `plan` reads and
checks everything and writes nothing (a hostile or unusable export is refused whole, with
ImportRefused); `write` reads it again and puts each conversation through the store seam, as
`POST /turns` does: validated and redacted by `parse_conversation`, the recalled mark kept, the
tombstones applied by `Store.put` (a forgotten conversation stays forgotten), and an unchanged
conversation (a second import) written not at all. Reading twice keeps memory bounded by one
conversation, not the export."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recall.domain.conversation import Conversation, Limits, parse_conversation
from recall.domain.errors import Forgotten, InvalidConversation
from recall.importing.archive import BoundedReader, open_export
from recall.importing.errors import ImportRefused
from recall.importing.formats.base import Exported, Format
from recall.store import Store

log = logging.getLogger("recall.import")

TURN_INDEX = re.compile(r"\[\d+\]")


@dataclass
class Summary:
    """What an import found and did: counts and reasons only, never text or ids."""

    format: str
    conversations: int = 0  # found in the export
    to_import: int = 0  # valid: what `write` puts
    imported: int = 0  # written (new, or longer than what was stored)
    unchanged: int = 0  # already stored as they are: nothing written
    forgotten: int = 0  # forgotten or erased before: left out, as POST /turns leaves them
    turns: int = 0  # turns of the valid conversations
    skipped: Counter[str] = field(default_factory=Counter)  # conversations, by reason
    skipped_turns: Counter[str] = field(default_factory=Counter)  # messages, by reason
    redacted: Counter[str] = field(default_factory=Counter)  # credentials, by kind

    def view(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "conversations": self.conversations,
            "to_import": self.to_import,
            "imported": self.imported,
            "unchanged": self.unchanged,
            "forgotten": self.forgotten,
            "turns": self.turns,
            "skipped": dict(self.skipped),
            "skipped_turns": dict(self.skipped_turns),
            "redacted": dict(self.redacted),
        }

    def lines(self) -> list[str]:
        """The summary as the command line prints it."""
        found = [
            f"{self.conversations} conversations in the export, {self.turns} turns in "
            f"{self.to_import} valid ones",
            f"imported {self.imported}, already there {self.unchanged}, "
            f"forgotten before (left out) {self.forgotten}",
        ]
        found += [f"skipped conversation: {why} ({n})" for why, n in sorted(self.skipped.items())]
        found += [f"skipped message: {why} ({n})" for why, n in sorted(self.skipped_turns.items())]
        found += [f"redacted: {kind} ({n})" for kind, n in sorted(self.redacted.items())]
        return found


def conversations(
    path: Path, fmt: Format, user: str, limits: Limits, max_bytes: int, summary: Summary
) -> Iterator[Conversation]:
    """The export's valid conversations, as POST /turns would take them; ``summary`` counts the
    rest. ImportRefused, at the point it is found, for an export refused whole."""
    seen: set[str] = set()
    with open_export(path, max_bytes, fmt.wanted) as (members, budget):
        if not members:
            raise ImportRefused(f"{path.name}: holds no {fmt.label} chats (is it another format?)")
        for member in members:
            with member.opener() as stream:
                reader = BoundedReader(stream, budget, member.name)
                for exported in fmt.read(reader, member.name, summary.skipped_turns):
                    summary.conversations += 1
                    if exported.conversation_id in seen:
                        summary.skipped["the same conversation twice in the export"] += 1
                        continue
                    seen.add(exported.conversation_id)
                    conversation = _valid(exported, user, limits, summary)
                    if conversation is not None:
                        yield conversation


def _valid(exported: Exported, user: str, limits: Limits, summary: Summary) -> Conversation | None:
    if not exported.turns:
        summary.skipped["no text messages"] += 1
        return None
    turns = [{k: _plain(k, v) for k, v in t.items() if v is not None} for t in exported.turns]
    body = {"user": user, "conversation_id": exported.conversation_id, "turns": turns}
    try:
        conversation = parse_conversation(body, limits)  # the route's own validation, redaction
    except InvalidConversation as exc:  # named by field, its turn's number left out: a reason
        summary.skipped[TURN_INDEX.sub("[]", str(exc))] += 1
        return None
    summary.to_import += 1
    summary.turns += len(conversation.lines)
    summary.redacted.update(conversation.redactions)
    return conversation


def _plain(key: str, value: Any) -> Any:
    """An export's numeric message id as text (POST /turns takes ids as strings)."""
    return str(value) if key == "id" and isinstance(value, int | float) else value


def plan(path: Path, fmt: Format, user: str, limits: Limits, max_bytes: int) -> Summary:
    """Read and check the whole export; nothing is written. ImportRefused when it is refused."""
    summary = Summary(fmt.name)
    for _ in conversations(path, fmt, user, limits, max_bytes, summary):
        pass
    return summary


async def write(
    store: Store,
    user: str,
    path: Path,
    fmt: Format,
    limits: Limits,
    max_bytes: int,
    planned: Summary,
    progress: Callable[[int], None] = lambda done: None,
) -> Summary:
    """Put every valid conversation of a planned export (``user`` is the user's hash); the
    planned summary with what was written. The export is read in a thread, the store is
    written on this loop."""
    loop = asyncio.get_running_loop()

    def put_all() -> None:
        scratch = Summary(fmt.name)  # the plan counted these already
        for done, conversation in enumerate(
            conversations(path, fmt, user, limits, max_bytes, scratch), 1
        ):
            put = asyncio.run_coroutine_threadsafe(_put(store, user, conversation), loop)
            outcome = put.result()  # one at a time: the store's own pace, in order
            setattr(planned, outcome, getattr(planned, outcome) + 1)
            progress(done)

    await asyncio.to_thread(put_all)
    log.info(
        "user %s: imported %d %s conversations, %d already there, %d forgotten before",
        user,
        planned.imported,
        fmt.name,
        planned.unchanged,
        planned.forgotten,
    )
    return planned


async def _put(store: Store, user: str, conversation: Conversation) -> str:
    """Which count the conversation adds to: "imported", "unchanged" or "forgotten"."""
    try:
        return "imported" if await store.put(user, conversation) else "unchanged"
    except Forgotten:
        return "forgotten"
