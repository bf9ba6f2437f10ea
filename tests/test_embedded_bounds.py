"""The embedded engine's bounds: text work linear in the text, the vector cache bounded by bytes.

Real parts throughout: the real int8 MiniLM, real SQLite dbs built by index runs, recalls through
the engine's own entry point.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from math import inf
from pathlib import Path
from typing import Any

import pytest

from recall.domain.conversation import parse_conversation, user_dir_name
from recall.embedder import OnnxEmbedder
from recall.files.engines.embedded.engine import EmbeddedEngine
from recall.files.engines.factory import make_engine
from recall.files.layout import write_conversation
from recall.models import load_embedder
from recall.pg.fts import phrase_stems
from recall.ranking.text import (
    MAX_PHRASE_TERMS,
    PHRASE,
    coverage,
    focus_terms,
    identifier_forms,
    query_terms,
)
from recall.settings import Settings

# -- identifiers ----------------------------------------------------------------------------------

# The pattern before it was made linear: the reference for what counts as an identifier.
REFERENCE_IDENTIFIER = re.compile(r"[^\W_]+(?:[-_./#:][^\W_]+)+")


def reference_forms(text: str) -> list[str]:
    forms = []
    for token in REFERENCE_IDENTIFIER.findall(text):
        if len(token) <= 64 and any(c.isdigit() for c in token) and any(c.isalpha() for c in token):
            forms.append(re.sub(r"[\W_]+", "", token.lower()))
    return forms


@pytest.mark.parametrize(
    ("text", "forms"),
    [
        ("Can you summarise ticket MT-4471 for me?", ["mt4471"]),
        ("It is in ticket MT-4471.", ["mt4471"]),
        ("Runbook N-11, rollback N-12; the AC ticket is F-204!", ["n11", "n12", "f204"]),
        ("We upgraded to v2.3.1. Then to v1.2.3-rc.1, sadly.", ["v231", "v123rc1"]),
        ("(QA-77) and [K-2] and 'ZX-9917'", ["qa77", "k2", "zx9917"]),
        ("see docs/api/v2 and src/main.py:42 for it", ["docsapiv2", "srcmainpy42"]),
        ("closed by gh#1234, not by #42", ["gh1234"]),
        ("the field user_id_7 is gone", ["userid7"]),
        ("connect to db-01.eu:5432 now", ["db01eu5432"]),
        ("MT-4471/MT-4417 are both open", ["mt4471mt4417"]),
        (
            "request 3f2a1c9e-1b2c-4d5e-8f90-123456789abc failed",
            ["3f2a1c9e1b2c4d5e8f90123456789abc"],
        ),
        ("Größe-12 passt", ["größe12"]),
        ("standup at 9:30 or 10:15, e-mail the foo-bar team, __init__", []),
        ("trailing separators MT- 4471 and MT_ and -4471", []),
    ],
)
def test_identifiers_in_ordinary_text_give_the_same_terms(text: str, forms: list[str]) -> None:
    assert identifier_forms(text) == forms == reference_forms(text)


def test_the_query_and_focus_terms_of_an_ordinary_query_are_unchanged() -> None:
    assert query_terms("who owns MT-4471?") == ["owns", "mt", "4471", "mt4471"]
    # one-letter parts of ids ("v", "3", "1") are left to the joined forms
    assert query_terms("what changed in V-1415 and v2.3.1") == [
        "changed", "1415", "v2", "v1415", "v231"
    ]  # fmt: skip
    assert focus_terms("MT-4471 rollout in v2.3.1") == ["mt-4471", "v2.3.1", "4471", "rollout"]


def test_a_query_searches_only_its_first_eight_words_joined_by_underscores() -> None:
    # Given a query of twelve words joined by "_" (FTS5 phrases), a word and an identifier
    joined = [
        f"{a}_{b}" for a in ("user", "order", "cart") for b in ("name", "total", "line", "date")
    ]
    terms = query_terms(" ".join(joined) + " invoices MT-4471")

    # Then the first eight of them are searched, and the rest of the query as before
    assert [t for t in terms if "_" in t] == joined[:8]
    assert terms[8:] == ["invoices", "mt", "4471", "mt4471"]
    assert MAX_PHRASE_TERMS == 8


@pytest.mark.parametrize(
    "word", ["user_id", "a__b", "_id", "id_", "_", "ab_12", "x_y_z", "用户_id", "straße_nr"]
)
def test_a_word_counts_as_joined_exactly_when_fts5_reads_it_as_a_phrase(word: str) -> None:
    (as_written, *_) = phrase_stems([word])[0]
    assert bool(PHRASE.search(word)) == (len(as_written) > 1)


def test_identifiers_in_random_text_are_those_the_reference_pattern_finds() -> None:
    rng = random.Random(8)
    alphabet = "aZ7é_-./#:+ =!\n"
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert identifier_forms(text) == reference_forms(text), text


def test_an_identifier_longer_than_64_chars_is_not_a_term() -> None:
    longest = "a1-" * 21 + "b"  # 64 chars
    too_long = "a1-" * 21 + "bc"  # 65 chars
    assert identifier_forms(f"id {longest} here") == [re.sub(r"-", "", longest)]
    assert identifier_forms(f"id {too_long} here") == []
    assert "a1a1" not in "".join(query_terms(f"find {too_long}"))
    assert focus_terms(f"find {too_long}") == ["find"]


def _hex_blob(n: int) -> str:
    return ("3f9a0c7be14d2285" * n)[:n]


def _base64_blob(n: int) -> str:
    return "token " + ("aGVsbG8gd29ybGQgZnJvbSBiYXNlNjQ" * n)[:n] + "==."


def _coverage_of(text: str) -> int:
    return coverage(query_terms("MT-4471 blob"), text)


@pytest.mark.parametrize("blob", [_hex_blob, _base64_blob], ids=["hex", "base64"])
@pytest.mark.parametrize(
    "work",
    [identifier_forms, query_terms, focus_terms, _coverage_of],
    ids=["identifier_forms", "query_terms", "focus_terms", "coverage"],
)
def test_text_work_grows_linearly_with_a_long_unbroken_run(
    work: Callable[[str], Any], blob: Callable[[int], str]
) -> None:
    # Given a turn with a long run of letters and digits (a hash, a key), and one 8 times longer
    short, long = blob(1_200), blob(9_600)

    def cost(text: str, calls: int) -> float:
        # The fastest of a few runs, in this thread's CPU time: other load only adds to the rest.
        best = inf
        for _ in range(9):  # more runs: one preempted run must not decide
            start = time.thread_time()
            for _ in range(calls):
                work(text)
            best = min(best, (time.thread_time() - start) / calls)
        return best

    # When the work is timed on both
    ratio = cost(long, 2) / cost(short, 16)
    # Then 8 times the text costs about 8 times as much (quadratic work would cost 64 times)
    assert ratio < 20, f"8x the text cost {ratio:.0f}x the time"


# -- the vector cache -----------------------------------------------------------------------------


def post(home: Path, cid: str, turns: list[tuple[str, str]]) -> None:
    """Write a conversation as the /turns route would: one turn a minute."""
    t0 = datetime(2026, 3, 1, 9, 0)
    body = {
        "user": "someone",
        "conversation_id": cid,
        "turns": [
            {"role": role, "text": text, "ts": f"{t0 + timedelta(minutes=i):%Y-%m-%dT%H:%M:%SZ}"}
            for i, (role, text) in enumerate(turns)
        ],
    }
    write_conversation(home, parse_conversation(body))


USERS = ("ana@example.com", "bo@example.com", "cy@example.com")


@pytest.fixture(scope="module")
def embedder() -> OnnxEmbedder:
    return load_embedder()


@pytest.fixture(scope="module")
def homes(embedder: OnnxEmbedder, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three indexed users of the same size, in hashed directories as the server makes them."""
    data = tmp_path_factory.mktemp("data")
    homes = []
    for n, user in enumerate(USERS):
        home = data / user_dir_name(user)
        for c in range(4):
            post(
                home,
                f"c{c}-notes",
                [
                    ("user", f"What is the status of ticket MT-{n}{c}41?"),
                    ("assistant", f"MT-{n}{c}41 waits for review by the platform team, user {n}."),
                ],
            )
        asyncio.run(EmbeddedEngine(embedder).index(home))
        homes.append(home)
    return homes


