"""The seeded demo end to end: the real server on the embedded engine, seeded by seeds/seed.py the
way the gateway does it, asked through an MCP client with the demo tokens and the short queries
an agent sends. Each of the demo's five questions finds its facts; bob's chat stays his; and
examples/recall-runs.md is what these queries give now."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import ROOT, Server

from devtools.demo import seeded_demo
from examples.record_runs import COMMAND, RECORD, record
from recall.domain.answers import (
    NEAR_MISSES,
    NEVER_MENTIONED,
    NO_MEMORY,
    NOTHING_FOUND,
    UNAVAILABLE,
)

INDEX_TIMEOUT = 180.0  # seconds for both users' index runs to catch up after seeding


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One seeded server for the module: seeding and indexing are the slow part."""
    server = seeded_demo(tmp_path_factory.mktemp("demo"), timeout=INDEX_TIMEOUT)
    try:
        yield server
    finally:
        server.stop()


async def ask(server: Server, user: str, *queries: str) -> list[str]:
    answers = [await server.recall(user, query) for query in queries]
    for answer in answers:
        assert answer not in (UNAVAILABLE, NO_MEMORY)
    return answers


def passages(answer: str) -> str:
    """The answer less its never-mentioned notes, which only repeat the query's own ids."""
    notes = (NEVER_MENTIONED.split("{")[0], NEAR_MISSES.split("{")[0])
    return "\n".join(line for line in answer.splitlines() if not line.startswith(notes))


def missing(facts: list[str], answers: list[str]) -> list[str]:
    """The facts that appear in none of the answers."""
    return [fact for fact in facts if not any(fact in answer for answer in answers)]


async def test_n11_decision_and_its_mt4471_blocker_are_found_across_two_chats(
    demo: Server,
) -> None:
    queries = ("N-11 upgrade", "N-11 blocker schedule", "MT-4471 K-2 machine", "MT-4471 closed")
    answers = await ask(demo, "alice", *queries)
    facts = [
        "[2026-10-08",  # the capacity check that took the decision
        "go ahead with the N-11 upgrade",
        "91%",
        "2,185 of 2,400 units/d",
        "scheduled once MT-4471 is closed",
        "[2026-10-03",  # the shift handover that raised the ticket
        "K-2 compressor tripped twice",
        "Ticket MT-4471 open",
    ]
    assert not missing(facts, answers)


async def test_empty_reconciliation_columns_lead_to_the_f204_gap_and_priya(demo: Server) -> None:
    queries = ("reconciliation columns empty", "reconciliation failed", "F-204 escalated")
    answers = await ask(demo, "alice", *queries)
    facts = [
        "reconciliation columns are empty from 09-23 to 09-25",
        "Tomas",
        "gap in data feed F-204",
        "Priya (integrations lead)",
        "Due 2026-10-05",
    ]
    assert not missing(facts, answers)


async def test_follow_ups_with_owners_and_due_dates_are_found_across_five_chats(
    demo: Server,
) -> None:
    queries = ("follow-ups", "follow-up due", "by Friday", "escalated follow-up")
    answers = await ask(demo, "alice", *queries)
    owners = ["Tomas", "Jonas", "Marta", "Priya", "Kofi", "Dana"]
    due = ["2026-10-02", "Friday 2 October", "2026-10-05", "2026-10-06", "2026-10-09", "14 October"]
    chats = ["[2026-09-28 08:", "[2026-09-28 14:", "[2026-10-01", "[2026-10-03", "[2026-10-08"]
    assert not missing(owners + due + chats, answers)


async def test_forecast_base_case_comes_back_with_its_exact_parameters_and_results(
    demo: Server,
) -> None:
    queries = ("forecast base case", "base case parameters", "forecast 18 months")
    answers = await ask(demo, "alice", *queries)
    facts = [
        "Base case: Arps hyperbolic, q0 1,500 units/d, Di 0.25/yr, b 0.6",
        "1,069.5 units/d at 18 months, 693.3 k units cumulative",
        "[2026-09-28",
    ]
    assert not missing(facts, answers)


@pytest.mark.parametrize("query", ["P-7 motor", "MT-5120"])
async def test_alice_finds_nothing_of_bobs_p7_motor_chat(demo: Server, query: str) -> None:
    [answer] = await ask(demo, "alice", query)
    assert answer.startswith(NEVER_MENTIONED.format(query.split()[0]))  # hers holds none
    for bobs in ("P-7", "MT-5120", "South hub", "bearing", "Ravi"):
        assert bobs not in passages(answer)


