"""The scripts a newcomer runs first answer mistakes with one line, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, FakeFunes, Server, conversation, make_server

from devtools.testing import free_port
from recall.settings import GENERATE_KEY, Settings

LEVELS = "DEBUG, INFO, WARNING, ERROR"


def run(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 360
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One running server for the tests that only talk to it (a start is ~2 CPU-s); a test that
    erases, stops or needs other settings starts its own."""
    tmp_path = tmp_path_factory.mktemp("server")
    with make_server(tmp_path, ENGINE="embedded").start() as server:
        yield server


def test_search_with_a_refused_token_says_401_in_one_line(server: Server) -> None:
    done = run("examples/search.py", "--url", server.url, "--token", "not-a-token", "N-11")
    assert done.returncode == 1
    # One line, with the server's reason (tests/test_examples.py: expired, audience, issuer)
    assert (
        done.stderr.strip() == "search.py: 401: bearer token refused: unknown token (check --token)"
    )


def test_search_against_no_server_says_it_cannot_reach_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = run("examples/search.py", "--url", url, "N-11")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        == f"search.py: cannot reach the recall server at {url} (is it running?)"
    )


def test_search_imports_no_mcp_client_library() -> None:
    # importing FastMCP's client took 1.2 s of search.py's 1.5 s a call: the script is one
    # JSON-RPC request in the standard library (tests/test_demo.py checks what it prints)
    done = run("-X", "importtime", "examples/search.py", "--help")
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()}
    assert done.returncode == 0
    assert imported & {"fastmcp", "mcp", "mcp_types", "httpx", "httpx2", "pydantic"} == set()


def test_backfill_of_a_missing_file_exits_2_with_one_line(tmp_path: Path) -> None:
    env = make_server(tmp_path, ENGINE="embedded").env
    done = run("recall_server.py", "backfill", str(tmp_path / "missing.jsonl"), env=env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "missing.jsonl: no such file or directory" in done.stderr


def test_a_bad_setting_stops_the_server_with_one_line_naming_it(tmp_path: Path) -> None:
    env = make_server(tmp_path, ENGINE="embedded", RECALL_K="0").env
    done = run("recall_server.py", env=env)
    assert done.returncode == 1
    assert done.stderr.startswith("recall-server: bad setting RECALL_K: ")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("setting", "value", "line"),
    [
        ("LOG_LEVEL", "verbose", f"bad setting LOG_LEVEL: must be one of {LEVELS}"),
        ("DATA_DIR", "{file}", "DATA_DIR {file}: is a file, not a directory"),
        ("DATA_DIR", "{file}/data", "DATA_DIR {file}/data: cannot be created (Not a directory)"),
        ("DATA_DIR", "/proc/recall-data", "DATA_DIR /proc/recall-data: cannot be created ("),
    ],
)
def test_a_log_level_or_data_dir_the_server_cannot_use_stops_it_with_one_line(
    tmp_path: Path, setting: str, value: str, line: str
) -> None:
    # given a setting the server cannot serve with: an unknown level, DATA_DIR naming a file,
    # a path below a file, a path no one may create
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory")
    value, line = value.format(file=a_file), line.format(file=a_file)
    env = {**make_server(tmp_path, ENGINE="embedded").env, setting: value}
    # when it starts
    done = run("recall_server.py", env=env)
    # then it exits with one line that names the setting and why, no traceback
    assert done.returncode == 1
    assert done.stderr.startswith(f"recall-server: {line}"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("key", ["", "too-short", "change-me-change-me-change-me"])
def test_a_missing_short_or_placeholder_ingest_key_is_answered_with_how_to_generate_one(
    tmp_path: Path, key: str
) -> None:
    env = make_server(tmp_path, ENGINE="embedded", INGEST_KEY=key).env
    done = run("recall_server.py", env=env)
    assert done.returncode == 1
    assert done.stderr.startswith("recall-server: INGEST_KEY ")
    assert done.stderr.strip().endswith(GENERATE_KEY)
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_start_refused_for_its_settings_loads_neither_fastmcp_nor_the_model(
    tmp_path: Path,
) -> None:
    # importing FastMCP, the app and onnxruntime took 1.1 of a refused start's 1.5 CPU-s: the
    # settings are checked first
    env = make_server(tmp_path, ENGINE="embedded", INGEST_KEY="").env
    done = run("-X", "importtime", "recall_server.py", env=env)
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()}
    assert done.returncode == 1
    assert "recall-server: INGEST_KEY is not set" in done.stderr
    assert imported & {"fastmcp", "mcp", "onnxruntime", "numpy", "tokenizers"} == set()


