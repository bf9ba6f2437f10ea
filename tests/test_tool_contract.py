"""What an MCP client sees of the tool, over a real socket: its metadata in tools/list, and each
answer exactly once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Backing, Server, conversation, make_server
from fastmcp import Client


@pytest.fixture
def server(tmp_path: Path, backing: Backing) -> Iterator[Server]:
    with make_server(tmp_path, ENGINE="embedded", **backing.settings).start() as server:
        yield server


async def test_the_answer_reaches_the_client_once_as_text_with_no_structured_copy(
    server: Server,
) -> None:
    # given alice's memory holding one conversation
    body = conversation("alice", "c1", "ticket MT-4471 is open on the K-2 compressor", "Noted.")
    assert server.post(body)[0] == 202
    server.wait_indexed("alice")
    # when her agent calls the tool
    async with Client(f"{server.url}/mcp", auth=server.tokens["alice"]) as client:
        result = await client.call_tool_mcp("recall_my_conversations", {"query": "MT-4471"})
    # then the result is one text block and no structuredContent, so the passage is sent once
    wire = json.dumps(result.model_dump(by_alias=True, exclude_none=True))
    assert result.structured_content is None
    assert [block.type for block in result.content] == ["text"]
    assert "MT-4471 is open on the K-2 compressor" in result.content[0].text  # type: ignore[union-attr]
    assert wire.count("MT-4471 is open on the K-2 compressor") == 1
    assert "structuredContent" not in wire


async def test_tools_list_describes_the_query_and_marks_the_tool_read_only_and_closed(
    server: Server,
) -> None:
    # when a client lists the tools
    async with Client(f"{server.url}/mcp", auth=server.tokens["alice"]) as client:
        listed = await client.list_tools_mcp()
    [tool] = listed.model_dump(by_alias=True, exclude_none=True)["tools"]
    # then the query says what a good one looks like and its limit
    query = tool["inputSchema"]["properties"]["query"]
    assert "identifiers" in query["description"] and "500 characters" in query["description"]
    # and the tool is annotated as a read-only search of a closed world, with a title
    assert tool["annotations"] == {
        "title": "Search my earlier conversations",
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    }
    assert tool["title"] == "Search my earlier conversations"
    assert "outputSchema" not in tool  # no schema: nothing obliges a structured copy
