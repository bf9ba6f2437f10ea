"""The app's parts on their own (recall/app/): a route module served with nothing but what it
needs, the fail-soft sequence over a store that fails, and the rule that keeps the server's
functions short enough to read."""

from __future__ import annotations

import ast
import asyncio
import secrets
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import conversation
from fastmcp import Client, FastMCP
from fastmcp.server.auth import AccessToken
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from recall.app import context
from recall.app.answers import MAX_TRIES, Answers, Read, Search
from recall.app.ingest import Ingest
from recall.app.operations import Operations
from recall.app.tools import Tools
from recall.concurrency import BoundedRuns
from recall.domain.answers import (
    NO_MEMORY,
    NOT_YET,
    NOTHING_FOUND,
    NOTHING_YET,
    UNAVAILABLE,
    Passage,
    Recalled,
)
from recall.domain.conversation import Conversation, user_dir_name
from recall.domain.errors import EngineError, Forgotten, StoreUnavailable
from recall.metrics import Metrics
from recall.settings import Settings
from recall.store import Located, Marked, Searched, leave_mark

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 80
ALICE = user_dir_name("alice")


class FakeStore:
    """A store that keeps what it is given and raises what a test tells it to, per method."""

    name = "fake"
    engine_name = "none"

    def __init__(self) -> None:
        self.failures: dict[str, BaseException] = {}
        self.slow: set[str] = set()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.stored: list[tuple[str, Conversation]] = []
        self.audited: list[tuple[str, dict[str, Any]]] = []
        self.repaired: list[str] = []
        self.memory_state = "ready"
        self.erased = False
        self.forgets = 0  # the next settles that find a forget since the search's read
        passage = Passage("c1", "t1", "2026-10-08T09:00:00Z", "assistant", 0, 16)
        self.found = Recalled("MT-4471 is open.", (passage,))  # what a search finds
        # The mark a read leaves before it can fail (None: it fails before any, as a database
        # that cannot be reached)
        self.early_mark: int | None = None

    async def _call(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        if method in self.slow:
            await asyncio.sleep(10)
        if method in self.failures:
            raise self.failures[method]

    async def put(self, user: str, conversation: Conversation) -> bool:
        await self._call("put", user)
        self.stored.append((user, conversation))
        return True

    async def receipts(self, user: str) -> list[dict[str, Any]]:
        await self._call("receipts", user)
        return []

    async def search(self, user: str, query: str, marked: Marked | None = None) -> Searched:
        leave_mark(marked, self.early_mark)
        await self._call("search", user, query)
        return Searched(self.memory_state, self.found, 1)  # type: ignore[arg-type]

    async def locate(self, user: str, ref: str, marked: Marked | None = None) -> Located:
        leave_mark(marked, self.early_mark)
        await self._call("locate", user, ref)
        return Located(None, 1)

    async def settle(self, user: str, mark: int | None, line: dict[str, Any] | None) -> str:
        await self._call("settle", user, mark)
        if self.erased:
            return "erased"
        if self.forgets:
            self.forgets -= 1
            return "forgotten"
        if line is None:
            return "kept"
        if "audit" in self.failures:
            return "unaudited"
        self.audited.append((user, line))
        return "kept"

    def repair(self, user: str) -> None:
        self.repaired.append(user)

    async def indexing(self) -> int:
        return 0

    async def index_lag(self) -> tuple[int, float]:
        return (0, 0.0)

    async def ready(self) -> str | None:
        return None


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / "tokens.json").write_text("{}")
    return Settings(
        ingest_key=secrets.token_hex(16),
        auth_tokens_file=tmp_path / "tokens.json",
        data_dir=tmp_path / "data",
        recall_timeout=0.5,
    )


def served(routes: list[tuple[str, list[str], Callable[..., Awaitable[Any]]]]) -> Starlette:
    """Only these routes, on a bare Starlette app: no FastMCP, no auth, no lifespan."""
    return Starlette(
        routes=[Route(path, endpoint, methods=methods) for path, methods, endpoint in routes]
    )


# --- a route module on its own ---------------------------------------------------------------


