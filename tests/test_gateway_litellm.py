"""The LiteLLM proxy callback (integrations/litellm/recall_litellm.py): a finished completion, in
the kwargs shape LiteLLM's CustomLogger hooks receive, reaches a real recall-server and is
recalled through the MCP tool, on both stores; the hook never waits for the server.

A test with LiteLLM's own proxy runs where a Python with `litellm[proxy]` is named by
RECALL_TEST_LITELLM_PYTHON (LiteLLM's proxy needs mcp<2, the server's fastmcp needs mcp>=2.3:
they cannot share one environment, so the proxy runs from its own, as in production)."""

from __future__ import annotations

import datetime
import json
import os
import secrets
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Backing, Server, make_server, wait_for
from gateway_helpers import LITELLM_DIR, load_litellm_callback, stalled_server

from devtools.testing import free_port

RECALL_LITELLM = load_litellm_callback()
FACT = "The K-2 rollout moved to Thursday because the load balancer certificate expires Wednesday."
END = datetime.datetime(2026, 11, 3, 9, 30, tzinfo=datetime.UTC)


def kwargs_of(
    messages: list[dict[str, Any]],
    end_user: str | None = None,
    key_user: str | None = None,
    session: str | None = None,
) -> dict[str, Any]:
    """What the proxy passes a CustomLogger: the request's messages, litellm_params (with the
    request's litellm_session_id) and the standard logging payload (end user, key metadata)."""
    return {
        "model": "fake-gpt",
        "messages": messages,
        "litellm_params": {"litellm_session_id": session, "metadata": {}},
        "standard_logging_object": {
            "end_user": end_user,
            "metadata": {"user_api_key_user_id": key_user, "requester_metadata": {}},
        },
    }


def answer(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_backing: Backing) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("litellm")
    started = make_server(workdir, ENGINE="embedded", **module_backing.settings).start()
    yield started
    started.stop()


def logger_for(server: Server) -> Any:
    return RECALL_LITELLM.RecallLogger(server.url, server.ingest_key, backoff=0.05)


async def test_a_finished_completion_is_recalled_through_the_mcp_tool(server: Server) -> None:
    logger = logger_for(server)
    question = [{"role": "user", "content": "When is the K-2 rollout now?"}]
    kwargs = kwargs_of(question, end_user="alice", key_user="team-key-owner", session="s-k2")
    await logger.async_log_success_event(kwargs, answer(FACT), END, END)
    assert logger.forwarder.drain(60)
    assert (logger.forwarder.sent, logger.forwarder.dropped) == (1, 0)
    server.wait_indexed("alice")
    found = await server.recall("alice", "when is the K-2 rollout")
    assert "Thursday" in found and "load balancer certificate" in found
    assert "K-2" not in await server.recall("bob", "when is the K-2 rollout")


