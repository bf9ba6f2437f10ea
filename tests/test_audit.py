"""The recall audit: every tool call is logged in the user's own directory, and POST /audit
returns it to the ingest key's holder: when, which client, the query, which passages (the
conversation and turn each came from, with its time), never their text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Backing, FakeFunes, Server, conversation, install_fake_funes, make_server

from recall.domain.answers import NEVER_MENTIONED, NO_MEMORY, NOT_YET, Passage, Recalled
from recall.domain.audit import entry
from recall.files.audit_file import AUDIT_FILE


def post_audit(server: Server, body: Any, key: str | None = "default") -> tuple[int, Any]:
    return server.post(body, key, route="/audit")


TICKET = conversation(
    "alice",
    "ticket",
    "Who owns ticket MT-4471 for the K-2 machine?",
    "Dana from platform owns MT-4471.",
    day=8,
)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory, module_backing: Backing) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("audit")
    server = make_server(workdir, ENGINE="embedded", **module_backing.settings).start()
    assert server.post(TICKET)[0] == 202
    server.wait_indexed("alice")
    yield server
    server.stop()


# A server start costs seconds of CPU: the funes tests (bob's and alice's) share one server and
# stand-in; each sees the stand-in's calls from its own start on and leaves its control as it was.
@pytest.fixture(scope="module")
def module_funes(tmp_path_factory: pytest.TempPathFactory) -> FakeFunes:
    return install_fake_funes(tmp_path_factory.mktemp("audit-funes") / "funes-bin")


@pytest.fixture
def fake_funes(module_funes: FakeFunes) -> Iterator[FakeFunes]:
    yield module_funes.from_now()
    module_funes.control()


@pytest.fixture(scope="module")
def funes_server(
    tmp_path_factory: pytest.TempPathFactory, module_funes: FakeFunes
) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("audit-funes-server")
    with make_server(workdir, ENGINE="funes", FUNES_BIN=str(module_funes.path)).start() as server:
        yield server


async def test_each_tool_call_is_audited_with_client_query_and_the_passages_times(
    embedded: Server, module_backing: Backing
) -> None:
    # Given alice's stored conversation
    # When her agent searches twice
    first = await embedded.recall("alice", "MT-4471 owner")
    await embedded.recall("alice", "   ")
    # Then her audit holds both calls, in order: client, query, outcome, the served turns' times
    status, answer = post_audit(embedded, {"user": "alice"})
    assert status == 200
    calls = answer["entries"][-2:]
    assert [c["query"] for c in calls] == ["MT-4471 owner", ""]
    assert [c["outcome"] for c in calls] == ["passages", "nothing_found"]
    assert all(c["client"] is None for c in calls)  # a demo token names no client, only the user
    served = calls[0]["served"]
    ticket_turns = [
        {
            "conversation_id": "ticket",
            "turn": "ticket-0",
            "ts": "2026-10-08T09:00:00Z",
            "role": "user",
        },
        {
            "conversation_id": "ticket",
            "turn": "ticket-1",
            "ts": "2026-10-08T09:01:00Z",
            "role": "assistant",
        },
    ]
    assert served and all(passage in ticket_turns for passage in served)
    assert len(served) == first.count("\n---\n") + first.startswith("---\n")
    assert calls[1]["served"] == []
    # And it holds no conversation text, and is hers alone
    assert "Dana" not in json.dumps(answer)
    assert post_audit(embedded, {"user": "bob"}) == (200, {"entries": []})
    if module_backing.name == "files":  # in her own directory
        assert (embedded.home("alice") / AUDIT_FILE).is_file()
        assert not (embedded.home("bob") / AUDIT_FILE).exists()


async def test_since_keeps_only_later_calls_and_other_users_see_none(embedded: Server) -> None:
    await embedded.recall("alice", "K-2 machine")
    # When the audit is asked from a time after every call
    status, later = post_audit(embedded, {"user": "alice", "since": "2999-01-01T00:00:00Z"})
    assert (status, later) == (200, {"entries": []})
    # And from the start of time, it holds the call
    status, everything = post_audit(embedded, {"user": "alice", "since": "2000-01-01T00:00:00Z"})
    assert status == 200 and "K-2 machine" in [c["query"] for c in everything["entries"]]
    # And a user with no calls has an empty audit
    assert post_audit(embedded, {"user": "carol"}) == (200, {"entries": []})


@pytest.mark.parametrize(
    ("body", "key", "expected"),
    [
        ({"user": "alice"}, None, (401, {"error": "x-ingest-key: missing or wrong"})),
        (
            {"user": "alice"},
            "wrong-key-0123456789",
            (401, {"error": "x-ingest-key: missing or wrong"}),
        ),
        ({}, "default", (400, {"error": "user: must be a string"})),
        (["alice"], "default", (400, {"error": "body: must be a JSON object"})),
        (
            {"user": "alice", "since": "yesterday"},
            "default",
            (400, {"error": "since: must be an RFC 3339 timestamp with Z or an offset"}),
        ),
    ],
)
def test_a_bad_audit_request_is_refused_naming_the_field(
    embedded: Server, body: Any, key: str | None, expected: tuple[int, Any]
) -> None:
    assert post_audit(embedded, body, key) == expected


async def test_the_funes_engines_served_passages_are_audited_by_their_turns(
    funes_server: Server,
) -> None:
    # Given bob's conversation indexed by funes
    body = conversation("bob", "motor", "Motor P-7 has bearing noise, ticket MT-5120.", "Logged.")
    assert funes_server.post(body)[0] == 202
    funes_server.wait_indexed("bob")
    # When his agent searches
    await funes_server.recall("bob", "P-7 bearing")
    # Then the audit names the served turn, as funes' hint line names it, and its time
    status, answer = post_audit(funes_server, {"user": "bob"})
    assert status == 200
    (call,) = answer["entries"]
    assert call["query"] == "P-7 bearing" and call["outcome"] == "passages"
    served = {"conversation_id": "motor", "turn": "motor-0", "ts": "2026-10-08T09:00:00Z"}
    assert served in call["served"]
    assert "bearing noise" not in json.dumps(answer)


@pytest.mark.parametrize(
    ("held", "words", "fails"),
    [
        # each its own conversation: the first one's erase left tombstones of its turns
        (("vault", "The vault word is zephyrquartz."), "zephyrquartz vault word", False),
        (("locker", "The locker code is quolvexite."), "quolvexite locker code", True),
    ],
    ids=["answered", "failed after its read"],
)
async def test_a_recall_that_overlapped_an_erase_answers_none_of_it_and_leaves_no_audit_line(
    funes_server: Server,
    fake_funes: FakeFunes,
    tmp_path: Path,
    held: tuple[str, str],
    words: str,
    fails: bool,
) -> None:
    # Given alice's indexed conversation, and a tool call that has read her memory and is held
    # (and will then answer, or fail: its answer then holds nothing read)
    assert funes_server.post(conversation("alice", *held, "Noted."))[0] == 202
    funes_server.wait_indexed("alice")
    gate = tmp_path / "recall-gate"
    fake_funes.control(recall_gate=str(gate), fail_after_read=fails)
    call = asyncio.create_task(funes_server.recall("alice", words))
    while not fake_funes.calls("recall"):
        await asyncio.sleep(0.05)
    # When her memory is erased meanwhile, and then the held call goes on
    status, _ = await asyncio.to_thread(funes_server.post, {"user": "alice"}, route="/erase")
    assert status == 200
    gate.touch()
    answer = await asyncio.wait_for(call, 60)
    # Then the agent gets nothing of what was erased (no memory), and its audit line met the
    # erase check as any other: none is left behind
    assert answer == NO_MEMORY
    assert post_audit(funes_server, {"user": "alice"}) == (200, {"entries": []})
    assert not (funes_server.home("alice") / AUDIT_FILE).exists()


def test_the_outcome_of_an_answer_is_named_by_what_it_shows() -> None:
    # An answer that only names identifiers no conversation mentions served nothing; the
    # not-yet answer is its own outcome; passages after the note are passages
    note = NEVER_MENTIONED.format("P-7")
    shown = Recalled(
        note + "\n[...]", (Passage("c1", "t1", "2026-10-08T09:00:00Z", "user", 38, 43),)
    )
    assert entry(None, "P-7", Recalled(note))["outcome"] == "nothing_found"
    assert entry(None, "P-7", Recalled(NOT_YET))["outcome"] == "not_yet"
    assert entry(None, "P-7 K-2", shown)["outcome"] == "passages"
