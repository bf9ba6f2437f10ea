"""`recall-server backfill`: an operator's bulk import, validated like the route, then indexed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, conversation, make_server

from recall.conversations import user_dir_name
from recall.scheduler import needs_index


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
    ]
    source = tmp_path / "history.jsonl"
    source.write_text("".join(json.dumps(b) + "\n" for b in bodies) + "not json\n")

    done = run_backfill(tmp_path, source)

    assert done.returncode == 1  # some lines were refused
    assert "refused line 2: conversation_id" in done.stderr
    assert "refused line 4: body: not valid JSON" in done.stderr
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
