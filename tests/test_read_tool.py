"""The second tool, `read_my_conversation(ref, from_turn, to_turn)`, through a real MCP client
with each user's bearer token against the real server, on both stores: a passage header's
reference reads its turns whole, dated and word for word, within MAX_RESULT_CHARS, with a last
line that gives the exact call that reads on; the caller's own conversations only."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Backing, Server, make_server, turn
from fastmcp.exceptions import ToolError
from test_memory_api import call

from recall.domain.conversation import conversation_ref, user_dir_name
from recall.reading import NOT_FOUND

CAP = 900  # MAX_RESULT_CHARS: room for a few short turns, not for the long one
ERROR_LINE = (
    "ERROR recon.load: gap in data feed F-204: 15 of 96 intervals missing for the settlement "
    "window; refusing to reconcile with partial input; aborting run (exit 3)"
)
LONG = "Step by step, the reconciliation rebuild in full. " * 30  # ~1,500 characters
NIGHTLY = {
    "user": "alice",
    "conversation_id": "alice-nightly",
    "turns": [
        turn("user", "Health check on recon-nightly, please.", "2026-10-01T07:40:00Z"),
        turn("assistant", "recon-nightly failed twice. Error lines?", "2026-10-01T07:42:00Z"),
        turn("user", f"From the 09-30 log:\n{ERROR_LINE}", "2026-10-01T07:47:00Z"),
        turn("assistant", "Both failed on a gap in data feed F-204.", "2026-10-01T07:50:00Z"),
        turn("assistant", "From memory: F-204 had a gap.", "2026-10-01T07:55:00Z", recalled=True),
        turn("user", LONG, "2026-10-01T07:58:00Z"),
        turn("assistant", "Noted, Priya owns F-204.", "2026-10-01T08:01:00Z"),
    ],
}
BOBS = {
    "user": "bob",
    "conversation_id": "bob-motor",
    "turns": [turn("user", "The P-7 motor bearing runs hot.", "2026-10-06T10:00:00Z")],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_backing: Backing) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("read-tool")
    server = make_server(
        workdir,
        ENGINE="embedded",
        MAX_RESULT_CHARS=str(CAP),
        users=("alice", "bob", "carol"),  # carol's conversation is forgotten by a test
        **module_backing.settings,
    )
    server.start()
    for body in (NIGHTLY, BOBS):
        assert server.post(body)[0] == 202
    server.wait_indexed("alice", "bob")
    yield server
    server.stop()


def header_place(answer: str) -> tuple[str, int]:
    """The (ref, turn) the first passage header of a search's answer names."""
    found = re.search(r"^\[[^\]]+\] \S+ · ref ([0-9a-f]{12}) turn (\d+)$", answer, re.M)
    assert found, answer
    return found[1], int(found[2])


def audit_of(server: Server, user: str) -> list[dict[str, Any]]:
    status, answer = server.post({"user": user}, route="/audit")
    assert status == 200
    return answer["entries"]


async def test_a_passage_headers_ref_reads_its_turns_whole_dated_and_recalled_ones_labelled(
    server: Server,
) -> None:
    # given a search whose passage names the turn that holds the F-204 error
    ref, number = header_place(await server.recall("alice", "F-204 intervals missing exit 3"))
    assert number == 3
    # when the agent reads turns 3 to 5 of it
    answer = await server.read("alice", ref=ref, from_turn=3, to_turn=5)
    # then each is dated, word for word, the one answered from recall labelled as such
    assert answer == (
        "[2026-10-01 07:47 UTC] user · turn 3\n"
        f"From the 09-30 log:\n{ERROR_LINE}\n"
        "---\n"
        "[2026-10-01 07:50 UTC] assistant · turn 4\n"
        "Both failed on a gap in data feed F-204.\n"
        "---\n"
        "[2026-10-01 07:55 UTC] assistant, answered from recall · turn 5\n"
        "From memory: F-204 had a gap.\n"
        "---\n"
        "Shown: turns 3-5 of 7. Read on with "
        f'read_my_conversation(ref="{ref}", from_turn=6).\n'
    )


async def test_the_cap_holds_and_the_last_line_gives_the_exact_call_that_reads_on(
    server: Server,
) -> None:
    ref = conversation_ref(user_dir_name("alice"), "alice-nightly")
    # when the agent reads the whole conversation, which does not fit the cap
    first = await server.read("alice", ref=ref)
    # then the answer stops before the long turn 6, within the cap, and says how to read on
    assert len(first) <= CAP
    assert "turn 5\n" in first and "turn 6" not in first.split("Shown:")[0]
    call = f'read_my_conversation(ref="{ref}", from_turn=6, to_turn=7)'
    assert first.endswith(f"Shown: turns 1-5 of 7. The answer is capped; read on with {call}.\n")
    # and that call shows turn 6 alone, cut to the cap and saying so, and how to go on
    second = await server.read("alice", ref=ref, from_turn=6, to_turn=7)
    assert len(second) <= CAP
    assert second.startswith("[2026-10-01 07:58 UTC] user · turn 6\nStep by step")
    assert re.search(r"Shown: turn 6 of 7, cut at [\d,]+ of its 1,500 characters\. ", second)
    assert second.endswith(
        f'read on with read_my_conversation(ref="{ref}", from_turn=7, to_turn=7).\n'
    )
    # and the last turn reads whole, at the end of the conversation
    third = await server.read("alice", ref=ref, from_turn=7, to_turn=7)
    assert third.endswith(
        "Noted, Priya owns F-204.\n---\nShown: turn 7 of 7. That is the end of the conversation.\n"
    )


