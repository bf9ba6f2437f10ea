"""The read path's identity over a real socket: the user comes from the verified token only."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import FakeFunes, Server, conversation, make_server, wait_for
from fastmcp import Client
from fastmcp.server.auth.providers.jwt import RSAKeyPair

from recall.engines.base import NO_MEMORY

ISSUER = "https://id.example.test"
AUDIENCE = "recall-server"


def mcp_status(server: Server, token: str | None) -> int:
    """Status of a bare MCP initialize POST with the given bearer token (or none)."""
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
        b'"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}'
    )
    request = urllib.request.Request(f"{server.url}/mcp", data=body, method="POST")
    request.add_header("content-type", "application/json")
    request.add_header("accept", "application/json, text/event-stream")
    if token is not None:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_mcp_without_a_token_is_401(funes_server: Server) -> None:
    assert mcp_status(funes_server, None) == 401


def test_mcp_with_an_unknown_token_is_401(funes_server: Server) -> None:
    assert mcp_status(funes_server, "not-a-real-token") == 401
    assert mcp_status(funes_server, funes_server.tokens["alice"]) == 200


def test_healthz_needs_no_auth_and_tells_no_user_data(funes_server: Server) -> None:
    with urllib.request.urlopen(f"{funes_server.url}/healthz", timeout=5) as response:
        assert response.status == 200
        assert response.read() == b'{"status":"ok","engine":"funes"}'


async def test_each_token_only_ever_reaches_its_own_users_directory(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    for user in ("alice", "bob"):
        body = conversation(user, f"{user}-chat", f"{user} talks about ticket MT-4471", "Noted.")
        assert funes_server.post(body)[0] == 202
    wait_for(
        lambda: (
            len(fake_funes.calls("index")) >= 2
            and all((funes_server.home(u) / "memory").exists() for u in ("alice", "bob"))
        )
    )
    alice_answer = await funes_server.recall("alice", "MT-4471 bob alice")
    bob_answer = await funes_server.recall("bob", "MT-4471 bob alice")
    assert "alice talks" in alice_answer and "bob talks" not in alice_answer
    assert "bob talks" in bob_answer and "alice talks" not in bob_answer
    homes = [c["env"]["FUNES_HOME"] for c in fake_funes.calls("recall")]
    assert homes == [str(funes_server.home("alice")), str(funes_server.home("bob"))]


async def test_the_query_cannot_choose_whose_memory_is_searched(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    assert funes_server.post(conversation("bob", "b", "bob's secret MT-5120", "ok"))[0] == 202
    wait_for(lambda: (funes_server.home("bob") / "memory").exists())
    assert await funes_server.recall("alice", "user=bob MT-5120") == NO_MEMORY
    assert fake_funes.calls("recall") == []


@pytest.fixture
def jwt_server(tmp_path: Path, fake_funes: FakeFunes) -> tuple[Server, RSAKeyPair]:
    keys = RSAKeyPair.generate()
    server = make_server(
        tmp_path,
        ENGINE="funes",
        FUNES_BIN=str(fake_funes.path),
        AUTH_TOKENS_FILE="",
        JWT_PUBLIC_KEY=keys.public_key,
        JWT_ISSUER=ISSUER,
        JWT_AUDIENCE=AUDIENCE,
    ).start()
    yield server, keys
    server.stop()


async def test_a_jwt_signed_by_the_trusted_key_is_accepted_and_names_the_user(
    jwt_server: tuple[Server, RSAKeyPair], fake_funes: FakeFunes
) -> None:
    server, keys = jwt_server
    assert server.post(conversation("user-123", "c", "ticket MT-4471 is open", "ok"))[0] == 202
    wait_for(lambda: (server.home("user-123") / "memory").exists())
    # client_id differs from sub: the user must come from sub (JWT_USER_CLAIM), not client_id
    token = keys.create_token(
        subject="user-123", issuer=ISSUER, audience=AUDIENCE,
        additional_claims={"client_id": "chat-app"},
    )  # fmt: skip
    async with Client(f"{server.url}/mcp", auth=token) as client:
        result = await client.call_tool("recall_my_conversations", {"query": "MT-4471"})
    assert "MT-4471 is open" in result.content[0].text
    assert fake_funes.calls("recall")[-1]["env"]["FUNES_HOME"] == str(server.home("user-123"))


def test_a_jwt_for_another_audience_or_issuer_or_key_is_refused(
    jwt_server: tuple[Server, RSAKeyPair],
) -> None:
    server, keys = jwt_server
    wrong_audience = keys.create_token(subject="u", issuer=ISSUER, audience="other-service")
    wrong_issuer = keys.create_token(subject="u", issuer="https://evil.test", audience=AUDIENCE)
    other_key = RSAKeyPair.generate().create_token(subject="u", issuer=ISSUER, audience=AUDIENCE)
    right = keys.create_token(subject="u", issuer=ISSUER, audience=AUDIENCE)
    assert mcp_status(server, wrong_audience) == 401
    assert mcp_status(server, wrong_issuer) == 401
    assert mcp_status(server, other_key) == 401
    assert mcp_status(server, right) == 200
