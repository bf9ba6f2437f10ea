"""The test-server factory (devtools/testing.py) under parallel test workers: a port is the OS's
choice, and another program may take it before the server binds it."""

from __future__ import annotations

import os
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest
from conftest import make_server
from pg import NoPostgres, PgServer

from devtools.testing import listens


class AlwaysHealthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def other_program() -> Iterator[int]:
    """Another HTTP server on a free port, answering 200 to every GET (/healthz too)."""
    other = ThreadingHTTPServer(("127.0.0.1", 0), AlwaysHealthy)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    yield other.server_address[1]
    other.shutdown()
    other.server_close()


def test_a_server_whose_port_another_program_took_starts_on_another_port(
    tmp_path: Path, other_program: int
) -> None:
    # given a server given a port that another program took (its /healthz answers 200 too)
    server = make_server(tmp_path, ENGINE="embedded")
    server.env["PORT"] = str(other_program)
    # when it starts
    with server.start():
        # then it runs on another port, it is what answers there, and it says it lost the first
        port = int(server.env["PORT"])
        assert port != other_program
        assert listens(server.process.pid, port)  # type: ignore[union-attr]
        with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as response:
            assert b'"engine"' in response.read()
        assert f"port {other_program} on 127.0.0.1 is already in use" in server.log()


def test_listens_tells_the_process_holding_a_port_from_others(other_program: int) -> None:
    # given this process listening on a port (the other program's thread)
    # then this process holds it, and its parent does not
    assert listens(os.getpid(), other_program)
    assert not listens(os.getppid(), other_program)


def test_a_postgres_whose_port_another_program_took_starts_on_another_port(
    other_program: int,
) -> None:
    # given a test PostgreSQL given a port that another program took
    server = PgServer()
    server.port = other_program
    try:
        # when it starts
        try:
            server.start()
        except NoPostgres as exc:
            if "Address already in use" in str(exc):
                raise
            pytest.skip(f"no PostgreSQL for this test: {exc}")
        # then it listens on another port, and answers there
        assert server.port != other_program
        with psycopg.connect(server.superuser_url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.cleanup()