def test_ingest_route_serves_on_its_own_over_any_store(settings: Settings) -> None:
    # Given the ingest routes alone, over a store of the test's own
    store = FakeStore()
    app = context.build(settings, store=store)
    key = {"x-ingest-key": settings.ingest_key}
    body = conversation("alice", "conv-1", "Ticket MT-4471?", "It is open.")
    with TestClient(served(Ingest(app).routes())) as client:
        # When a conversation is posted with the key, without it, and while the store is down
        stored = client.post("/turns", json=body, headers=key)
        refused = client.post("/turns", json=body)
        store.failures["put"] = StoreUnavailable("down")
        down = client.post("/turns", json=body, headers=key)
        store.failures["put"] = Forgotten()
        forgotten = client.post("/turns", json=body, headers=key)
    # Then the store got the user's hash and the parsed conversation once, and each refusal
    # is the one the whole server answers
    assert stored.status_code == 202 and stored.json() == {"stored": "conv-1"}
    assert [(user, c.conversation_id) for user, c in store.stored] == [(ALICE, "conv-1")]
    assert refused.status_code == 401
    assert down.status_code == 503 and down.headers["retry-after"] == "5"
    assert forgotten.status_code == 410
    # and the route's own metric counted every answer
    sample = app.metrics.registry.get_sample_value
    assert sample("recall_server_ingest_requests_total", {"status": "202"}) == 1
    assert sample("recall_server_ingest_requests_total", {"status": "401"}) == 1


def test_operations_routes_serve_on_their_own(settings: Settings) -> None:
    app = context.build(settings, store=FakeStore())
    with TestClient(served(Operations(app).routes())) as client:
        health = client.get("/healthz").json()
        ready = client.get("/readyz").json()
    assert health == {"status": "ok", "store": "fake", "engine": "none", "indexing": 0}
    assert ready == {"status": "ready", "store": "fake", "engine": "none"}


# --- the fail-soft sequence, over a store that fails ------------------------------------------


def answers_over(store: FakeStore, metrics: Metrics | None = None) -> Answers:
    return Answers(store, BoundedRuns(2, 0.5), metrics or Metrics(), 2000, "sub")


def token(user: str = "alice") -> AccessToken:
    return AccessToken(
        token="t", client_id="gateway", scopes=[], claims={"sub": user, "azp": "gateway"}
    )


async def tool_search(answers: Answers, query: str = "MT-4471") -> str:
    return await answers.for_caller(token(), Search(query))


async def test_a_tool_call_reads_once_then_settles_once_with_its_audit_line() -> None:
    store = FakeStore()
    text = await tool_search(answers_over(store))
    assert text == "MT-4471 is open."
    assert [method for method, _ in store.calls] == ["search", "settle"]
    assert store.calls[1] == ("settle", (ALICE, 1))  # checked against the search's own mark
    line = store.audited[0][1]
    assert store.audited == [(ALICE, line)] and line["client"] == "gateway"
    assert line["query"] == "MT-4471" and line["outcome"] == "passages"


@pytest.mark.parametrize(
    ("method", "failure"),
    [
        ("search", StoreUnavailable("down")),
        ("search", EngineError("index unreadable")),
        ("search", OSError("disk")),
        ("settle", StoreUnavailable("down")),
    ],
)
async def test_every_failure_of_the_store_or_engine_answers_unavailable(
    method: str, failure: Exception
) -> None:
    store = FakeStore()
    store.failures[method] = failure
    assert await tool_search(answers_over(store)) == UNAVAILABLE
    # an unreadable index is rebuilt, nothing else is
    assert store.repaired == ([ALICE] if isinstance(failure, EngineError) else [])


async def test_a_failed_search_is_audited_as_unavailable_with_no_mark_to_check() -> None:
    store = FakeStore()
    store.failures["search"] = EngineError("index unreadable")
    assert await tool_search(answers_over(store)) == UNAVAILABLE
    assert store.calls[-1] == ("settle", (ALICE, None))
    assert [line["outcome"] for _, line in store.audited] == ["unavailable"]


@pytest.mark.parametrize("method", ["search", "locate"])
async def test_a_read_that_fails_after_its_mark_settles_its_audit_line_against_it(
    method: str,
) -> None:
    # Given a store whose read takes its mark (1), then fails
    call = Search("MT-4471") if method == "search" else Read("ref 3703f5ddfa38", 0, None)
    kept, erased = FakeStore(), FakeStore()
    for store in (kept, erased):
        store.early_mark = 1
        store.failures[method] = StoreUnavailable("down")
    erased.erased = True
    # When each answers a tool call, nothing erased since on one, an erase since on the other
    answer = await answers_over(kept).for_caller(token(), call)
    after_erase = await answers_over(erased).for_caller(token(), call)
    # Then both settle against the mark the read left: the line goes in unless an erase came
    # since, as any other audit line
    assert answer == UNAVAILABLE
    assert kept.calls[-1] == erased.calls[-1] == ("settle", (ALICE, 1))
    assert [line["outcome"] for _, line in kept.audited] == ["unavailable"]
    assert after_erase == call.erased.text and erased.audited == []