@pytest.fixture(scope="module")
def matrix_bytes(embedder: OnnxEmbedder, homes: list[Path]) -> int:
    """What one user's matrix holds (all three users have as many passages)."""
    probe = EmbeddedEngine(embedder)
    asyncio.run(probe.recall(homes[0], "MT-0041"))
    return probe.cached_bytes


class LoadSpy:
    """Counts the engine's own matrix loads, and can hold each one inside the loader a while."""

    def __init__(self, engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loads = 0
        self.before_load: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        real = engine._load_vectors

        def load(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.loads += 1
            self.before_load()
            return real(*args, **kwargs)

        monkeypatch.setattr(engine, "_load_vectors", load)


async def test_the_cache_stays_within_its_byte_budget_and_drops_the_least_recently_used(
    embedder: OnnxEmbedder, homes: list[Path], matrix_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a budget for two users' matrices, not three
    budget = matrix_bytes * 5 // 2
    engine = EmbeddedEngine(embedder, cache_bytes=budget)
    spy = LoadSpy(engine, monkeypatch)
    a, b, c = homes

    async def loads_for(home: Path) -> int:
        before = spy.loads
        assert "MT-" in (await engine.recall(home, "status of the ticket")).text
        assert 0 < engine.cached_bytes <= budget
        return spy.loads - before

    # When the three users recall in turn, each loads its matrix, and the third evicts the first
    assert [await loads_for(h) for h in (a, b, c)] == [1, 1, 1]
    assert engine.cached_bytes == 2 * matrix_bytes
    assert await loads_for(c) == 0 and await loads_for(b) == 0  # b and c are kept
    # Then a comes back by evicting the least recently used (c), not the one just used (b)
    assert await loads_for(a) == 1
    assert await loads_for(b) == 0
    assert await loads_for(c) == 1


async def test_a_matrix_larger_than_the_budget_serves_its_recall_and_is_not_kept(
    embedder: OnnxEmbedder,
    homes: list[Path],
    matrix_bytes: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a budget for one ordinary user, and a user with three times as many passages
    big = tmp_path / user_dir_name("heavy@example.com")
    for c in range(12):
        post(big, f"c{c}-big", [("user", f"Is BIG-{c}7 done?"), ("assistant", f"BIG-{c}7: yes.")])
    await EmbeddedEngine(embedder).index(big)
    engine = EmbeddedEngine(embedder, cache_bytes=matrix_bytes * 3 // 2)
    spy = LoadSpy(engine, monkeypatch)
    assert "MT-0041" in (await engine.recall(homes[0], "MT-0041")).text
    # When the heavy user recalls twice
    for _ in range(2):
        assert "BIG-57" in (await engine.recall(big, "BIG-57")).text
        # Then each recall is answered from a matrix that is not kept
        assert engine.cached_bytes == matrix_bytes
    assert spy.loads == 3
    # And the ordinary user's matrix was not evicted for it
    assert "MT-0041" in (await engine.recall(homes[0], "MT-0041")).text
    assert spy.loads == 3


async def test_concurrent_recalls_for_one_uncached_user_load_its_matrix_once(
    embedder: OnnxEmbedder, homes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = EmbeddedEngine(embedder)
    spy = LoadSpy(engine, monkeypatch)
    spy.before_load = lambda: time.sleep(0.5)  # a slow load: the other recalls miss meanwhile
    # When four recalls for the same uncached user arrive together
    results = await asyncio.gather(*(engine.recall(homes[1], "MT-1041") for _ in range(4)))
    # Then the matrix was built once, and every recall was answered from it
    assert spy.loads == 1
    assert all("MT-1041" in r.text for r in results) and len(set(results)) == 1


async def test_different_users_load_their_matrices_in_parallel(
    embedder: OnnxEmbedder, homes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = EmbeddedEngine(embedder)
    spy = LoadSpy(engine, monkeypatch)
    both_loading = threading.Barrier(2, timeout=30)  # breaks unless both loads run at once
    spy.before_load = both_loading.wait
    results = await asyncio.gather(
        engine.recall(homes[0], "MT-0041"), engine.recall(homes[2], "MT-2041")
    )
    assert spy.loads == 2
    assert "MT-0041" in results[0].text and "MT-2041" in results[1].text


async def test_the_load_is_logged_with_its_size_and_directory_hash_never_the_user(
    embedder: OnnxEmbedder, homes: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="recall.embedded")
    await EmbeddedEngine(embedder).recall(homes[1], "MT-1041")
    lines = [r.getMessage() for r in caplog.records if r.name == "recall.embedded"]
    assert any(homes[1].name in line and re.search(r"\d+\.\d MB", line) for line in lines), lines
    assert homes[1].name == user_dir_name(USERS[1])
    assert USERS[1] not in caplog.text and "bo@" not in caplog.text
    assert "MT-1041" not in caplog.text  # nor the query


def test_vector_cache_mb_sets_the_embedded_engines_budget() -> None:
    settings = Settings(
        ingest_key="k" * 16, auth_tokens_file=Path("unused.json"), engine="embedded"
    )
    assert settings.vector_cache_mb == 256
    engine = make_engine(settings.model_copy(update={"vector_cache_mb": 3}))
    assert isinstance(engine, EmbeddedEngine) and engine.cache.budget == 3 * 2**20
