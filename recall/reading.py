"""Reading a hit whole: the second tool, `read_my_conversation(ref, from_turn, to_turn)`.

A passage's header in the search's answer ends with `ref <ref> turn <n>`. The reference is the
first REF_CHARS hex digits of sha256("<user hash>/<conversation id>"): derived, never stored, so
it is the same after a restart and on every replica, and it names neither the gateway's id nor a
path. It is looked up among the caller's own conversations only, so another user's reference is
simply unknown. Turns are numbered from 1 in conversation order (the stored `seq` plus one).

The answer is the turns asked for, dated and word for word, each labelled as the search labels
it, within MAX_RESULT_CHARS; its last line says which turns were shown, of how many, and the
exact call that reads on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from recall.domain import audit
from recall.domain.answers import OUTCOMES, Passage, Recalled
from recall.domain.conversation import REF, REF_CHARS, conversation_named, is_recalled
from recall.store import Store, Turn

READ_TOOL = "read_my_conversation"
# Unknown, malformed, forgotten, or another user's: one answer, so it tells nothing of which.
NOT_FOUND = (
    "ref: no conversation of yours has this reference (it may have been forgotten); "
    "take the ref from a passage header of recall_my_conversations."
)
ELLIPSIS = "…"


def checked_turns(from_turn: int, to_turn: int | None) -> None:
    """ValueError, naming the argument, for a range the tool cannot read (the MCP SDK has
    already refused what is not a whole number, naming the argument too)."""
    for name, value in (("from_turn", from_turn), ("to_turn", to_turn)):
        if value is not None and value < 1:
            raise ValueError(f"{name}: must be 1 or more (turns are numbered from 1), not {value}")
    if to_turn is not None and from_turn > to_turn:
        raise ValueError(f"from_turn: must not be after to_turn ({from_turn} > {to_turn})")


async def find(store: Store, user: str, ref: str) -> tuple[str, list[Turn]] | None:
    """The caller's conversation with reference ``ref`` and its stored turns, read now (no
    cache: a forget, on any replica, is honoured at once); None when there is none."""
    if not REF.fullmatch(ref):
        return None
    conversation_id = conversation_named(user, ref, await store.conversation_ids(user))
    if conversation_id is None:
        return None
    turns = await store.turns(user, conversation_id)
    return None if turns is None else (conversation_id, turns)


def turn_text(turn: Turn) -> str:
    """A stored turn's text: its blocks' texts, joined with a newline."""
    blocks = turn.get("blocks")
    if not isinstance(blocks, list):
        return ""
    return "\n".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))


def _header(turn: Turn, number: int) -> str:
    ts = str(turn.get("ts", ""))
    try:
        when = f"{datetime.fromisoformat(ts.replace('Z', '+00:00')).astimezone(UTC):%Y-%m-%d %H:%M}"
    except ValueError:  # stored turns are valid; a line from elsewhere keeps its own
        when = ts
    role = str(turn.get("role", ""))
    # As the search labels a neighbour answered from recall: an answer built from memory.
    label = f"{role}, answered from recall" if is_recalled(turn) else role
    return f"[{when} UTC] {label} · turn {number}\n"


@dataclass(frozen=True)
class Reading:
    ref: str
    conversation_id: str
    turns: list[Turn]
    from_turn: int
    to_turn: int | None

    def render(self, max_chars: int) -> Recalled:
        """The turns asked for, whole while they fit in ``max_chars`` with the last line; the
        first one cut when it alone does not fit. Each shown turn is a passage (for the audit)."""
        total = len(self.turns)
        if self.from_turn > total:
            turns = "turn" if total == 1 else "turns"
            return Recalled(
                f"from_turn: this conversation has {total} {turns}; "
                f"read it with {self._call(1, total)}."
            )
        last = total if self.to_turn is None else min(self.to_turn, total)
        # Room kept for the last line: its longest form, every number as wide as it can be.
        longest = max(len(turn_text(t)) for t in self.turns[self.from_turn - 1 : last])
        widest = f", cut at {longest:,} of its {longest:,} characters"
        room = max_chars - len(self._last_line(last, last + 1, total, widest))
        shown: list[Passage] = []
        text, cut = "", ""
        for number in range(self.from_turn, last + 1):
            turn = self.turns[number - 1]
            header, body = _header(turn, number), turn_text(turn)
            block = f"{header}{body}\n---\n"
            if len(text) + len(block) > room:
                keep = room - len(header) - len("\n---\n") - len(ELLIPSIS)
                if shown or keep < 1:
                    break
                # A turn longer than the cap alone: as much as fits, and the line says so.
                block = f"{header}{body[:keep]}{ELLIPSIS}\n---\n"
                cut = f", cut at {keep:,} of its {len(body):,} characters"
            role = str(turn.get("role", "")) or None
            where = (str(turn.get("turn_uuid", "")), str(turn.get("ts", "")), role)
            shown.append(Passage(self.conversation_id, *where, len(text), len(text) + len(block)))
            text += block
            if cut:
                break
        if not shown:
            return Recalled(
                f"No turn fits the answer's cap; read on with {self._call(self.from_turn, last)}."
            )
        end = self.from_turn + len(shown) - 1
        return Recalled(text + self._last_line(end, last, total, cut), tuple(shown))

    def _last_line(self, end: int, last: int, total: int, cut: str = "") -> str:
        """Which turns were shown of how many, and the call that reads on."""
        span = f"turn {end}" if end == self.from_turn else f"turns {self.from_turn}-{end}"
        line = f"Shown: {span} of {total}{cut}."
        if end < last:
            return f"{line} The answer is capped; read on with {self._call(end + 1, last)}.\n"
        if end < total:
            return f"{line} Read on with {self._call(end + 1, None)}.\n"
        return f"{line} That is the end of the conversation.\n"

    def _call(self, from_turn: int, to_turn: int | None) -> str:
        to = "" if to_turn is None else f", to_turn={to_turn}"
        return f'{READ_TOOL}(ref="{self.ref}", from_turn={from_turn}{to})'


def entry(
    client: str | None, ref: str, from_turn: int, to_turn: int | None, answer: Recalled
) -> dict[str, Any]:
    """One audit line for a read: the search's line (when, which client, the turns served),
    with what was asked for in place of a query."""
    line = {key: value for key, value in audit.entry(client, "", answer).items() if key != "query"}
    if not answer.passages:  # the search's fail-soft outcomes, or no turn of the user's to show
        line["outcome"] = OUTCOMES.get(answer.text, "not_found")
    read = {"ref": audited_ref(ref), "from_turn": from_turn, "to_turn": to_turn}
    return {**line, "tool": READ_TOOL, "read": read}


def audited_ref(ref: str) -> str:
    """The ref as the audit records it: whole when it is one (12 hex digits) or as short; else
    its start, cut, so that an agent's argument of any size cannot fill the user's audit."""
    if len(ref) <= REF_CHARS or REF.fullmatch(ref):
        return ref
    return ref[:REF_CHARS] + ELLIPSIS
