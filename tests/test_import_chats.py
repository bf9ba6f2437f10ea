"""Bring your history, end to end on both stores: a person uploads their ChatGPT or Claude
export's zip on the memory page with their bearer token, and their agent's MCP tool then finds a
fact from it; a second upload writes nothing; a forgotten conversation stays forgotten; hostile
uploads get a clear error and write nothing; `recall-server import-chats` prints its summary,
and refuses beside a server that holds the files store's DATA_DIR."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Backing, Server, make_server, wait_for
from test_memory_api import as_user, call

EXPORTS = Path(__file__).resolve().parent / "chat_exports"
LIMIT = 200_000  # IMPORT_MAX_BYTES of this module's server: the fixtures are a few KB
CHATGPT_ID = "chatgpt-6a1f0c2e-4b7d-4e8a-9c61-2f0d3b5a7e11"


def export_zip(tmp: Path, name: str, members: dict[str, bytes]) -> bytes:
    path = tmp / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return path.read_bytes()


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("exports")
    chatgpt = (EXPORTS / "chatgpt-conversations.json").read_bytes()
    claude = (EXPORTS / "claude-conversations.json").read_bytes()
    cyclic = json.loads(chatgpt)
    cyclic[0]["mapping"]["n-root"]["parent"] = "n-answer-2"
    return {
        "chatgpt": export_zip(tmp, "c.zip", {"conversations.json": chatgpt, "chat.html": b"<p>"}),
        "claude": export_zip(tmp, "a.zip", {"conversations.json": claude, "users.json": b"[]"}),
        "bomb": export_zip(tmp, "b.zip", {"conversations.json": chatgpt, "x.png": bytes(4 << 20)}),
        "climbs": export_zip(tmp, "p.zip", {"../../conversations.json": chatgpt}),
        "malformed": export_zip(tmp, "m.zip", {"conversations.json": chatgpt[:-50]}),
        "cyclic": export_zip(tmp, "y.zip", {"conversations.json": json.dumps(cyclic).encode()}),
        "large": export_zip(tmp, "l.zip", {"conversations.json": os.urandom(LIMIT)}),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_backing: Backing) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("import-chats")
    settings = {"IMPORT_MAX_BYTES": str(LIMIT), **module_backing.settings}
    server = make_server(workdir, ENGINE="embedded", users=("alice", "bob", "carol"), **settings)
    server.start()
    yield server
    server.stop()


def upload(server: Server, user: str, fmt: str, data: bytes) -> tuple[int, Any]:
    status, _, body = call(
        server,
        "POST",
        f"/api/me/import?format={fmt}",
        raw=data,
        token=server.tokens[user],
        headers={"content-type": "application/zip"},
    )
    return status, body


def imported(server: Server, user: str, fmt: str, data: bytes) -> dict[str, Any]:
    """Upload, then poll as the page does until the import is done; its summary."""
    status, body = upload(server, user, fmt, data)
    assert status == 202, (status, body)
    state: dict[str, Any] = {}

    def finished() -> bool:
        state.update(as_user(server, user, "GET", "/api/me/import")["import"])
        return state["state"] != "importing"

    wait_for(finished, timeout=60)
    assert state["state"] == "done", state
    assert state["done"] == state["total"]
    return state["summary"]


async def found_within(server: Server, user: str, query: str, fact: str, seconds: float) -> float:
    """Seconds until the agent's tool returns ``fact`` for ``query``; fails past ``seconds``."""
    started = time.monotonic()
    while True:
        answer = await server.recall(user, query)
        if fact in answer:
            return time.monotonic() - started
        assert time.monotonic() - started < seconds, answer
        await asyncio.sleep(0.5)


async def test_an_uploaded_chatgpt_export_is_found_by_the_agents_tool_within_a_minute(
    server: Server, exports: dict[str, bytes]
) -> None:
    started = time.monotonic()
    summary = imported(server, "alice", "chatgpt", exports["chatgpt"])
    assert summary["imported"] == 2 and summary["turns"] == 4
    assert summary["skipped_turns"] == {
        "hidden message": 1,
        "image or file part": 1,
        "code content": 1,
    }
    await found_within(server, "alice", "drip line valve V-17 October", "12 minutes at 06:40", 60)
    assert time.monotonic() - started < 60
    # the original time, and the shown branch only
    turns = server.stored_turns("alice", CHATGPT_ID)
    assert turns and turns[0]["ts"] == "2025-10-09T08:53:30Z"
    assert not any("every hour" in t["text"] for t in turns)
    # bob's memory holds none of it
    assert as_user(server, "bob", "GET", "/api/me/conversations")["conversations"] == []


async def test_an_uploaded_claude_export_is_found_by_the_agents_tool(
    server: Server, exports: dict[str, bytes]
) -> None:
    summary = imported(server, "bob", "claude", exports["claude"])
    assert summary["imported"] == 1 and summary["skipped"] == {"no text messages": 1}
    await found_within(
        server, "bob", "which printer prints cold-store pallet labels", "LBL-COLD-3", 60
    )


def test_a_second_upload_of_the_same_export_writes_nothing(
    server: Server, module_backing: Backing, exports: dict[str, bytes]
) -> None:
    imported(server, "carol", "chatgpt", exports["chatgpt"])
    before = module_backing.snapshot(server)
    summary = imported(server, "carol", "chatgpt", exports["chatgpt"])
    assert (summary["imported"], summary["unchanged"]) == (0, 2)
    assert module_backing.snapshot(server) == before


