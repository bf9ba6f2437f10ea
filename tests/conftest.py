"""Fixtures that build real things: a server process on a free loopback port, a funes stand-in."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pg import NoPostgres, PgDatabase, PgServer

from recall import testing
from recall.testing import LocalServer

ROOT = Path(__file__).resolve().parent.parent
FAKE_FUNES = Path(__file__).resolve().parent / "fake_funes.py"


def pytest_configure(config: pytest.Config) -> None:
    # Marked, not skipped: `pytest -q` runs them; `-m "not slow"` is a quicker local loop.
    config.addinivalue_line("markers", "slow: a long test (tens of seconds); runs by default")
    # One cache of the derived int8 graph (recall/embedder.py) for every server the tests start
    # (each gets a HOME of its own): derived once, not once per server. Passed through to them.
    os.environ.setdefault("XDG_CACHE_HOME", str(ROOT / ".pytest_cache" / "xdg"))


@dataclass
class FakeFunes:
    """The funes stand-in installed as an executable in its own folder."""

    folder: Path

    @property
    def path(self) -> Path:
        return self.folder / "funes"

    def control(self, **settings: Any) -> None:
        (self.folder / "control.json").write_text(json.dumps(settings))

    def calls(self, command: str | None = None) -> list[dict[str, Any]]:
        """The start event of every call (of one command), in order."""
        starts = [e for e in self.events() if e["event"] == "start"]
        return [e for e in starts if command is None or e["argv"][:1] == [command]]

    def events(self) -> list[dict[str, Any]]:
        log = self.folder / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def install_fake_funes(folder: Path) -> FakeFunes:
    folder.mkdir(parents=True)
    script = folder / "funes"
    script.write_text(f"#!{sys.executable}\n" + FAKE_FUNES.read_text())
    script.chmod(0o755)
    return FakeFunes(folder)


@pytest.fixture
def fake_funes(tmp_path: Path) -> FakeFunes:
    return install_fake_funes(tmp_path / "funes-bin")


def turn(role: str, text: str, ts: str = "2026-10-08T09:00:00Z", **extra: Any) -> dict[str, Any]:
    return {"role": role, "text": text, "ts": ts, **extra}


def conversation(user: str, cid: str, *texts: str, day: int = 8) -> dict[str, Any]:
    roles = ["user", "assistant"]
    return {
        "user": user,
        "conversation_id": cid,
        "turns": [
            turn(roles[i % 2], text, f"2026-10-{day:02d}T09:{i:02d}:00Z")
            for i, text in enumerate(texts)
        ],
    }


Server = LocalServer


def make_server(tmp_path: Path, **settings: str) -> LocalServer:
    """A server for alice and bob (recall.testing.make_server), with a short debounce so an index
    run follows a post quickly."""
    defaults = {"INDEX_DEBOUNCE": "0.2", "LOG_LEVEL": "INFO"}
    return testing.make_server(tmp_path, **{**defaults, **settings})


@pytest.fixture
def funes_server(tmp_path: Path, fake_funes: FakeFunes) -> Iterator[Server]:
    """A server on the funes engine, driven through the stand-in."""
    server = make_server(tmp_path, ENGINE="funes", FUNES_BIN=str(fake_funes.path)).start()
    yield server
    server.stop()


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> None:
    # A ceiling, not a measurement: generous, so a loaded machine cannot fail a test by it
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not met in time")


def tree(path: Path) -> list[str]:
    """Everything under a directory, for 'nothing was written' checks."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL 18 + pgvector for the session (tests/pg.py): `.owner_url`, `.app_url`,
    `.stop()` / `.start()`; skipped, with the reason, where none can start."""
    server = PgServer()
    try:
        server.start()
    except NoPostgres as exc:
        server.cleanup()
        pytest.skip(f"no PostgreSQL for these tests: {exc}")
    yield server
    server.cleanup()


@pytest.fixture
def pg_database(pg_server: PgServer) -> Iterator[PgDatabase]:
    """A fresh migrated database for one test: `.owner_url`, `.app_url`, `.superuser_url`."""
    database = pg_server.new_database()
    yield database
    pg_server.drop_database(database.name)
