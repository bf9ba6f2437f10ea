"""The agent wiring of docs/agents.md, run: each client library connects to a real recall-server
on a loopback port with the user's bearer token, lists the two tools and calls
recall_my_conversations directly through its own MCP client (no model needed). A library that is
not installed skips with the reason; `pip install -e '.[agents]'` installs them."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Server, conversation, make_server

TOOLS = {"recall_my_conversations", "read_my_conversation"}
FACT = "The staging database password rotation is owned by Priya and runs every 90 days."
QUERY = "who owns the staging password rotation"


def needs(module: str, why: str = "") -> pytest.MarkDecorator:
    absent = importlib.util.find_spec(module) is None
    return pytest.mark.skipif(absent, reason=why or f"{module} is not installed (.[agents])")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = make_server(tmp_path_factory.mktemp("agents"), ENGINE="embedded").start()
    status, _ = started.post(
        conversation("alice", "ops", "Who rotates the staging password?", FACT)
    )
    assert status == 202
    started.wait_indexed("alice")
    yield started
    started.stop()


def bearer(server: Server, user: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {server.tokens[user]}"}


def text_of(result: Any) -> str:
    return "\n".join(getattr(part, "text", "") for part in result.content)


@needs("agents")
async def test_openai_agents_sdk_lists_and_calls_the_tool(server: Server) -> None:
    from agents.mcp import MCPServerStreamableHttp

    params = {"url": f"{server.url}/mcp", "headers": bearer(server), "timeout": 30}
    async with MCPServerStreamableHttp(name="recall", params=params) as recall:
        assert {tool.name for tool in await recall.list_tools()} >= TOOLS
        found = text_of(await recall.call_tool("recall_my_conversations", {"query": QUERY}))
    assert "Priya" in found and "90 days" in found


@needs("pydantic_ai")
async def test_pydantic_ai_toolset_lists_and_calls_the_tool(server: Server) -> None:
    from pydantic_ai.mcp import MCPToolset

    toolset = MCPToolset(f"{server.url}/mcp", headers=bearer(server))
    async with toolset:
        assert {tool.name for tool in await toolset.list_tools()} >= TOOLS
        found = await toolset.direct_call_tool("recall_my_conversations", {"query": QUERY})
    assert "Priya" in str(found)


async def test_the_mcp_sdk_lists_and_calls_the_tool(server: Server) -> None:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers=bearer(server), timeout=30) as http,
        streamable_http_client(f"{server.url}/mcp", http_client=http) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        assert {tool.name for tool in (await session.list_tools()).tools} >= TOOLS
        found = text_of(await session.call_tool("recall_my_conversations", {"query": QUERY}))
    assert "Priya" in found


async def test_a_token_names_its_own_user_only(server: Server) -> None:
    # the same wiring with bob's token: alice's memory stays hers
    from fastmcp import Client

    async with Client(f"{server.url}/mcp", auth=server.tokens["bob"]) as client:
        result = await client.call_tool("recall_my_conversations", {"query": QUERY})
    assert "Priya" not in text_of(result)


def langchain_client() -> Any:
    """langchain-mcp-adapters' client, or a skip: 0.3.2 pins mcp<2 and fails to import beside
    the server's mcp 2.3 (fastmcp 4 needs it), so it runs in the agent's own environment."""
    try:
        from langchain_mcp_adapters.client import MultiServerMCPClient
    except ImportError as exc:
        pytest.skip(f"langchain-mcp-adapters not usable beside mcp>=2 here: {exc}")
    return MultiServerMCPClient


async def test_langchain_mcp_adapters_lists_and_calls_the_tool(server: Server) -> None:
    MultiServerMCPClient = langchain_client()

    connection = {"transport": "streamable_http", "url": f"{server.url}/mcp"}
    client = MultiServerMCPClient({"recall": {**connection, "headers": bearer(server)}})
    tools = {tool.name: tool for tool in await client.get_tools()}
    assert set(tools) >= TOOLS
    found = await tools["recall_my_conversations"].ainvoke({"query": QUERY})
    assert "Priya" in str(found)