def test_a_bad_setting_stops_the_backfill_with_exit_2_and_one_line_naming_it(
    tmp_path: Path,
) -> None:
    env = make_server(tmp_path, ENGINE="embedded", RECALL_K="0").env
    source = tmp_path / "history.jsonl"
    source.write_text("")
    done = run("recall_server.py", "backfill", str(source), env=env)
    assert done.returncode == 2
    assert done.stderr.startswith("recall-server backfill: bad setting RECALL_K: ")
    assert len(done.stderr.strip().splitlines()) == 1


def test_seeder_with_wait_posts_once_the_server_comes_up(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # (on the funes stand-in: the seeder then waits for the index runs, which the embedded
    # engine takes a CPU-minute over here; the next test waits for those)
    server = make_server(tmp_path, ENGINE="funes", FUNES_BIN=str(fake_funes.path))
    # The seeder starts first, as when the README's block is pasted whole.
    starter = threading.Timer(1.0, server.start)
    starter.start()
    try:
        done = run(
            "seeds/seed.py", "--url", server.url, "--key", server.ingest_key, "--wait", "300"
        )
    finally:
        starter.join()
        server.stop()
    assert done.returncode == 0, done.stderr
    assert "posted" in done.stdout


def test_seeder_with_wait_gives_up_with_one_line_when_no_server_comes() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = run("seeds/seed.py", "--url", url, "--key", "k" * 32, "--wait", "0.5")
    assert done.returncode == 1
    assert done.stderr.strip() == f"seed.py: no recall server answered at {url}/healthz within 0.5s"
    assert time.monotonic() - started < 60


async def test_seeder_with_wait_returns_once_what_it_posted_is_searchable(server: Server) -> None:
    # given a running server and the seeder told to wait
    key = server.ingest_key
    done = run("seeds/seed.py", "--url", server.url, "--key", key, "--wait", "300")
    # when the first search comes the moment the seeder returns
    answer = await server.recall("alice", "N-11 upgrade")
    # then it finds what was posted, not "unavailable" while the index is still being built
    assert done.returncode == 0, done.stderr
    assert "go ahead with the N-11 upgrade" in answer


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_subcommands_and_every_setting_and_needs_no_settings(
    tmp_path: Path, flag: str
) -> None:
    # given no ingest key, no tokens, and a setting that does not validate
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PORT": "not-a-port"}
    # when asked for help
    done = run("recall_server.py", flag, env=env)
    # then it prints usage and every setting with its default, and exits 0
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "bad setting" not in done.stderr
    assert "recall-server backfill FILE" in done.stdout
    assert "PORT=8000" in done.stdout and "INGEST_KEY (required, 16+ chars)" in done.stdout
    listed = [name.upper() for name in Settings.model_fields if f"  {name.upper()}" in done.stdout]
    assert listed == [name.upper() for name in Settings.model_fields]


def test_an_unknown_argument_exits_2_with_one_line_pointing_to_help(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    done = run("recall_server.py", "--port", "9000", env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == "recall-server: unknown argument '--port'; see --help"


def test_seeder_with_wait_reports_an_earlier_server_on_the_port_not_a_wrong_key(
    server: Server,
) -> None:
    # given a server from an earlier paste still running, and the block pasted again: a new key,
    # and a new server on the same port, which cannot start
    first = server
    second = {**first.env, "INGEST_KEY": "a-new-key-" + "0123456789abcdef"}
    started = run("recall_server.py", env=second)
    # when the seeder waits for the server and posts with the new key
    done = run("seeds/seed.py", "--url", first.url, "--key", second["INGEST_KEY"], "--wait", "30")
    # then it says an earlier server holds the port, in one line, not "check INGEST_KEY"
    assert started.returncode != 0 and "is already in use" in started.stderr
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith(f"seed.py: a recall server was already running at {first.url}")
    assert "refuses this INGEST_KEY (401): it is an earlier server" in done.stderr


def test_seeder_with_wait_reports_a_port_held_by_another_program_at_once(tmp_path: Path) -> None:
    # given another program answering HTTP on the port (a file server: /healthz is 404)
    port = free_port()
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while run("-c", f"import urllib.request; urllib.request.urlopen('{url}/')").returncode:
            assert time.monotonic() < deadline
        # when the seeder waits for a recall server there
        started = time.monotonic()
        done = run("seeds/seed.py", "--url", url, "--key", "k" * 32, "--wait", "60")
    finally:
        other.terminate()
        other.wait(10)
    # then it says, at once and in one line, that another program holds the port
    assert done.returncode == 1 and time.monotonic() - started < 30
    assert done.stderr.strip() == (
        f"seed.py: something answers 404, not a recall server, at {url}/healthz: another "
        f"program holds port {port}, so a recall server started there could not take it (its "
        "log says the port is already in use); stop that program first"
    )


def test_seeding_again_after_an_erase_names_the_erase_and_how_to_start_over(
    tmp_path: Path,
) -> None:
    # given the demo seeded, then alice erased (no index run meanwhile: an erase waits for a
    # running one, and what the runs would index has no part in this)
    with make_server(tmp_path, ENGINE="embedded", INDEX_DEBOUNCE="3600").start() as server:
        key = server.ingest_key
        assert run("seeds/seed.py", "--url", server.url, "--key", key).returncode == 0
        assert server.post({"user": "alice"}, route="/erase")[0] == 200
        # when the demo is seeded again
        done = run("seeds/seed.py", "--url", server.url, "--key", key)
    # then it stops with one line that says it was an erase, and how to start over
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1
    assert "410" in done.stderr and "was erased by an erase of this user" in done.stderr
    assert done.stderr.strip().endswith("remove its data (rm -rf recall-data) and start it again")


def test_a_port_in_use_stops_the_server_before_it_starts_with_one_line_naming_it(
    tmp_path: Path,
) -> None:
    # given another program listening on the port the server is given
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = {**make_server(tmp_path, ENGINE="embedded").env, "PORT": str(port)}
        # when the server starts
        done = run("recall_server.py", env=env, timeout=60)
    # then it stops, before its start-up, with one line: which port, and how to choose another
    assert done.returncode != 0
    assert done.stderr.strip() == (
        f"recall-server: port {port} on 127.0.0.1 is already in use: stop the server that "
        f"holds it, or choose another port with PORT (e.g. PORT={port + 1})"
    )
    assert "Traceback" not in done.stdout + done.stderr
    assert "startup complete" not in done.stdout + done.stderr


def test_one_data_dir_has_one_owner_a_second_server_or_a_backfill_stops_with_one_line(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    source = tmp_path / "history.jsonl"
    source.write_text(json.dumps(conversation("alice", "c1", "Ticket MT-4471 is open.", "Ok.")))
    # given a server using DATA_DIR
    with make_server(tmp_path, ENGINE="embedded").start() as first:
        pid = first.process.pid  # type: ignore[union-attr]
        taken = (
            f"DATA_DIR {data} is in use by another recall-server (a server, pid {pid}): one "
            "server (or backfill) per data directory; stop it first, or give this one another "
            "DATA_DIR"
        )
        # when a second server starts on it (on a port of its own), and a backfill
        # (a second that started would run on: the timeout fails the test)
        second = run("recall_server.py", env={**first.env, "PORT": str(free_port())}, timeout=60)
        backfill = run("recall_server.py", "backfill", str(source), env=first.env, timeout=60)
        # then each stops at once with one line that names DATA_DIR and the holder, and the
        # backfill wrote nothing
        assert second.returncode == 1 and second.stderr.strip() == f"recall-server: {taken}"
        assert backfill.returncode == 2
        assert backfill.stderr.strip() == f"recall-server backfill: {taken}"
        assert not (first.home("alice") / "src").exists()
        assert first.health()["status"] == "ok"  # the first serves on
    # and once the first has stopped, the backfill runs, and a server starts after it
    assert run("recall_server.py", "backfill", str(source), env=first.env).returncode == 0
    with make_server(tmp_path, ENGINE="embedded").start() as after:
        assert after.health()["status"] == "ok"
