"""Debounced index runs, observed through the funes stand-in's record of its own calls."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from conftest import FakeFunes, Server, conversation, make_server, wait_for


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


def settle(funes: FakeFunes, expected: int, quiet: float = 1.5) -> list[dict[str, Any]]:
    """Wait for `expected` finished runs, then make sure no further one starts."""
    wait_for(lambda: len(runs(funes)) >= expected, timeout=20)
    time.sleep(quiet)
    return runs(funes)


def post(server: Server, user: str, cid: str, n: int = 2) -> None:
    texts = [f"{cid} turn {i}: ticket MT-{4400 + i}" for i in range(n)]
    assert server.post(conversation(user, cid, *texts))[0] == 202


def start(tmp_path: Path, funes: FakeFunes, **env: str) -> Server:
    return make_server(tmp_path, ENGINE="funes", FUNES_BIN=str(funes.path), **env).start()


def test_a_burst_of_twenty_posts_gives_one_index_run(tmp_path: Path, fake_funes: FakeFunes) -> None:
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="1.5") as server:
        for i in range(20):
            post(server, "alice", "burst", n=i + 1)  # the gateway re-posts after every turn
        assert len(settle(fake_funes, 1)) == 1


def test_a_post_during_a_run_earns_exactly_one_more(tmp_path: Path, fake_funes: FakeFunes) -> None:
    fake_funes.control(index_sleep=1.5)
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.2") as server:
        post(server, "alice", "first")
        wait_for(lambda: len(fake_funes.calls("index")) == 1)
        for i in range(5):
            post(server, "alice", f"during-{i}")  # all while the first run is going on
        done = settle(fake_funes, 2, quiet=2.5)
        assert len(done) == 2
        first, second = sorted(done, key=lambda r: r["start"])
        assert second["start"] >= first["end"]  # never two runs for one user at once


def test_two_users_index_in_parallel(tmp_path: Path, fake_funes: FakeFunes) -> None:
    fake_funes.control(index_sleep=1.5)
    with start(tmp_path, fake_funes, INDEX_DEBOUNCE="0.1") as server:
        post(server, "alice", "a1")
        post(server, "bob", "b1")
        alice, bob = sorted(settle(fake_funes, 2, quiet=0.5), key=lambda r: r["home"])
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
        homes = {r["home"] for r in settle(fake_funes, 2)}
        assert homes == {str(server.home("alice")), str(server.home("bob"))}

    # Nothing changed since: a second restart runs nothing; a file changed behind our back does.
    (server.home("bob") / "src" / "bob-chat.funes.jsonl").touch()
    with server.start():
        done = settle(fake_funes, 3)
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
