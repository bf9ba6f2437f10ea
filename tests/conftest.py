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

import psycopg
import pytest
from pg import NoPostgres, PgDatabase, PgServer, table_rows
from psycopg.types.json import Jsonb

from devtools import testing
from devtools.testing import LocalServer
from recall.domain.conversation import user_dir_name
from recall.files.store import DATA_DIR_LOCK

ROOT = Path(__file__).resolve().parent.parent
FAKE_FUNES = Path(__file__).resolve().parent / "fake_funes.py"


def pytest_configure(config: pytest.Config) -> None:
    # Marked, not skipped: `pytest -q` runs them; `-m "not slow"` is a quicker local loop.
    config.addinivalue_line("markers", "slow: a long test (tens of seconds); runs by default")
    # One cache of the derived int8 graph (recall/embedder.py) for every server the tests start
    # (each gets a HOME of its own): derived once, not once per server. Passed through to them.
    os.environ.setdefault("XDG_CACHE_HOME", str(ROOT / ".pytest_cache" / "xdg"))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown where it is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadscope` with the longest modules sent first (tests/scheduling.py)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from scheduling import LongestModulesFirst  # xdist is there: it calls this hook

    return LongestModulesFirst(config, log)


@dataclass
class FakeFunes:
    """The funes stand-in installed as an executable in its own folder; its calls and events
    are those recorded after the first ``since`` lines of its log (see ``from_now``)."""

    folder: Path
    since: int = 0

    @property
    def path(self) -> Path:
        return self.folder / "funes"

    def from_now(self) -> FakeFunes:
        """The same stand-in, showing only the calls made from now on: for a stand-in that the
        tests of a module share, one after another."""
        return FakeFunes(self.folder, len(self._lines()))

    def install(self) -> None:
        """Write the executable (again: a test may remove it)."""
        self.path.write_text(f"#!{sys.executable}\n" + FAKE_FUNES.read_text())
        self.path.chmod(0o755)

    def control(self, **settings: Any) -> None:
        (self.folder / "control.json").write_text(json.dumps(settings))

    def calls(self, command: str | None = None) -> list[dict[str, Any]]:
        """The start event of every call (of one command), in order."""
        starts = [e for e in self.events() if e["event"] == "start"]
        return [e for e in starts if command is None or e["argv"][:1] == [command]]

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self._lines()[self.since :]]

    def _lines(self) -> list[str]:
        log = self.folder / "calls.jsonl"
        return log.read_text().splitlines() if log.exists() else []


def install_fake_funes(folder: Path) -> FakeFunes:
    folder.mkdir(parents=True)
    funes = FakeFunes(folder)
    funes.install()
    return funes


@pytest.fixture(autouse=True)
def restored_umask() -> Iterator[None]:
    """Each test starts with the worker's own umask: building the app in-process (create_app)
    sets the server's private umask, which would otherwise make every later directory of that
    worker 0700 (and PostgreSQL's system user, in the replicas tests, could not enter them)."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


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
    """A server for alice and bob (devtools.testing.make_server), with a short debounce so an index
    run follows a post quickly."""
    defaults = {"INDEX_DEBOUNCE": "0.2", "LOG_LEVEL": "INFO"}
    return testing.make_server(tmp_path, **{**defaults, **settings})


@pytest.fixture
def funes_server(tmp_path: Path, fake_funes: FakeFunes) -> Iterator[Server]:
    """A server on the funes engine, driven through the stand-in."""
    server = make_server(tmp_path, ENGINE="funes", FUNES_BIN=str(fake_funes.path)).start()
    yield server
    server.stop()


def refuses_to_start_naming_the_extra(
    workdir: Path, package: str, init: str, extra: str, **settings: str
) -> None:
    """A server whose ``package`` is a stand-in (``init`` its __init__.py, first on the
    server's path) exits at once on these settings, with a line naming the extra to install."""
    shadow = workdir / "shadow" / package
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(init)
    server = testing.make_server(
        workdir, ENGINE="embedded", PYTHONPATH=str(shadow.parent), **settings
    )
    with pytest.raises(RuntimeError, match="exited early"):
        server.start(timeout=60)
    assert server.process is not None and server.process.returncode != 0
    assert f"pip install 'recall-server[{extra}]'" in server.log(), server.log()


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> None:
    # A ceiling, not a measurement: generous, so a loaded machine cannot fail a test by it
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not met in time")


def tree(path: Path) -> list[str]:
    """Everything under a directory, for 'nothing was written' checks; not the lock a running
    server holds on DATA_DIR (it holds no data)."""
    if not path.exists():
        return []
    found = (str(p.relative_to(path)) for p in path.rglob("*"))
    return sorted(name for name in found if name != DATA_DIR_LOCK)


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
    try:
        yield server
    finally:
        server.cleanup()


# --- the behaviour suite: each test that takes `backing` (or `module_backing`) runs on both -----

STORES = ("files", "postgres")


@dataclass
class Backing:
    """The store a behaviour test runs on: its server settings and a way to see all it holds."""

    name: str
    database: PgDatabase | None = None

    @property
    def settings(self) -> dict[str, str]:
        if self.database is None:
            return {}
        return {"STORE": "postgres", "DATABASE_URL": self.database.app_url}

    def snapshot(self, server: LocalServer, settle: bool = True) -> Any:
        """Everything the store holds, for "nothing was written" checks: the files under
        DATA_DIR, or every table's rows. With ``settle``, taken once no index run is due or
        going on: a run an earlier write made due must not end between a test's two snapshots."""
        if settle:
            wait_for(lambda: server.health()["indexing"] == 0, timeout=120)
        if self.database is None:
            return tree(server.data_dir)
        return table_rows(self.database.superuser_url)

    def add_audit(self, server: LocalServer, user: str, lines: list[dict[str, Any]]) -> None:
        """Audit lines as the tool appends them, oldest first, put straight into the store (a
        test of the audit's reading needs hundreds)."""
        if self.database is None:
            with open(server.home(user) / "audit.jsonl", "a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(line) + "\n" for line in lines)
            return
        with psycopg.connect(self.database.superuser_url) as conn:
            for line in lines:
                conn.execute(
                    "INSERT INTO audit (user_hash, at, line) VALUES (%s, %s, %s)",
                    (user_dir_name(user), line["at"], Jsonb(line)),
                )


def _backing(request: pytest.FixtureRequest) -> Iterator[Backing]:
    if request.param == "files":
        yield Backing("files")
        return
    pg: PgServer = request.getfixturevalue("pg_server")
    database = pg.new_database()
    yield Backing("postgres", database)
    pg.drop_database(database.name)


@pytest.fixture(params=STORES)
def backing(request: pytest.FixtureRequest) -> Iterator[Backing]:
    yield from _backing(request)


@pytest.fixture(scope="module", params=STORES)
def module_backing(request: pytest.FixtureRequest) -> Iterator[Backing]:
    yield from _backing(request)


@pytest.fixture
def pg_database(pg_server: PgServer) -> Iterator[PgDatabase]:
    """A fresh migrated database for one test: `.owner_url`, `.app_url`, `.superuser_url`."""
    database = pg_server.new_database()
    yield database
    pg_server.drop_database(database.name)


# An MCP initialize request, as a client's first POST /mcp sends it.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
