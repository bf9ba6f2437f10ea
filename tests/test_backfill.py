"""`recall-server backfill`: an operator's bulk import, validated like the route, then indexed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, conversation, make_server, turn

from recall.domain.conversation import user_dir_name
from recall.files.layout import read_source
from recall.files.scheduler import needs_index


def run_backfill(tmp_path: Path, source: Path) -> subprocess.CompletedProcess[str]:
    env = make_server(tmp_path, ENGINE="embedded").env
    return subprocess.run(
        [sys.executable, str(ROOT / "recall_server.py"), "backfill", str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_backfill_imports_and_indexes_and_reports_refused_lines(tmp_path: Path) -> None:
    bodies = [
        conversation("alice", "c1", "Ticket MT-4471 is open for the K-2 machine.", "Noted."),
        {"user": "alice", "conversation_id": "../escape", "turns": []},
        conversation("bob", "b1", "Motor P-7 has bearing noise, ticket MT-5120.", "Logged."),
        {
            "user": "bob",
            "conversation_id": "b2",
            "turns": [turn("user", "Hi", "2999-01-01T00:00:00Z")],
        },
    ]
    source = tmp_path / "history.jsonl"
    source.write_text("".join(json.dumps(b) + "\n" for b in bodies) + "not json\n")

    done = run_backfill(tmp_path, source)

    assert done.returncode == 1  # some lines were refused
    assert "refused line 2: conversation_id" in done.stderr
    assert (
        "refused line 4: turns[0].ts: more than 24 hours ahead of the server's clock" in done.stderr
    )
    assert "refused line 5: body: not valid JSON" in done.stderr
    assert "backfill 2/2" in done.stderr and "backfilled 2 conversations" in done.stderr
    data = tmp_path / "data"
    for user in ("alice", "bob"):
        home = data / user_dir_name(user)
        assert not needs_index(home, "embedded")  # written and indexed
    assert not (data / user_dir_name("alice") / "src" / "..escape.funes.jsonl").exists()
    assert sorted(p.name for p in data.rglob("*.funes.jsonl")) == [
        "b1.funes.jsonl",
        "c1.funes.jsonl",
    ]


async def test_a_server_started_after_a_backfill_answers_at_once(tmp_path: Path) -> None:
    source = tmp_path / "bodies"
    source.mkdir()
    body = conversation("alice", "c1", "Ticket MT-4471 is open for the K-2 machine.", "Noted.")
    (source / "c1.json").write_text(json.dumps(body))
    assert run_backfill(tmp_path, source).returncode == 0

    with make_server(tmp_path, ENGINE="embedded").start() as server:
        assert "MT-4471" in await server.recall("alice", "MT-4471 K-2")
        assert "indexed user" not in server.log()  # nothing left to catch up on


def test_backfill_leaves_out_what_the_server_forgot(tmp_path: Path) -> None:
    # Given two conversations the server stored and then forgot
    c1 = conversation("alice", "c1", "The vault code word is zephyrquartz.", "Noted.")
    c2 = conversation("alice", "c2", "The gate code is marigoldvector.", "Noted.")
    with make_server(tmp_path, ENGINE="embedded").start() as server:
        for body in (c1, c2):
            assert server.post(body)[0] == 202
        for cid in ("c1", "c2"):
            forget = server.post({"user": "alice", "conversation_id": cid}, route="/forget")
            assert forget[0] == 200

    # When an old export holding both is backfilled, c1 with a turn said since
    c1["turns"].append(turn("user", "New plan: quillfern.", "2026-11-30T10:00:00Z"))
    source = tmp_path / "export.jsonl"
    source.write_text(json.dumps(c1) + "\n" + json.dumps(c2) + "\n")
    done = run_backfill(tmp_path, source)

    # Then the forgotten turns stay out (the backfill reads the server's tombstone key): c1 holds
    # only the new turn, c2 is left out, counted, and not an error
    assert done.returncode == 0, done.stderr
    assert "backfilled 1 conversations" in done.stderr and "left out 1 forgotten" in done.stderr
    src = tmp_path / "data" / user_dir_name("alice") / "src"
    assert [t["blocks"][0]["text"] for t in read_source(src / "c1.funes.jsonl")] == [
        "New plan: quillfern."
    ]
    assert not (src / "c2.funes.jsonl").exists()


def test_backfill_with_the_postgres_store_refuses_and_points_at_import(tmp_path: Path) -> None:
    # Given an operator's settings for the shared store
    source = tmp_path / "history.jsonl"
    source.write_text(json.dumps(conversation("alice", "c1", "Ticket MT-4471.", "Ok.")) + "\n")
    env = make_server(
        tmp_path, STORE="postgres", DATABASE_URL="postgresql://recall_app@127.0.0.1:1/recall"
    ).env
    # When they run the backfill, which writes DATA_DIR
    done = subprocess.run(
        [sys.executable, str(ROOT / "recall_server.py"), "backfill", str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Then it refuses, writes nothing, and names the way in
    assert done.returncode == 2
    assert "recall-server import DATA_DIR" in done.stderr
    assert not (tmp_path / "data").exists()