async def test_a_recall_tool_answer_is_stored_marked_recalled(server: Server) -> None:
    logger = logger_for(server)
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "recall_my_conversations", "arguments": '{"query": "K-2"}'}
    messages = [
        {"role": "user", "content": "What did we say about K-2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "[2026-11-03] K-2 on Thursday"},
    ]
    kwargs = kwargs_of(messages, end_user="bob", session="s-recalled")
    await logger.async_log_success_event(kwargs, answer("It moved to Thursday."), END, END)
    assert logger.forwarder.drain(60)
    turns = server.stored_turns("bob", "s-recalled")
    assert turns is not None
    assert [(t["role"], t["recalled"]) for t in turns] == [
        ("user", False),
        ("tool", True),
        ("assistant", False),
    ]


async def test_the_request_user_wins_and_the_key_user_is_the_fallback(server: Server) -> None:
    logger = logger_for(server)
    chat = [{"role": "user", "content": "Note: the parking code is 4411."}]
    await logger.async_log_success_event(
        kwargs_of(chat, key_user="alice", session="s-key"), answer("Noted."), END, END
    )
    await logger.async_log_success_event(
        kwargs_of(chat, end_user="bob", key_user="alice", session="s-end"), answer("Ok."), END, END
    )
    assert logger.forwarder.drain(60)
    assert server.stored_turns("alice", "s-key") is not None
    assert server.stored_turns("bob", "s-end") is not None
    assert server.stored_turns("alice", "s-end") is None


async def test_without_a_session_the_next_request_extends_the_same_conversation(
    server: Server,
) -> None:
    logger = logger_for(server)
    first = [{"role": "user", "content": "Our Q4 offsite is in Porto."}]
    await logger.async_log_success_event(
        kwargs_of(first, end_user="alice"), answer("Nice."), END, END
    )
    later = END + datetime.timedelta(minutes=7)
    second = [
        *first,
        {"role": "assistant", "content": "Nice."},
        {"role": "user", "content": "Book it."},
    ]
    await logger.async_log_success_event(
        kwargs_of(second, end_user="alice"), answer("Done."), later, later
    )
    assert logger.forwarder.drain(60)
    cid = RECALL_LITELLM.conversation_id(kwargs_of(first), "alice", first)
    turns = server.stored_turns("alice", cid)
    assert turns is not None
    assert [t["text"] for t in turns] == [first[0]["content"], "Nice.", "Book it.", "Done."]
    # the earlier turns keep their first time; the new ones take the later request's
    assert [t["ts"][11:16] for t in turns] == ["09:30", "09:30", "09:37", "09:37"]


async def test_the_hook_returns_at_once_while_the_server_is_stalled() -> None:
    with stalled_server() as url:
        logger = RECALL_LITELLM.RecallLogger(url, secrets.token_hex(8), timeout=10)
        chat = [{"role": "user", "content": "hello"}]
        started = time.perf_counter()
        for _ in range(20):
            await logger.async_log_success_event(
                kwargs_of(chat, end_user="alice"), answer("hi"), END, END
            )
        elapsed = time.perf_counter() - started
    assert elapsed < 0.1, f"20 hooks took {elapsed * 1000:.1f} ms"


def test_without_url_or_key_the_callback_forwards_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECALL_URL", raising=False)
    monkeypatch.delenv("RECALL_INGEST_KEY", raising=False)
    logger = RECALL_LITELLM.RecallLogger()
    assert logger.forwarder is None
    logger.forward(
        kwargs_of([{"role": "user", "content": "x"}], end_user="alice"), answer("y"), END
    )


# --- LiteLLM's own proxy, from its own environment ----------------------------------------------

LITELLM_PYTHON = os.environ.get("RECALL_TEST_LITELLM_PYTHON", "")
PROXY_CONFIG = """model_list:
  - model_name: fake-gpt
    litellm_params:
      model: openai/fake-gpt
      api_key: not-used
      mock_response: "{answer}"
litellm_settings:
  callbacks: recall_litellm.handler
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not LITELLM_PYTHON,
    reason="set RECALL_TEST_LITELLM_PYTHON to a Python with litellm[proxy]==1.80.17 (it cannot "
    "share the server's environment: LiteLLM's proxy pins mcp<2)",
)
async def test_a_chat_through_a_real_litellm_proxy_is_recalled(
    server: Server, tmp_path: Path
) -> None:
    workdir = tmp_path / "proxy"
    workdir.mkdir()
    for name in ("recall_litellm.py", "recall_forward.py"):
        (workdir / name).write_text((LITELLM_DIR / name).read_text())
    (workdir / "config.yaml").write_text(PROXY_CONFIG.format(answer=FACT))
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(workdir),
        "RECALL_URL": server.url,
        "RECALL_INGEST_KEY": server.ingest_key,
        "PYTHONPATH": str(workdir),
    }
    command = [LITELLM_PYTHON, "-m", "litellm.proxy.proxy_cli", "--config", "config.yaml"]
    with open(workdir / "proxy.log", "wb") as log:
        proxy = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: proxy_ready(port), timeout=180, interval=0.5)
        chat = {
            "model": "fake-gpt",
            "user": "alice",
            "litellm_session_id": "proxy-chat-1",
            "messages": [{"role": "user", "content": "When is the K-2 rollout now?"}],
        }
        reply = post_json(f"http://127.0.0.1:{port}/v1/chat/completions", chat)
        assert reply["choices"][0]["message"]["content"] == FACT
        wait_for(lambda: server.stored_turns("alice", "proxy-chat-1") is not None, timeout=60)
        server.wait_indexed("alice")
        assert "load balancer certificate" in await server.recall("alice", "K-2 rollout day")
        # a streamed answer is forwarded once complete
        streamed = {**chat, "stream": True, "litellm_session_id": "proxy-chat-2"}
        assert b"data:" in post_raw(f"http://127.0.0.1:{port}/v1/chat/completions", streamed)
        wait_for(lambda: server.stored_turns("alice", "proxy-chat-2") is not None, timeout=60)
        stored = server.stored_turns("alice", "proxy-chat-2") or []
        assert [t["text"] for t in stored] == ["When is the K-2 rollout now?", FACT]
        assert server.ingest_key not in (workdir / "proxy.log").read_text(errors="replace")
    finally:
        proxy.terminate()
        proxy.wait(20)


def proxy_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=2):
            return True
    except OSError:
        return False


def post_raw(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(post_raw(url, body))
