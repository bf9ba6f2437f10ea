"""Crash safety: what the server acknowledged survives kill -9, and nothing half-written stays.

A kill -9 cannot show a missing fsync (the page cache outlives a killed process), so the sync
calls of the write path and their order are checked directly as well.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import FakeFunes, conversation, make_server, wait_for
from fake_funes import validate_file
from fastmcp import Client

from devtools import testing
from devtools.testing import LocalServer
from recall.domain.answers import NOTHING_FOUND
from recall.domain.conversation import SOURCE_SUFFIX, parse_conversation
from recall.files.engines.embedded.store import db_path
from recall.files.layout import write_conversation
from recall.files.scheduler import needs_index

ROOT = Path(__file__).resolve().parent.parent

# --- kill -9, again and again, while a gateway posts ------------------------------------------

USERS = ("alice", "bob", "carol", "dave")
# Each kill is aimed at a post in flight, and most land in an index run (both asserted): six
# cover both cases; ten cost four more starts and catch-up runs (~10 CPU-s) for no other case.
KILLS = 6
LONGEST = 8  # turns a conversation grows to before its user starts another
WORDS = ["budget", "rollout", "cluster", "invoice", "meeting", "vendor", "latency", "backlog"]


@dataclass
class Ledger:
    """What the gateway posted and what the server acknowledged, per (user, conversation)."""

    turns: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    acked: dict[tuple[str, str], int] = field(default_factory=dict)  # turns in the last 202
    markers: dict[tuple[str, str], str] = field(default_factory=dict)  # its word, in no other
    cut_off: int = 0  # posts whose connection the kill broke mid-request
    in_flight: int = 0  # posts sent and not yet answered, now
    lock: threading.Lock = field(default_factory=threading.Lock)

    def body(self, key: tuple[str, str], turns: int | None = None) -> dict[str, Any]:
        user, cid = key
        return {"user": user, "conversation_id": cid, "turns": self.turns[key][:turns]}


def gateway(server: LocalServer, user: str, ledger: Ledger, stop: threading.Event) -> None:
    """Post this user's conversations as a gateway does: the whole conversation after every new
    turn or two, sometimes a new conversation, the same post again while the server is down;
    record every 202 with what it acknowledged."""
    rng = random.Random(user)
    mine: list[str] = []
    while not stop.is_set():
        growing = [c for c in mine if len(ledger.turns[(user, c)]) < LONGEST]
        if not growing or rng.random() < 0.15:
            cid = f"{user}-{len(mine)}"
            mine.append(cid)
            with ledger.lock:
                marker = marker_word(len(ledger.markers))
                ledger.markers[(user, cid)] = marker
            ledger.turns[(user, cid)] = [turn_of(0, f"{user} opened {marker} about", rng)]
        else:
            cid = rng.choice(growing)
            for _ in range(rng.randint(1, 2)):
                turns = ledger.turns[(user, cid)]
                turns.append(turn_of(len(turns), "and then", rng))
        key = (user, cid)
        sent = len(ledger.turns[key])
        while (status := post(server, ledger.body(key), ledger)) == "down":
            if stop.wait(0.1):  # the gateway retries the same post until the server is back
                return
        if status == 202:
            ledger.acked[key] = sent  # one thread per user: its posts are in order
        stop.wait(rng.uniform(0.1, 0.3))


def marker_word(n: int) -> str:
    """A word no other conversation has, and no stemmer merges with another: 3 -> "zkaaadq"."""
    return "zk" + "".join("abcdefghij"[int(digit)] for digit in f"{n:04d}") + "q"


def turn_of(i: int, opening: str, rng: random.Random) -> dict[str, Any]:
    text = f"{opening} the {' '.join(rng.choices(WORDS, k=8))}."
    return {"role": ("user", "assistant")[i % 2], "text": text, "ts": f"2026-05-04T10:{i:02d}:00Z"}


def post(server: LocalServer, body: dict[str, Any], ledger: Ledger) -> int | str:
    """The status of one POST /turns; "down" when refused, "cut off" when the connection broke
    (the kill came while the post was in flight)."""
    request = urllib.request.Request(
        f"{server.url}/turns",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-ingest-key": server.ingest_key},
        method="POST",
    )
    with ledger.lock:
        ledger.in_flight += 1
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError as exc:  # refused: the server is down between a kill and start
        if isinstance(exc.reason, ConnectionRefusedError):
            return "down"
    except (OSError, http.client.HTTPException):
        pass
    finally:
        with ledger.lock:
            ledger.in_flight -= 1
    ledger.cut_off += 1
    return "cut off"


def kill_9(server: LocalServer) -> None:
    """SIGKILL the server process alone, and see that it left no process behind."""
    assert server.process is not None
    process = psutil.Process(server.process.pid)
    children = process.children(recursive=True)
    os.kill(process.pid, signal.SIGKILL)  # this pid only, never a group
    server.process.wait(30)
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running: {alive}"


def integrity(path: Path) -> str:
    """SQLite's own check of a database as a kill or a run left it, made on a copy: after a kill
    its WAL may need recovery, which writes (a read-only open then fails: "attempt to write a
    readonly database"), and the original stays as it was for the next start to recover."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / path.name
        for suffix in ("", "-wal", "-shm"):
            if (source := path.with_name(path.name + suffix)).exists():
                shutil.copyfile(source, copy.with_name(copy.name + suffix))
        con = sqlite3.connect(copy)
        try:
            return "; ".join(row[0] for row in con.execute("PRAGMA integrity_check"))
        finally:
            con.close()


async def recall_all(server: LocalServer, user: str, queries: list[str]) -> dict[str, str]:
    """Each query through the real tool, in one MCP session with the user's bearer token."""
    answers = {}
    async with Client(f"{server.url}/mcp", auth=server.tokens[user]) as client:
        for query in queries:
            result = await client.call_tool("recall_my_conversations", {"query": query})
            answers[query] = result.content[0].text  # type: ignore[union-attr]
    return answers


@pytest.fixture
def crashing(tmp_path: Path) -> Iterator[LocalServer]:
    server = testing.make_server(
        tmp_path, users=USERS, ENGINE="embedded", INDEX_DEBOUNCE="0.05", LOG_LEVEL="INFO"
    )
    yield server
    server.stop()


@pytest.mark.slow
async def test_nothing_acknowledged_is_lost_when_the_server_is_killed_again_and_again(
    crashing: LocalServer,
) -> None:
    server, ledger, stop = crashing, Ledger(), threading.Event()
    rng = random.Random(12)
    # Given a gateway posting growing and new conversations for four users, with index runs
    # following every burst (a short debounce)
    gateways = [
        threading.Thread(target=gateway, args=(server, user, ledger, stop), daemon=True)
        for user in USERS
    ]
    indexing_at_kill = []
    # When the server is killed with SIGKILL at random moments and started again each time
    try:
        for n in range(KILLS):
            server.start(timeout=120)
            if n == 0:
                for thread in gateways:
                    thread.start()
            time.sleep(rng.uniform(0.2, 1.2))
            indexing_at_kill.append(server.health()["indexing"])
            # Then the first moment a post is on its way: a kill in the middle of a post is the
            # case that matters, and at random moments alone some runs never had one.
            wait_for(lambda: ledger.in_flight > 0, timeout=10, interval=0.005)
            kill_9(server)
            for user in USERS:  # the index as the kill left it
                if (db := db_path(server.home(user))).exists():
                    assert integrity(db) == "ok", f"after kill {n + 1}"
    finally:
        stop.set()
        for thread in gateways:
            thread.join(60)
    server.start(timeout=120)

    # Then the kills came during posts and during index runs (else this proved little)
    assert ledger.cut_off >= 1, "no kill came while a post was in flight"
    assert sum(1 for n in indexing_at_kill if n) >= KILLS // 2, indexing_at_kill
    # and every acknowledged conversation is on disk whole, in funes format, at least as long
    # as its last acknowledged post, and exactly what was posted
    assert len(ledger.acked) >= 2 * len(USERS)
    for key, acked in ledger.acked.items():
        source = server.home(key[0]) / "src" / f"{key[1]}{SOURCE_SUFFIX}"
        assert validate_file(source) is None, key
        stored = [json.loads(line) for line in source.read_text().splitlines()]
        assert acked <= len(stored) <= len(ledger.turns[key]), key
        assert stored == parse_conversation(ledger.body(key, len(stored))).lines, key
    # and nothing but conversations is left where the engines read
    for user in USERS:
        names = [p.name for p in (server.home(user) / "src").iterdir()]
        assert [name for name in names if not name.endswith(SOURCE_SUFFIX)] == [], user
    # and after the last start every user is indexed without any further post
    wait_for(lambda: server.health()["indexing"] == 0, timeout=180)
    assert not [user for user in USERS if needs_index(server.home(user), "embedded")]
    # and every acknowledged conversation is found by its own word through the tool
    for user in USERS:
        markers = [ledger.markers[key] for key in ledger.acked if key[0] == user]
        answers = await recall_all(server, user, markers)
        missed = {m: answers[m][:300] for m in markers if m not in answers[m]}
        assert missed == {}, user
    # and each user's index passes SQLite's own check, with no rebuild hiding a corruption
    for user in USERS:
        assert integrity(db_path(server.home(user))) == "ok"
        assert not db_path(server.home(user)).with_suffix(".db.corrupt").exists()
    assert "rebuilding" not in server.log()
    server.stop()
    assert server.process is not None and server.process.returncode is not None


# --- leftovers of a writer killed between its temporary file and the rename --------------------


def killed_writer(data_dir: Path, body: dict[str, Any]) -> None:
    """A process that writes a conversation as the /turns route does and is killed by SIGKILL
    just before the rename: it leaves its fsynced temporary file and its lock file behind."""
    program = f"""
import os, signal, sys
from pathlib import Path
from recall.files.layout import write_conversation
from recall.domain.conversation import parse_conversation, user_dir_name
os.replace = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
body = {body!r}
write_conversation(Path({str(data_dir)!r}) / user_dir_name(body["user"]), parse_conversation(body))
"""
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, timeout=60)
    assert done.returncode == -signal.SIGKILL


