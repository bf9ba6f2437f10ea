"""Debounced index runs, observed through the funes stand-in's record of its own calls."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from conftest import FakeFunes, Server, conversation, make_server, wait_for

from recall.domain.answers import UNAVAILABLE


def runs(funes: FakeFunes) -> list[dict[str, Any]]:
    """Finished index runs as {home, start, end}, from the stand-in's start and end events."""
    events = funes.events()
    starts = {e["pid"]: e for e in events if e["event"] == "start" and e["argv"][0] == "index"}
    return [
        {
            "home": starts[e["pid"]]["env"]["FUNES_HOME"],
            "start": starts[e["pid"]]["t"],
            "end": e["t"],
        }
        for e in events
        if e["event"] == "end" and e["pid"] in starts
    ]


def settle(funes: FakeFunes, expected: int, debounce: float) -> list[dict[str, Any]]:
    """Wait for `expected` finished runs, then long enough for one more to show, and for every
    run that started to finish. A run due after the last one starts `debounce` seconds after it
    ended, and the stand-in records its start at once; the longest run so far, plus a second,
    covers a process that is slow to start on a loaded machine."""
    wait_for(lambda: len(runs(funes)) >= expected, timeout=60)
    longest = max(r["end"] - r["start"] for r in runs(funes))
    time.sleep(debounce + longest + 1.0)
    wait_for(lambda: len(runs(funes)) == len(funes.calls("index")), timeout=60)
    return runs(funes)


def gated(funes: FakeFunes, tmp_path: Path) -> Path:
    """Hold every index run before it reads the sources until the returned path exists."""
    gate = tmp_path / "index-gate"
    funes.control(index_gate=str(gate))
    return gate


def most_at_once(done: list[dict[str, Any]]) -> int:
    """The largest number of runs going on at one time."""
    edges = [(r["start"], 1) for r in done] + [(r["end"], -1) for r in done]
    running, most = 0, 0
    for _, step in sorted(edges):  # at equal times an end (-1) sorts before a start
        running += step
        most = max(most, running)
    return most


def held_two(funes: FakeFunes) -> None:
    """Two index runs start, and no third while they are held at the gate."""
    wait_for(lambda: len(funes.calls("index")) == 2, timeout=30)
    time.sleep(1.0)  # time for a third to start, were the bound not kept
    assert len(funes.calls("index")) == 2


def post(server: Server, user: str, cid: str, n: int = 2) -> None:
    texts = [f"{cid} turn {i}: ticket MT-{4400 + i}" for i in range(n)]
    assert server.post(conversation(user, cid, *texts))[0] == 202


def start(tmp_path: Path, funes: FakeFunes, **env: str) -> Server:
    return make_server(tmp_path, ENGINE="funes", FUNES_BIN=str(funes.path), **env).start()


def test_a_burst_of_twenty_posts_gives_one_index_run(tmp_path: Path, fake_funes: FakeFunes) -> None:
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="1.5") as server:
        for i in range(20):
            post(server, "alice", "burst", n=i + 1)  # the gateway re-posts after every turn
        assert len(settle(fake_funes, 1, debounce=1.5)) == 1


def test_a_post_during_a_run_earns_exactly_one_more(tmp_path: Path, fake_funes: FakeFunes) -> None:
    gate = gated(fake_funes, tmp_path)
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.2") as server:
        post(server, "alice", "first")
        wait_for(lambda: len(fake_funes.calls("index")) == 1)
        for i in range(5):
            post(server, "alice", f"during-{i}")  # all while the first run is held
        gate.touch()
        done = settle(fake_funes, 2, debounce=0.2)
        assert len(done) == 2
        first, second = sorted(done, key=lambda r: r["start"])
        assert second["start"] >= first["end"]  # never two runs for one user at once


def test_two_users_index_in_parallel(tmp_path: Path, fake_funes: FakeFunes) -> None:
    gate = gated(fake_funes, tmp_path)
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.1") as server:
        post(server, "alice", "a1")
        post(server, "bob", "b1")
        # both runs start while neither can finish
        wait_for(lambda: len(fake_funes.calls("index")) == 2, timeout=30)
        gate.touch()
        alice, bob = sorted(settle(fake_funes, 2, debounce=0.1), key=lambda r: r["home"])
        assert alice["home"] != bob["home"]
        assert alice["start"] < bob["end"] and bob["start"] < alice["end"]  # overlapping runs


def test_restart_indexes_what_changed_and_only_that(tmp_path: Path, fake_funes: FakeFunes) -> None:
    # A long debounce, then a stop: the write is on disk but was never indexed.
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="60") as server:
        post(server, "alice", "before-crash")
        post(server, "bob", "bob-chat")
    assert fake_funes.calls("index") == []

    server.env["INDEX_DEBOUNCE"] = "0.1"
    with server.start():
        homes = {r["home"] for r in settle(fake_funes, 2, debounce=0.1)}
        assert homes == {str(server.home("alice")), str(server.home("bob"))}

    # Nothing changed since: a second restart runs nothing; a file changed behind our back does.
    (server.home("bob") / "src" / "bob-chat.funes.jsonl").touch()
    with server.start():
        done = settle(fake_funes, 3, debounce=0.1)
        assert len(done) == 3 and done[-1]["home"] == str(server.home("bob"))