async def test_another_users_ref_answers_exactly_as_an_unknown_one(server: Server) -> None:
    # given bob's real reference, and references that name nothing
    bobs = header_place(await server.recall("bob", "P-7 motor bearing"))[0]
    unknown = conversation_ref(user_dir_name("alice"), "never-was")
    # when alice's agent reads each of them
    answers = {ref: await server.read("alice", ref=ref) for ref in (bobs, unknown, "zz")}
    # then every answer is the same one, which holds nothing of bob's
    assert set(answers.values()) == {NOT_FOUND}
    # while bob reads his own
    assert "P-7 motor bearing runs hot" in await server.read("bob", ref=bobs)


async def test_a_read_is_audited_with_the_turns_it_served(server: Server) -> None:
    ref = conversation_ref(user_dir_name("alice"), "alice-nightly")
    before = len(audit_of(server, "alice"))
    # when the agent reads two turns
    await server.read("alice", ref=ref, from_turn=3, to_turn=4)
    # then alice's audit has one more line: the read, what it asked for and the turns served
    lines = audit_of(server, "alice")
    assert len(lines) == before + 1
    line = lines[-1]
    assert line["tool"] == "read_my_conversation" and line["outcome"] == "passages"
    assert line["read"] == {"ref": ref, "from_turn": 3, "to_turn": 4}
    assert [(s["conversation_id"], s["turn"], s["ts"]) for s in line["served"]] == [
        ("alice-nightly", "alice-nightly-2", "2026-10-01T07:47:00Z"),
        ("alice-nightly", "alice-nightly-3", "2026-10-01T07:50:00Z"),
    ]
    # and a read of an unknown reference, or past the end, is audited as found nothing
    await server.read("alice", ref="0" * 12)
    assert audit_of(server, "alice")[-1]["outcome"] == "not_found"
    await server.read("alice", ref=ref, from_turn=99)
    assert audit_of(server, "alice")[-1]["outcome"] == "not_found"


async def test_a_huge_ref_is_audited_cut_and_the_audit_stays_small(server: Server) -> None:
    # given alice's audit, and an agent that passes a 1 MB ref three times
    before = len(audit_of(server, "alice"))
    huge = "a" * 1_000_000
    for _ in range(3):
        assert await server.read("alice", ref=huge) == NOT_FOUND
    # then each call is audited with the ref's start, cut, and the three lines stay small
    lines = audit_of(server, "alice")[before:]
    assert [line["read"]["ref"] for line in lines] == ["aaaaaaaaaaaa…"] * 3
    assert all(line["outcome"] == "not_found" for line in lines)
    assert len(json.dumps(lines)) < 1_000
    # and alice's whole audit page (the memory page's) is small too
    status, _, page = call(server, "GET", "/api/me/audit", token=server.tokens["alice"])
    assert status == 200 and len(json.dumps(page)) < 20_000


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"from_turn": 4, "to_turn": 2}, "from_turn: must not be after to_turn (4 > 2)"),
        ({"from_turn": -1}, "from_turn: must be 1 or more"),
        ({"from_turn": 0}, "from_turn: must be 1 or more"),
        ({"from_turn": 1, "to_turn": 0}, "to_turn: must be 1 or more"),
        ({"from_turn": "three"}, "from_turn"),
        ({"to_turn": 2.5}, "to_turn"),
    ],
)
async def test_bad_turn_arguments_are_refused_naming_the_argument_and_read_nothing(
    server: Server, arguments: dict[str, Any], message: str
) -> None:
    ref = conversation_ref(user_dir_name("alice"), "alice-nightly")
    before = len(audit_of(server, "alice"))
    # when the agent passes a range it cannot mean
    with pytest.raises(ToolError) as refused:
        await server.read("alice", ref=ref, **arguments)
    # then the call is an error whose message names the argument, and nothing was audited
    assert message in str(refused.value)
    assert len(audit_of(server, "alice")) == before


async def test_a_range_past_the_end_says_how_many_turns_there_are(server: Server) -> None:
    ref = conversation_ref(user_dir_name("alice"), "alice-nightly")
    answer = await server.read("alice", ref=ref, from_turn=9)
    assert answer == (
        "from_turn: this conversation has 7 turns; read it with "
        f'read_my_conversation(ref="{ref}", from_turn=1, to_turn=7).'
    )


async def test_the_ref_is_the_same_after_a_restart(server: Server) -> None:
    # given the reference a search shows
    before = header_place(await server.recall("alice", "F-204 intervals missing exit 3"))
    # when the server restarts
    server.stop()
    server.start()
    # then the same search shows the same reference, and it reads the same turn
    assert header_place(await server.recall("alice", "F-204 intervals missing exit 3")) == before
    assert ERROR_LINE in await server.read("alice", ref=before[0], from_turn=3, to_turn=3)


async def test_a_forgotten_conversation_is_unreadable_at_once(server: Server) -> None:
    # given a conversation the agent can read (carol's: no other test reads it)
    assert server.post({**BOBS, "user": "carol"})[0] == 202
    ref = conversation_ref(user_dir_name("carol"), "bob-motor")
    assert "P-7 motor" in await server.read("carol", ref=ref)
    # when it is forgotten
    status, _ = server.post({"user": "carol", "conversation_id": "bob-motor"}, route="/forget")
    assert status == 200
    # then the very next read finds nothing, as for a reference never given
    assert await server.read("carol", ref=ref) == NOT_FOUND
