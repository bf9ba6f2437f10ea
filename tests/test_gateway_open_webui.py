"""The pasteable Open WebUI filter (integrations/open_webui/recall_filter.py): its `outlet`, given
the body Open WebUI documents for outlets (model, messages with id/role/content/timestamp,
chat_id, session_id, id) and the `__user__` it passes, posts the chat to a real recall-server,
where the MCP tool recalls it, on both stores; it returns the body untouched and at once, even
with the server stalled or the body unusable.

Open WebUI itself (open-webui 0.12.4) is not installed by the tests: its install took longer
than CI's whole budget here (see docs/gateways.md), so the filter is loaded the way Open WebUI
loads a pasted function: the file executed as a module, `Filter()`, its valves set."""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Backing, Server, make_server
from gateway_helpers import load_open_webui_filter, stalled_server

PASTED = load_open_webui_filter()
FACT = "Invoices for the Lisbon office go to ap-lisbon@example.test, approved by Marta."
SENT = 1_791_360_000  # 2026-10-07T08:00:00Z, Unix seconds as Open WebUI keeps them


def outlet_body(chat_id: str, *texts: str, recall_answer: str | None = None) -> dict[str, Any]:
    """The outlet body Open WebUI documents: the chat's messages so far and its ids."""
    roles = ["user", "assistant"]
    messages: list[dict[str, Any]] = [
        {"id": f"m{i}", "role": roles[i % 2], "content": text, "timestamp": SENT + 60 * i}
        for i, text in enumerate(texts)
    ]
    if recall_answer is not None:
        messages.insert(
            1, {"role": "tool", "name": "recall_my_conversations", "content": recall_answer}
        )
    return {
        "model": "llama3",
        "messages": messages,
        "chat_id": chat_id,
        "session_id": "sess-" + chat_id,
        "id": messages[-1].get("id", "m"),
    }


def user_of(email: str) -> dict[str, Any]:
    return {"id": "owui-" + email.split("@")[0], "email": email, "name": "N", "role": "user"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_backing: Backing) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("open-webui")
    users = ("alice@example.test", "bob@example.test", "owui-carol")
    started = make_server(workdir, users=users, ENGINE="embedded", **module_backing.settings)
    yield started.start()
    started.stop()


def pasted_filter(url: str, key: str, **valves: Any) -> Any:
    """A Filter as Open WebUI makes one, with the admin's valves."""
    made = PASTED.Filter()
    made.valves = PASTED.Filter.Valves(recall_url=url, ingest_key=key, **valves)
    return made


async def test_an_outlet_chat_is_recalled_through_the_mcp_tool(server: Server) -> None:
    made = pasted_filter(server.url, server.ingest_key)
    body = outlet_body("chat-ap", "Where do Lisbon invoices go?", FACT)
    unchanged = copy.deepcopy(body)
    assert await made.outlet(body, __user__=user_of("alice@example.test")) == unchanged
    assert made.forwarder().drain(60)
    turns = server.stored_turns("alice@example.test", "chat-ap")
    assert turns is not None
    assert [t["ts"] for t in turns] == ["2026-10-07T08:00:00Z", "2026-10-07T08:01:00Z"]
    server.wait_indexed("alice@example.test")
    found = await server.recall("alice@example.test", "who approves the Lisbon invoices")
    assert "Marta" in found and "ap-lisbon@example.test" in found
    assert "Marta" not in await server.recall("bob@example.test", "Lisbon invoices approved")


async def test_a_recall_tool_answer_in_the_chat_is_stored_marked_recalled(server: Server) -> None:
    made = pasted_filter(server.url, server.ingest_key)
    body = outlet_body("chat-rec", "Who approves?", "Marta.", recall_answer="[2026-10-06] Marta")
    await made.outlet(body, __user__=user_of("bob@example.test"))
    assert made.forwarder().drain(60)
    turns = server.stored_turns("bob@example.test", "chat-rec")
    assert turns is not None
    assert [(t["role"], t["recalled"]) for t in turns] == [
        ("user", False),
        ("tool", True),
        ("assistant", False),
    ]


async def test_the_user_valve_picks_open_webuis_id_instead_of_the_email(server: Server) -> None:
    made = pasted_filter(server.url, server.ingest_key, user_field="id")
    await made.outlet(outlet_body("chat-id", "hello", "hi"), __user__=user_of("carol@example.test"))
    assert made.forwarder().drain(60)
    assert server.stored_turns("owui-carol", "chat-id") is not None


async def test_the_key_comes_from_the_environment_when_the_valve_is_empty(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECALL_INGEST_KEY", server.ingest_key)
    made = pasted_filter(server.url, "")
    await made.outlet(outlet_body("chat-env", "hello", "hi"), __user__=user_of("bob@example.test"))
    assert made.forwarder().drain(60)
    assert (made.forwarder().sent, made.forwarder().dropped) == (1, 0)


@pytest.mark.parametrize(
    ("body", "user"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, user_of("a@b.test")),
        (outlet_body("chat-nouser", "x", "y"), None),
        ({"chat_id": "c", "messages": "not a list"}, user_of("a@b.test")),
        ("not even a dict", user_of("a@b.test")),
    ],
)
async def test_an_unusable_outlet_body_is_returned_untouched_and_nothing_is_sent(
    body: Any, user: Any
) -> None:
    with stalled_server() as url:
        made = pasted_filter(url, secrets.token_hex(8))
        assert await made.outlet(copy.deepcopy(body), __user__=user) == body
        assert made.forwarder().queue.qsize() == 0


async def test_the_outlet_returns_at_once_while_the_server_is_stalled() -> None:
    with stalled_server() as url:
        made = pasted_filter(url, secrets.token_hex(8))
        started = time.perf_counter()
        for i in range(20):
            await made.outlet(outlet_body(f"c{i}", "hi", "hello"), __user__=user_of("a@b.test"))
        elapsed = time.perf_counter() - started
    assert elapsed < 0.1, f"20 outlets took {elapsed * 1000:.1f} ms"


async def test_without_a_key_the_outlet_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECALL_INGEST_KEY", raising=False)
    made = pasted_filter("http://127.0.0.1:9", "")
    body = outlet_body("c", "hi", "hello")
    assert await made.outlet(copy.deepcopy(body), __user__=user_of("a@b.test")) == body
    assert made.forwarder() is None