def test_a_failed_run_is_logged_by_hash_and_retried_at_the_next_write(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    fake_funes.control(index_fail=True)
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.1") as server:
        post(server, "alice", "c1")
        wait_for(lambda: "index run failed" in server.log())
        assert server.home("alice").name in server.log() and "alice" not in server.log()
        assert not (server.home("alice") / "indexed-funes.json").exists()

        fake_funes.control()
        post(server, "alice", "c2")
        wait_for(lambda: (server.home("alice") / "indexed-funes.json").exists())
        assert len(fake_funes.calls("index")) == 2


USERS = [f"user-{n:02d}" for n in range(12)]


def test_twelve_users_posting_at_once_get_at_most_two_index_runs_at_a_time(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # Given index runs held until the test lets them go, and the default INDEX_CONCURRENCY of 2
    gate = gated(fake_funes, tmp_path)
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.1") as server:
        # When twelve users post at once
        with ThreadPoolExecutor(len(USERS)) as posting:
            list(posting.map(lambda user: post(server, user, f"{user}-chat"), USERS))
        # Then two runs start and no third while they are held
        held_two(fake_funes)
        gate.touch()
        done = settle(fake_funes, len(USERS), debounce=0.1)
        # and every user was indexed once, never more than two at a time, and two did overlap
        assert sorted(r["home"] for r in done) == sorted(str(server.home(u)) for u in USERS)
        assert most_at_once(done) == 2


def test_a_user_who_keeps_posting_waits_behind_users_who_became_due_before_her(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    gate = gated(fake_funes, tmp_path)
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.2", INDEX_CONCURRENCY="1") as server:
        # Given alice's run going on (held)
        post(server, "alice", "a1")
        wait_for(lambda: len(fake_funes.calls("index")) == 1)
        # When three others post, then alice posts again and again during her run
        for user in ("bob", "carol", "dave"):
            post(server, user, f"{user}-1")
        for i in range(4):
            post(server, "alice", f"a-more-{i}")
        time.sleep(1.0)  # the others' debounce (0.2 s) ends: they wait for the one run slot
        gate.touch()
        done = sorted(settle(fake_funes, 5, debounce=0.2), key=lambda r: r["start"])
        # Then the others run in the order they became due, and alice once more, last
        order = ["alice", "bob", "carol", "dave", "alice"]
        assert [r["home"] for r in done] == [str(server.home(u)) for u in order]
        assert most_at_once(done) == 1


def test_startup_catches_up_many_stale_users_within_the_bound(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # Given twelve users written while no index run could happen (a long debounce, then a stop)
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="60") as server:
        for user in USERS:
            post(server, user, f"{user}-chat")
    assert fake_funes.calls("index") == []
    # When the server starts again with its index runs held until the test lets them go
    gate = gated(fake_funes, tmp_path)
    server.env["INDEX_DEBOUNCE"] = "0.1"
    with server.start():
        held_two(fake_funes)
        gate.touch()
        done = settle(fake_funes, len(USERS), debounce=0.1)
    # Then all are caught up, never more than two at a time
    assert sorted(r["home"] for r in done) == sorted(str(server.home(u)) for u in USERS)
    assert most_at_once(done) == 2


# --- an index that is gone or unreadable is rebuilt without waiting for the user's next post --


def indexed(server: Server, user: str) -> None:
    post(server, user, f"{user}-chat")
    server.wait_indexed(user, timeout=60)
    assert (server.home(user) / "memory" / "chunks.json").exists()


async def test_a_deleted_funes_memory_is_rebuilt_when_a_recall_finds_it_gone(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.1") as server:
        # Given alice's index deleted behind the server's back
        indexed(server, "alice")
        shutil.rmtree(server.home("alice") / "memory")
        # When she recalls, the answer fails soft (her conversations are stored, so it must not
        # say there are none) and a rebuild is scheduled
        assert await server.recall("alice", "MT-4400") == UNAVAILABLE
        # Then, without any new post, the index comes back and recall works
        wait_for(lambda: (server.home("alice") / "memory" / "chunks.json").exists())
        assert "MT-4400" in await server.recall("alice", "MT-4400")
        assert len(fake_funes.calls("index")) == 2


async def test_an_unreadable_funes_memory_is_rebuilt_after_the_recall_that_failed_on_it(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.1") as server:
        # Given alice's memory folder still there but its store gone (funes cannot read it)
        indexed(server, "alice")
        (server.home("alice") / "memory" / "chunks.json").unlink()
        # When she recalls, funes fails and the answer fails soft
        assert await server.recall("alice", "MT-4400") == UNAVAILABLE
        # Then the failure scheduled a run: without any new post, recall works again
        wait_for(lambda: (server.home("alice") / "memory" / "chunks.json").exists())
        assert "MT-4400" in await server.recall("alice", "MT-4400")


def test_a_funes_memory_deleted_while_stopped_is_rebuilt_at_startup(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.1") as server:
        indexed(server, "alice")
        indexed(server, "bob")
    # Given alice's index deleted while the server was down (her marker still says indexed)
    shutil.rmtree(server.home("alice") / "memory")
    # When the server starts
    with server.start():
        # Then her index is rebuilt with no post and no recall, and only hers
        done = settle(fake_funes, 3, debounce=0.1)
    assert len(done) == 3 and done[-1]["home"] == str(server.home("alice"))
    assert (server.home("alice") / "memory" / "chunks.json").exists()