def test_a_forgotten_conversation_stays_forgotten_when_the_export_comes_again(
    server: Server, exports: dict[str, bytes]
) -> None:
    imported(server, "carol", "chatgpt", exports["chatgpt"])
    forget = {"conversation_id": CHATGPT_ID}
    as_user(server, "carol", "POST", "/api/me/forget", forget)
    summary = imported(server, "carol", "chatgpt", exports["chatgpt"])
    assert (summary["forgotten"], summary["imported"], summary["unchanged"]) == (1, 0, 1)
    assert server.stored_turns("carol", CHATGPT_ID) is None


@pytest.mark.parametrize(
    ("case", "fmt", "status", "message"),
    [
        ("bomb", "chatgpt", 413, "x.png: inflates"),
        ("climbs", "chatgpt", 400, "../../conversations.json: a path that climbs out"),
        ("malformed", "chatgpt", 400, "conversations.json: not valid JSON"),
        ("cyclic", "chatgpt", 400, "conversations.json #1: the message tree has a cycle"),
        ("claude", "chatgpt", 400, "not a ChatGPT export; it looks like --format claude"),
        ("large", "chatgpt", 413, f"more than IMPORT_MAX_BYTES ({LIMIT})"),
        ("chatgpt", "word", 400, "format: must be one of chatgpt, claude, claude-code"),
    ],
)
def test_a_hostile_upload_gets_a_clear_error_and_writes_nothing(
    server: Server,
    module_backing: Backing,
    exports: dict[str, bytes],
    case: str,
    fmt: str,
    status: int,
    message: str,
) -> None:
    before = module_backing.snapshot(server)
    got, body = upload(server, "alice", fmt, exports[case])
    assert (got, message in body["error"]) == (status, True), body
    assert module_backing.snapshot(server) == before


def test_an_upload_declared_as_2_gb_is_refused_before_it_is_read(
    server: Server, module_backing: Backing
) -> None:
    before = module_backing.snapshot(server)
    connection = http.client.HTTPConnection("127.0.0.1", int(server.env["PORT"]), timeout=30)
    connection.putrequest("POST", "/api/me/import?format=chatgpt")
    connection.putheader("authorization", f"Bearer {server.tokens['alice']}")
    connection.putheader("content-length", str(2 * 1024**3))
    connection.endheaders()
    connection.send(b"PK\x03\x04")
    response = connection.getresponse()
    assert response.status == 413
    assert "2147483648 bytes, more than IMPORT_MAX_BYTES" in json.loads(response.read())["error"]
    connection.close()
    assert module_backing.snapshot(server) == before


def test_an_upload_without_a_token_is_refused(server: Server, exports: dict[str, bytes]) -> None:
    status, _, body = call(server, "POST", "/api/me/import?format=chatgpt", raw=exports["chatgpt"])
    assert status == 401 and "bearer token" in body["error"]


# --- the operator's command -------------------------------------------------------------------


def import_chats(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(ROOT / "recall_server.py"), "import-chats", *arguments]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


async def test_the_command_imports_a_codex_session_prints_its_summary_and_the_tool_finds_it(
    server: Server, module_backing: Backing, tmp_path: Path
) -> None:
    env = dict(server.env)
    if module_backing.name == "files":  # not beside the server: a DATA_DIR of its own, then
        env["DATA_DIR"] = str(tmp_path / "second" / "data")  # and a server started on it after
    sessions = tmp_path / "sessions" / "2026" / "10" / "02"
    sessions.mkdir(parents=True)
    (sessions / "rollout-1.jsonl").write_bytes((EXPORTS / "codex-rollout.jsonl").read_bytes())
    done = import_chats(env, "--format", "codex", "--user", "alice", str(tmp_path / "sessions"))
    assert done.returncode == 0, done.stderr
    assert "imported 1, already there 0, forgotten before (left out) 0" in done.stdout
    assert "skipped message: harness context (1)" in done.stdout
    assert "import-chats 1/1" in done.stderr  # the progress bar
    again = import_chats(env, "--format", "codex", "--user", "alice", str(tmp_path / "sessions"))
    assert "imported 0, already there 1" in again.stdout
    if module_backing.name == "postgres":
        await found_within(server, "alice", "billing service port in staging", "7443", 60)
        return
    with make_server(tmp_path / "second", ENGINE="embedded") as other:  # its data: second/data
        other.start()
        await found_within(other, "alice", "billing service port in staging", "7443", 60)


def test_the_command_refuses_beside_a_server_holding_data_dir_and_points_to_the_page(
    server: Server, module_backing: Backing
) -> None:
    if module_backing.name != "files":
        pytest.skip("only the files store is held by one process")
    before = module_backing.snapshot(server)
    export = str(EXPORTS / "claude-conversations.json")
    done = import_chats(dict(server.env), "--format", "claude", "--user", "alice", export)
    assert done.returncode == 2
    assert "is in use by another recall-server" in done.stderr
    assert "Bring your history" in done.stderr
    assert module_backing.snapshot(server) == before


def test_the_command_refuses_a_hostile_export_and_writes_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "DATA_DIR": str(tmp_path / "data"), "INGEST_KEY": os.urandom(16).hex()}
    bad = tmp_path / "conversations.json"
    bad.write_bytes((EXPORTS / "chatgpt-conversations.json").read_bytes()[:-30])
    done = import_chats(env, "--format", "chatgpt", "--user", "alice", str(bad))
    assert done.returncode == 2
    assert "refused, nothing written: conversations.json: not valid JSON" in done.stderr
    assert [p.name for p in (tmp_path / "data").iterdir()] in ([], [".recall-server.lock"])
