"""Recall answers stay out of memory: a turn marked "recalled" is stored, never returned as a
passage by either engine, and shown as a neighbour only with its mark."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Backing, FakeFunes, Server, install_fake_funes, make_server, tree, turn
from fake_funes import validate_file

WRONG = "MT-4471 is owned by Zoltan from finance, since the K-2 audit."


def history(user: str) -> list[dict[str, Any]]:
    """The truth told once; later, an answer built from recall that got it wrong."""
    truth = {
        "user": user,
        "conversation_id": "truth",
        "turns": [
            turn("user", "Who owns ticket MT-4471 for the K-2 machine?", "2026-10-01T09:00:00Z"),
            turn("assistant", "Dana from platform owns MT-4471.", "2026-10-01T09:01:00Z"),
        ],
    }
    later = {
        "user": user,
        "conversation_id": "later",
        "turns": [
            turn("user", "Remind me who owns MT-4471?", "2026-10-09T09:00:00Z"),
            turn("assistant", WRONG, "2026-10-09T09:01:00Z", recalled=True),
            turn("user", "Thanks, I will write to them about the audit.", "2026-10-09T09:02:00Z"),
        ],
    }
    return [truth, later]


def assert_wrong_answer_is_no_passage(found: str, neighbour_mark: str) -> None:
    lines = [line for line in found.splitlines() if "Zoltan" in line]
    # It may show next to a hit, as a neighbour with its mark, but never as a passage.
    for line in lines:
        assert line.lstrip().startswith("~") and neighbour_mark in line, found


# A server start costs seconds of CPU: one funes server (and its stand-in) for the module's
# funes tests; they post for different users (a refused post leaves the tree as it was).
@pytest.fixture(scope="module")
def fake_funes(tmp_path_factory: pytest.TempPathFactory) -> FakeFunes:
    return install_fake_funes(tmp_path_factory.mktemp("recalled-funes") / "funes-bin")


@pytest.fixture(scope="module")
def funes_server(
    tmp_path_factory: pytest.TempPathFactory, fake_funes: FakeFunes
) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("recalled-funes-server")
    with make_server(workdir, ENGINE="funes", FUNES_BIN=str(fake_funes.path)).start() as server:
        yield server


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory, module_backing: Backing) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("recalled")
    server = make_server(workdir, ENGINE="embedded", **module_backing.settings).start()
    yield server
    server.stop()


def test_a_recalled_turn_is_stored_whole_in_valid_funes_format(
    funes_server: Server, tmp_path: Path
) -> None:
    # Given a conversation with a turn answered from recall
    # When it is posted
    status, _ = funes_server.post(history("alice")[1])
    # Then the turn is stored, marked by its block type, and the file is valid format 1
    assert status == 202
    source = funes_server.home("alice") / "src" / "later.funes.jsonl"
    assert validate_file(source) is None
    text = source.read_text()
    assert WRONG in text
    assert '"block_type": "tool_result", "tool_name": "recall_my_conversations"' in text


def test_a_recalled_flag_that_is_not_a_boolean_is_refused(funes_server: Server) -> None:
    body = history("bob")[1]
    body["turns"][1]["recalled"] = "yes"
    before = tree(funes_server.data_dir)
    status, answer = funes_server.post(body)
    assert (status, answer) == (400, {"error": "turns[1].recalled: must be true or false"})
    assert tree(funes_server.data_dir) == before


async def test_a_wrong_answer_built_from_recall_never_comes_back_as_a_memory_embedded(
    embedded: Server,
) -> None:
    # Given the truth, and later a wrong answer the agent built with recall
    for body in history("alice"):
        assert embedded.post(body)[0] == 202
    embedded.wait_indexed("alice")
    # When the agent asks about it, in the wrong answer's own words
    found = await embedded.recall("alice", "MT-4471 owner Zoltan finance audit")
    # Then the truth comes back, and the wrong answer only as a marked neighbour
    assert "Dana from platform owns MT-4471." in found
    assert_wrong_answer_is_no_passage(found, "answered from recall")


async def test_a_wrong_answer_built_from_recall_never_comes_back_as_a_memory_funes(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    # Given the truth, and later a wrong answer the agent built with recall
    for body in history("bob"):
        assert funes_server.post(body)[0] == 202
    funes_server.wait_indexed("bob")
    # When the agent asks about it, in the wrong answer's own words (funes ranks it first)
    found = await funes_server.recall("bob", "MT-4471 owner Zoltan finance audit")
    # Then the wrong answer comes back only as a marked neighbour of the turns around it (funes
    # ranked it among its k: the answer has one hit fewer, see docs/CONTRACTS.md)
    assert "Remind me who owns MT-4471?" in found
    assert "Zoltan" in found
    assert_wrong_answer_is_no_passage(found, "recalled")


async def test_a_turn_marked_recalled_on_a_later_post_leaves_the_embedded_search(
    embedded: Server,
) -> None:
    # Given a conversation whose answer was first posted unmarked, and found
    body = {
        "user": "bob",
        "conversation_id": "flip",
        "turns": [
            turn("user", "What is the pressure limit for the Q-9 valve?", "2026-10-02T09:00:00Z"),
            turn("assistant", "The Q-9 valve limit is 42 bar.", "2026-10-02T09:01:00Z"),
        ],
    }
    assert embedded.post(body)[0] == 202
    embedded.wait_indexed("bob")
    assert "The Q-9 valve limit is 42 bar." in await embedded.recall("bob", "Q-9 valve 42 bar")
    # When the gateway re-posts it with the answer marked as built from recall
    body["turns"][1]["recalled"] = True
    assert embedded.post(body)[0] == 202
    embedded.wait_indexed("bob")
    # Then the answer is no passage any more
    found = await embedded.recall("bob", "Q-9 valve 42 bar")
    for line in found.splitlines():
        if "42 bar" in line:
            assert line.lstrip().startswith("~") and "answered from recall" in line, found
