"""The two MCP tools at /mcp: their descriptions (what the agent reads to choose them), their
arguments, and the call each makes into recall/app/answers.py."""

from __future__ import annotations

import logging
from typing import Annotated

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_access_token
from mcp_types import ToolAnnotations
from pydantic import Field

from recall.app.answers import MAX_QUERY_CHARS, Answers, Read, Search, search_query
from recall.reading import checked_turns

TOOL_DESCRIPTION = """\
Search this user's own earlier conversations with you and get back dated, word-for-word passages.

Use it whenever the user points back at something said before: "last time", "earlier", "as we
discussed", "what did we decide", "who owns", "the numbers we used", a ticket or ID they expect
you to know. Look it up before asking them to repeat themselves.

Query with a few words built around identifiers and key nouns ("MT-4471 K-2 ticket",
"N-11 upgrade decision", "forecast base case parameters"), not a whole sentence. If the first
search misses, search again with other words. Quote what comes back with its date; never fill
gaps with guesses, and say so when the earlier conversations do not contain the answer.

Passages and their neighbouring turns may be cut ("…"). Each passage's header ends with
"ref <ref> turn <n>": when you need a turn word for word (an exact error message, a table, the
numbers) or what was said around it, call read_my_conversation with that ref and turn range
rather than searching again."""

READ_DESCRIPTION = """\
Read turns of one of this user's own earlier conversations whole, word for word and dated.

Use it after recall_my_conversations, when a passage or a neighbouring turn was cut ("…") or
you need what was said just before or after it: pass the ref from the passage's header
("ref <ref> turn <n>") and the turns you want, e.g. from_turn=n-1, to_turn=n+1. It does not
search: to find something, use recall_my_conversations. The answer is capped in length; its
last line says which turns were shown of how many and gives the exact call that reads on."""

REF_DESCRIPTION = (
    "The conversation's reference, from a passage header of recall_my_conversations "
    '("ref <ref> turn <n>"): 12 hexadecimal characters.'
)
FROM_TURN_DESCRIPTION = "The first turn to read (turns are numbered from 1, as the headers show)."
TO_TURN_DESCRIPTION = (
    "The last turn to read (at least from_turn); leave it out to read on to the end, as far "
    "as the answer's cap allows."
)

QUERY_DESCRIPTION = f"""\
A few words built around identifiers and key nouns, e.g. "MT-4471 K-2 ticket" or "N-11 upgrade \
decision", not a whole sentence. At most {MAX_QUERY_CHARS} characters; longer is cut."""


def read_only_tool(title: str) -> ToolAnnotations:
    """Both tools only read the user's own stored conversations (not the web)."""
    return ToolAnnotations(
        title=title,
        read_only_hint=True,
        destructive_hint=False,
        idempotent_hint=True,
        open_world_hint=False,
    )


TOOL_ANNOTATIONS = read_only_tool("Search my earlier conversations")
READ_ANNOTATIONS = read_only_tool("Read one of my earlier conversations")


class Tools:
    """The tools' bodies; the user comes from the verified token (``get_access_token``), never
    from an argument."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    async def recall_my_conversations(
        self,
        query: Annotated[str, Field(description=QUERY_DESCRIPTION)],
    ) -> str:
        return await self.answers.for_caller(get_access_token(), Search(search_query(query)))

    async def read_my_conversation(
        self,
        ref: Annotated[str, Field(description=REF_DESCRIPTION)],
        from_turn: Annotated[int, Field(description=FROM_TURN_DESCRIPTION)] = 1,
        to_turn: Annotated[int | None, Field(description=TO_TURN_DESCRIPTION)] = None,
    ) -> str:
        try:
            checked_turns(from_turn, to_turn)
        except ValueError as exc:  # the argument named first; nothing read, nothing audited
            # The agent's mistake, not the server's: INFO, not FastMCP's default ERROR.
            raise ToolError(str(exc), log_level=logging.INFO) from exc
        call = Read(ref.strip(), from_turn, to_turn)
        return await self.answers.for_caller(get_access_token(), call)

    def register(self, mcp: FastMCP) -> None:
        # Each answer goes out once, as text (output_schema=None). With an output schema FastMCP
        # would send it again as structuredContent ({"result": ...}): twice the characters in a
        # client that shows both.
        for tool, description, hints in (
            (self.recall_my_conversations, TOOL_DESCRIPTION, TOOL_ANNOTATIONS),
            (self.read_my_conversation, READ_DESCRIPTION, READ_ANNOTATIONS),
        ):
            mcp.tool(
                tool,
                description=description,
                title=hints.title,
                annotations=hints,
                output_schema=None,
            )