async def test_a_start_removes_what_a_writer_killed_mid_write_left_and_keeps_the_stored_version(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    server = make_server(tmp_path, ENGINE="funes", FUNES_BIN=str(fake_funes.path))
    stored = conversation("alice", "c1", "ticket MT-4471 is open", "noted")
    with server.start():
        assert server.post(stored)[0] == 202
        server.wait_indexed("alice", timeout=60)
    # Given a writer of a longer version killed between its temporary file and the rename
    longer = conversation("alice", "c1", "ticket MT-4471 is open", "noted", "also MT-5120")
    killed_writer(server.data_dir, longer)
    src = server.home("alice") / "src"
    assert {p.suffix for p in src.iterdir()} == {".jsonl", ".tmp", ".lock"}
    # When the server starts
    with server.start():
        # Then only the conversation is left where the engines read, as it was acknowledged
        assert sorted(p.name for p in src.iterdir()) == ["c1.funes.jsonl"]
        assert validate_file(src / "c1.funes.jsonl") is None
        assert len((src / "c1.funes.jsonl").read_text().splitlines()) == 2
        # and the next post of the conversation is stored whole
        assert server.post(longer)[0] == 202
        server.wait_indexed("alice", timeout=60)
        assert "MT-5120" in await server.recall("alice", "MT-5120")


# --- the sync calls of the write path, in order ------------------------------------------------


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every fsync (by the path its descriptor names) and rename, in the order they happen."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(source: Any, target: Any, **kwargs: Any) -> None:
        calls.append(("rename", f"{source} -> {target}"))
        real_replace(source, target, **kwargs)

    def rename(source: Any, target: Any, **kwargs: Any) -> None:
        calls.append(("rename", f"{source} -> {target}"))
        real_rename(source, target, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    return calls


def at(calls: list[tuple[str, str]], call: str, path: Path | str) -> int:
    """Where the first such call on `path` is; -1 when there is none."""
    for i, (name, subject) in enumerate(calls):
        if name == call and (subject == str(path) or subject.startswith(f"{path} -> ")):
            return i
    return -1


def test_a_new_conversation_is_fsynced_then_renamed_then_its_directories_fsynced(
    tmp_path: Path, syncs: list[tuple[str, str]]
) -> None:
    # Given a new user (no directory yet) in an existing data directory
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    home = data_dir / "user"
    src, target = home / "src", home / "src" / f"c1{SOURCE_SUFFIX}"
    # When her first conversation is written
    assert write_conversation(home, parse_conversation(conversation("alice", "c1", "hi", "ok")))
    # Then the temporary file is fsynced before it is renamed onto the conversation's name
    (rename,) = [i for i, (name, _) in enumerate(syncs) if name == "rename"]
    temporary = Path(syncs[rename][1].split(" -> ")[0])
    assert syncs[rename][1] == f"{temporary} -> {target}" and temporary.parent == src
    assert 0 <= at(syncs, "fsync", temporary) < rename
    # and after the rename, src (the rename), the user directory (the new src) and the data
    # directory (the new user directory) are fsynced
    after = syncs[rename + 1 :]
    for directory in (src, home, data_dir):
        assert at(after, "fsync", directory) >= 0, (directory, syncs)


def test_a_changed_conversation_is_fsynced_then_renamed_then_src_fsynced(
    tmp_path: Path, syncs: list[tuple[str, str]]
) -> None:
    # Given a stored conversation
    home = tmp_path / "user"
    write_conversation(home, parse_conversation(conversation("alice", "c1", "hi", "ok")))
    syncs.clear()
    # When a longer version is written
    write_conversation(home, parse_conversation(conversation("alice", "c1", "hi", "ok", "more")))
    # Then its temporary file is fsynced, renamed, and then src fsynced
    (rename,) = [i for i, (name, _) in enumerate(syncs) if name == "rename"]
    temporary = syncs[rename][1].split(" -> ")[0]
    assert 0 <= at(syncs, "fsync", temporary) < rename
    assert at(syncs[rename + 1 :], "fsync", home / "src") >= 0, syncs


def test_a_repost_that_writes_nothing_still_makes_the_stored_file_durable(
    tmp_path: Path, syncs: list[tuple[str, str]]
) -> None:
    # Given a stored conversation (whose writer may have died between its rename and fsyncs)
    home = tmp_path / "user"
    body = conversation("alice", "c1", "hi", "ok")
    write_conversation(home, parse_conversation(body))
    syncs.clear()
    # When the same post comes again (the gateway retrying), which writes nothing
    assert not write_conversation(home, parse_conversation(body))
    # Then the file and the directories leading to it are fsynced before it is acknowledged
    assert not [call for call in syncs if call[0] == "rename"]
    target = home / "src" / f"c1{SOURCE_SUFFIX}"
    for path in (target, home / "src", home, home.parent):
        assert at(syncs, "fsync", path) >= 0, (path, syncs)


# --- the "indexed" marker: the sources as they were when the run began -------------------------


async def test_a_post_during_an_index_run_is_indexed_after_a_kill_before_the_next_run(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    gate = tmp_path / "write-gate"
    fake_funes.control(write_gate=str(gate))  # the run waits, sources read, before writing
    server = make_server(
        tmp_path, ENGINE="funes", FUNES_BIN=str(fake_funes.path), INDEX_DEBOUNCE="4"
    )
    marker = server.home("alice") / "indexed-funes.json"
    with server.start():
        # Given an index run that has read alice's sources
        assert server.post(conversation("alice", "c1", "ticket MT-4471 is open", "ok"))[0] == 202
        wait_for(lambda: any(e["event"] == "read" for e in fake_funes.events()), timeout=60)
        # When a post lands during the run, the run ends (marked indexed), and the server is
        # killed before the debounced run that would cover the post
        assert server.post(conversation("alice", "c2", "the K-2 cluster moved", "ok"))[0] == 202
        gate.touch()
        wait_for(lambda: marker.exists(), timeout=60)
        kill_9(server)
        assert len(fake_funes.calls("index")) == 1, "the next run came: this proved nothing"
        # Then the marker does not claim the post that the run never saw
        assert needs_index(server.home("alice"), "funes")
    # and after a start, without any new post, the post is found
    server.env["INDEX_DEBOUNCE"] = "0.1"
    with server.start():
        server.wait_indexed("alice", timeout=60)
        answer = await server.recall("alice", "K-2 cluster")
        assert answer != NOTHING_FOUND and "K-2 cluster moved" in answer