async def test_an_audit_that_cannot_be_written_lets_the_answer_out() -> None:
    store = FakeStore()
    store.failures["audit"] = OSError("disk")
    assert await tool_search(answers_over(store)) == "MT-4471 is open."
    assert store.audited == []


async def test_a_call_that_overlapped_an_erase_says_no_memory() -> None:
    store = FakeStore()
    store.erased = True
    assert await tool_search(answers_over(store)) == NO_MEMORY


async def test_a_forget_since_the_read_searches_again_and_audits_the_last_answer_only() -> None:
    store = FakeStore()
    store.forgets = 2
    assert await tool_search(answers_over(store)) == "MT-4471 is open."
    assert [method for method, _ in store.calls] == ["search", "settle"] * 3
    assert len(store.audited) == 1


async def test_a_search_that_meets_a_forget_on_every_try_answers_unavailable() -> None:
    store = FakeStore()
    store.forgets = MAX_TRIES
    assert await tool_search(answers_over(store)) == UNAVAILABLE
    assert [method for method, _ in store.calls] == ["search", "settle"] * MAX_TRIES
    assert store.audited == []


async def test_a_first_index_not_done_says_not_yet_and_sees_the_run_due() -> None:
    store = FakeStore()
    store.memory_state = "pending"
    assert await tool_search(answers_over(store)) == NOT_YET
    assert store.repaired == [ALICE]


@pytest.mark.parametrize(("state", "said"), [("ready", NOTHING_FOUND), ("behind", NOTHING_YET)])
async def test_nothing_found_while_a_run_is_due_says_nothing_yet_not_nothing(
    state: str, said: str
) -> None:
    store = FakeStore()
    store.memory_state, store.found = state, Recalled("")
    assert await tool_search(answers_over(store)) == said


async def test_a_recall_that_times_out_answers_unavailable_and_counts_a_timeout() -> None:
    store, metrics = FakeStore(), Metrics()
    store.slow.add("search")
    assert await tool_search(answers_over(store, metrics)) == UNAVAILABLE
    sample = metrics.registry.get_sample_value
    assert sample("recall_server_recalls_total", {"outcome": "timeout"}) == 1


async def test_a_token_without_the_user_claim_answers_unavailable_and_touches_nothing() -> None:
    store = FakeStore()
    answers = answers_over(store)
    nobody = AccessToken(token="t", client_id="gateway", scopes=[], claims={})
    text = await answers.for_caller(nobody, Search("MT-4471"))
    assert text == UNAVAILABLE and store.calls == []


async def test_the_page_search_is_the_tools_search_without_the_audit() -> None:
    store = FakeStore()
    found = await answers_over(store).page_search(ALICE, "MT-4471")
    assert found.text == "MT-4471 is open."
    assert store.calls[-1] == ("settle", (ALICE, 1)) and store.audited == []


async def test_the_tools_register_on_a_bare_server_and_answer_soft_without_a_token() -> None:
    # Given the two tools alone on a FastMCP server of their own, reached in memory (no token:
    # get_access_token() is None there)
    store = FakeStore()
    mcp = FastMCP("tools-only")
    Tools(answers_over(store)).register(mcp)
    async with Client(mcp) as client:
        listed = {tool.name: tool for tool in await client.list_tools()}
        text = await client.call_tool("recall_my_conversations", {"query": "MT-4471"})
    # Then each tool's arguments are the contract's (the method's self is no argument)
    assert set(listed) == {"recall_my_conversations", "read_my_conversation"}
    assert set(listed["recall_my_conversations"].input_schema["properties"]) == {"query"}
    assert set(listed["read_my_conversation"].input_schema["properties"]) == {
        "ref",
        "from_turn",
        "to_turn",
    }
    # and a call that names no user answers soft, the store untouched
    assert [block.text for block in text.content] == [UNAVAILABLE] and store.calls == []


# --- functions short enough to read ----------------------------------------------------------


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function, nested ones included, longer than the rule allows."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def app_sources() -> list[Path]:
    return [ROOT / "recall_server.py", *sorted((ROOT / "recall" / "app").glob("*.py"))]


@pytest.mark.parametrize("path", app_sources(), ids=lambda path: path.name)
def test_no_function_of_the_server_or_its_app_modules_is_over_80_lines(path: Path) -> None:
    assert long_functions(path.read_text()) == []


def test_the_length_rule_catches_the_one_function_create_app_was() -> None:
    # The server before recall/app/: create_app was one function of about 350 lines.
    old = subprocess.run(
        ["git", "show", "95ac802:recall_server.py"], cwd=ROOT, capture_output=True, text=True
    )
    if old.returncode != 0:
        pytest.skip("the repository's history is not here")
    assert [name for name, _ in long_functions(old.stdout)] == ["create_app"]