@pytest.mark.parametrize("query", ["P-7 motor", "MT-5120"])
async def test_bob_finds_his_p7_motor_chat(demo: Server, query: str) -> None:
    [answer] = await ask(demo, "bob", query)
    assert answer != NOTHING_FOUND
    for fact in ("[2026-10-06", "P-7", "MT-5120", "drive-end bearing"):
        assert fact in answer


async def test_bob_finds_nothing_of_alices_chats(demo: Server) -> None:
    for answer in await ask(demo, "bob", "N-11 upgrade", "MT-4471 K-2", "forecast base case"):
        for alices in ("N-11", "MT-4471", "K-2", "hyperbolic", "Priya"):
            assert alices not in passages(answer)


F204_ERROR = (
    "ERROR recon.load: gap in data feed F-204: 15 of 96 intervals missing for the settlement "
    "window; refusing to reconcile with partial input; aborting run (exit 3)"
)


async def test_the_f204_error_cut_in_the_previews_is_read_whole_in_one_call(demo: Server) -> None:
    # given the search the README shows: the error line only as a preview, cut short
    [answer] = await ask(demo, "alice", "nightly jobs")
    assert F204_ERROR not in answer
    block = next(b for b in answer.split("---\n") if "ERROR recon.load: gap in data feed" in b)
    header = re.match(r"\[2026-10-01 \d\d:\d\d UTC\] \w+ · ref ([0-9a-f]{12}) turn \d+\n", block)
    assert header, block
    # when the agent reads the turn that holds it by the passage header's ref
    read = await demo.read("alice", ref=header[1], from_turn=3, to_turn=3)
    # then the error comes whole, dated, in one call, and the last line says what is left
    assert read == (
        "[2026-10-01 07:47 UTC] user · turn 3\n"
        f"From the 09-30 log:\n{F204_ERROR}\n"
        "The 09-26 log has the same error, 8 of 96 intervals missing.\n"
        "---\n"
        f'Shown: turn 3 of 10. Read on with read_my_conversation(ref="{header[1]}", '
        "from_turn=4).\n"
    )


def record_answers(record_text: str) -> list[tuple[str, str]]:
    """The record's (query, answer) pairs in order, from its `### `query`` headings."""
    parts = re.split(r"^### `(.+)`$", record_text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


async def test_the_committed_recall_runs_record_is_what_a_fresh_run_gives(demo: Server) -> None:
    # given the committed record of the demo's queries
    committed = RECORD.read_text(encoding="utf-8")
    # when the record script asks the freshly seeded demo server the same queries
    fresh = await record(demo)
    # then the file is what the code gives now, word for word
    pairs = zip(record_answers(fresh), record_answers(committed), strict=False)
    stale = [query for (query, answer), old in pairs if (query, answer) != old]
    assert fresh == committed, (
        f"{RECORD.name} is stale ({len(stale)} answers differ: {stale}); regenerate it with "
        f"`{COMMAND}`"
    )


def search_py(server: Server, *argv: str) -> subprocess.CompletedProcess[str]:
    """examples/search.py as a person runs it, with alice's demo token."""
    token = server.tokens["alice"]
    command = [sys.executable, "examples/search.py", "--url", server.url, "--token", token, *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)


async def test_search_py_prints_what_an_mcp_client_gets_from_both_tools(demo: Server) -> None:
    # given the seeded demo, asked by the script and by FastMCP's client
    searched = search_py(demo, "N-11 upgrade")
    read = search_py(demo, "--read", "a0f0ef5bcc97", "--from-turn", "3", "--to-turn", "3")
    # then the script prints each tool's answer exactly
    assert searched.stdout == await demo.recall("alice", "N-11 upgrade") + "\n", searched.stderr
    turn_3 = await demo.read("alice", ref="a0f0ef5bcc97", from_turn=3, to_turn=3)
    assert read.stdout == turn_3 + "\n", read.stderr
    # and a range the tool refuses is one line naming the argument, exit status 1
    refused = search_py(demo, "--read", "a0f0ef5bcc97", "--from-turn", "0")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("search.py: the tool refused the call: from_turn: ")
    assert len(refused.stderr.splitlines()) == 1
