"""What an MCP client sees of the tool, over a real socket: its metadata in tools/list, and each
answer exactly once."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Backing, FakeFunes, Server, conversation, make_server, wait_for
from fastmcp import Client

from recall.domain.answers import (
    NEVER_MENTIONED,
    NEVER_MENTIONED_YET,
    NOT_YET,
    NOTHING_FOUND,
    NOTHING_YET,
    UNAVAILABLE,
)
from recall.domain.conversation import conversation_ref, user_dir_name
from recall.files.engines.embedded.store import db_path


# One server per store for the module's tests that only list the tools or post the same
# conversation: a server start costs seconds of CPU.
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_backing: Backing) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("tool-contract")
    with make_server(workdir, ENGINE="embedded", **module_backing.settings).start() as server:
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
    tools = {t["name"]: t for t in listed.model_dump(by_alias=True, exclude_none=True)["tools"]}
    assert set(tools) == {"recall_my_conversations", "read_my_conversation"}
    tool = tools["recall_my_conversations"]
    # then the query is its one argument, and says says what a good one looks like and its limit
    assert list(tool["inputSchema"]["properties"]) == ["query"]
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


async def test_tools_list_says_when_to_read_a_hit_whole_and_marks_the_reader_read_only(
    server: Server,
) -> None:
    # when a client lists the tools
    async with Client(f"{server.url}/mcp", auth=server.tokens["alice"]) as client:
        listed = await client.list_tools_mcp()
    tools = {t["name"]: t for t in listed.model_dump(by_alias=True, exclude_none=True)["tools"]}
    search, reader = tools["recall_my_conversations"], tools["read_my_conversation"]
    # then the search points at the reader for what it cuts, and the reader back at the search
    assert "read_my_conversation" in search["description"]
    assert "ref <ref> turn <n>" in search["description"]
    assert "recall_my_conversations" in reader["description"]
    assert "does not" in reader["description"] and "search" in reader["description"]
    # and the reader takes a reference and a range of turns, only the reference required
    schema = reader["inputSchema"]
    assert list(schema["properties"]) == ["ref", "from_turn", "to_turn"]
    assert schema["required"] == ["ref"]
    assert "numbered from 1" in schema["properties"]["from_turn"]["description"]
    # and is, like the search, read-only over a closed world, with no output schema
    assert reader["annotations"] == {
        "title": "Read one of my earlier conversations",
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    }
    assert "outputSchema" not in reader


async def test_a_read_reaches_the_client_once_as_text_with_no_structured_copy(
    server: Server,
) -> None:
    # given alice's memory holding one conversation
    body = conversation("alice", "c1", "ticket MT-4471 is open on the K-2 compressor", "Noted.")
    assert server.post(body)[0] == 202
    server.wait_indexed("alice")
    ref = conversation_ref(user_dir_name("alice"), "c1")
    # when her agent reads it
    async with Client(f"{server.url}/mcp", auth=server.tokens["alice"]) as client:
        result = await client.call_tool_mcp("read_my_conversation", {"ref": ref})
    # then it is one text block, sent once
    wire = json.dumps(result.model_dump(by_alias=True, exclude_none=True))
    assert result.structured_content is None
    assert [block.type for block in result.content] == ["text"]
    assert wire.count("MT-4471 is open on the K-2 compressor") == 1


DEBOUNCE = 10.0  # seconds an index run waits after a post, on the `debounced` servers


@pytest.fixture(scope="module")
def debounced(
    tmp_path_factory: pytest.TempPathFactory, module_backing: Backing
) -> Iterator[Server]:
    """One embedded server per store whose index runs wait DEBOUNCE after a post: for the tests
    of what a search says before a run (carol's first post; alice's and dave's second)."""
    workdir = tmp_path_factory.mktemp("tool-contract-debounced")
    settings = {"ENGINE": "embedded", "INDEX_DEBOUNCE": str(DEBOUNCE), **module_backing.settings}
    with make_server(workdir, users=("alice", "carol", "dave"), **settings).start() as server:
        yield server


@pytest.mark.parametrize("engine", ["embedded", "funes"])
async def test_the_first_search_before_the_first_index_run_ends_says_not_yet_without_a_warning(
    tmp_path: Path,
    module_backing: Backing,
    fake_funes: FakeFunes,
    engine: str,
    request: pytest.FixtureRequest,
) -> None:
    if engine == "funes" and module_backing.name == "postgres":
        pytest.skip("the PostgreSQL store searches with the embedded ranking only")
    # Given a server whose index runs wait a long debounce after a post (embedded: the module's,
    # its log read from here on)
    if engine == "embedded":
        shared: Server = request.getfixturevalue("debounced")
        running, logged = contextlib.nullcontext(shared), len(shared.log())
    else:
        settings = {"ENGINE": engine, "FUNES_BIN": str(fake_funes.path), "INDEX_DEBOUNCE": "30"}
        running, logged = make_server(tmp_path, users=("carol",), **settings).start(), 0
    with running as server:
        # When carol's agent searches right after her first post
        body = conversation("carol", "c1", "ticket MT-4471 is open on the K-2 compressor")
        assert server.post(body)[0] == 202
        answer = await server.recall("carol", "MT-4471")
        # Then it hears that her memory is not searchable yet, no failure, and no warning is
        # logged
        assert answer == NOT_YET
        assert "WARNING" not in server.log()[logged:]


async def test_a_search_while_a_posted_conversation_waits_for_its_index_run_states_no_negative(
    debounced: Server,
) -> None:
    # Given alice's memory indexed once, on a server whose index runs wait a debounce after a post
    server = debounced
    assert server.post(conversation("alice", "c1", "The K-2 compressor was serviced."))[0]
    server.wait_indexed("alice")
    wait_for(lambda: server.health()["indexing"] == 0)
    # When a conversation that mentions P-7 is stored (202), and her agent searches at once
    posted = time.monotonic()
    body = conversation("alice", "c2", "Motor P-7 has bearing noise, ticket MT-5120.")
    assert server.post(body)[0] == 202
    named = await server.recall("alice", "P-7 bearing")
    unrelated = await server.recall("alice", "zebra giraffe savanna")
    assert time.monotonic() - posted < DEBOUNCE, "the run may have come: the test proves nought"
    # Then neither answer states a negative as fact: each says recent ones are being indexed
    for answer in (named, unrelated):
        assert "No earlier conversation mentions" not in answer, answer
        assert "Nothing relevant" not in answer, answer
        assert "still being indexed" in answer, answer
    assert named.startswith(NEVER_MENTIONED_YET.format("P-7"))
    assert unrelated == NOTHING_YET
    # and once the run is done, P-7 is found, and a term never mentioned is told plainly
    server.wait_indexed("alice")
    wait_for(lambda: server.health()["indexing"] == 0)
    assert "Motor P-7 has bearing noise" in await server.recall("alice", "P-7 bearing")
    never = await server.recall("alice", "Q-9 bearing")
    assert never.startswith(NEVER_MENTIONED.format("Q-9")), never
    assert "still being indexed" not in never
    assert await server.recall("alice", "zebra giraffe savanna") == NOTHING_FOUND


async def test_an_identifier_never_mentioned_while_a_run_is_due_is_not_yet_and_spans_hold(
    debounced: Server,
) -> None:
    # Given dave's memory indexed once, on a server whose index runs wait a debounce after a post
    server = debounced
    assert server.post(conversation("dave", "d1", "The K-2 compressor was serviced."))[0] == 202
    server.wait_indexed("dave")
    wait_for(lambda: server.health()["indexing"] == 0)
    # When another conversation is stored (a run is due), and he searches for an identifier no
    # conversation holds beside a word one does, through the tool and on his memory page
    posted = time.monotonic()
    body = conversation("dave", "d2", "The Z-3 pump was replaced.")
    assert server.post(body)[0] == 202
    tool_answer = await server.recall("dave", "Q-9 compressor")
    page = page_search(server, "dave", "Q-9 compressor")
    assert time.monotonic() - posted < DEBOUNCE, "the run may have come: the test proves nought"
    # Then the never-mentioned line says "not yet", above the K-2 passage, and the passage's
    # span is its block: the page's notes (the answer's lines outside the spans) are exactly the
    # lines before it, and the page's answer is the tool's
    assert tool_answer.startswith(NEVER_MENTIONED_YET.format("Q-9") + "\n"), tool_answer
    assert "The K-2 compressor was serviced." in tool_answer
    assert page["answer"] == tool_answer
    assert len(page["passages"]) == tool_answer.count("\n---\n") == 1
    lead = tool_answer[: tool_answer.index("\n[") + 1]
    assert page["notes"] == lead.splitlines(), page["notes"]


def page_search(server: Server, user: str, query: str) -> dict[str, Any]:
    """The user's memory page's search (POST /api/me/search), which must succeed."""
    request = urllib.request.Request(
        f"{server.url}/api/me/search",
        data=json.dumps({"query": query}).encode(),
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {server.tokens[user]}",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


async def test_a_lost_index_still_answers_unavailable_and_warns(
    server: Server, module_backing: Backing
) -> None:
    if module_backing.name != "files":
        pytest.skip("an index file of the files store; PostgreSQL keeps its index in tables")
    # Given bob's index built once (no other test here posts for him), then deleted behind the
    # server's back
    assert server.post(conversation("bob", "c1", "ticket MT-4471 is open"))[0] == 202
    server.wait_indexed("bob")
    assert "no readable index" not in server.log()
    db_path(server.home("bob")).unlink()
    # When his agent searches, the answer fails soft and the loss is logged as a warning
    assert await server.recall("bob", "MT-4471") == UNAVAILABLE
    assert "no readable index; rebuilding" in server.log()
