"""The HTTP/MCP transport under hostile clients: no per-client state at /mcp, bounded connections
and uploads, and DNS-rebinding protection (issue 8, items 3, 4 and 14), on real server processes."""

from __future__ import annotations

import http.client
import json
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import INITIALIZE, ROOT, Server, make_server, tree, wait_for

from recall.domain.answers import NO_MEMORY
from recall.transport import ACCEPT_BACKLOG, DESCRIPTOR_HEADROOM

CALL_TOOL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "recall_my_conversations", "arguments": {"query": "N-11 upgrade"}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Default transport settings, on loopback."""
    with make_server(tmp_path_factory.mktemp("default"), ENGINE="embedded").start() as started:
        yield started


@pytest.fixture(scope="module")
def impatient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Short deadlines: 1 s for a request head, an idle connection and a /turns body."""
    tmp = tmp_path_factory.mktemp("impatient")
    settings = {"MAX_CONNECTIONS": "5", "KEEPALIVE_TIMEOUT": "1", "BODY_TIMEOUT": "1"}
    with make_server(tmp, ENGINE="embedded", **settings).start() as started:
        yield started


@pytest.fixture(scope="module")
def patient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Few connections, long deadlines: held connections stay held."""
    tmp = tmp_path_factory.mktemp("patient")
    settings = {"MAX_CONNECTIONS": "5", "KEEPALIVE_TIMEOUT": "60", "BODY_TIMEOUT": "60"}
    with make_server(tmp, ENGINE="embedded", **settings).start() as started:
        yield started


def port(server: Server) -> int:
    return int(server.env["PORT"])


def mcp_post(
    server: Server,
    message: dict[str, Any],
    user: str = "alice",
    host: str | None = None,
    origin: str | None = None,
) -> tuple[int, dict[str, str], str]:
    """One JSON-RPC POST to /mcp with the user's bearer token: (status, headers, body)."""
    headers = {
        "Authorization": f"Bearer {server.tokens[user]}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    if host is not None:
        headers["Host"] = host
    if origin is not None:
        headers["Origin"] = origin
    connection = http.client.HTTPConnection("127.0.0.1", port(server), timeout=30)
    try:
        connection.request("POST", "/mcp", json.dumps(message), headers)
        response = connection.getresponse()
        answer = {name.lower(): value for name, value in response.getheaders()}
        return response.status, answer, response.read().decode()
    finally:
        connection.close()


def health_status(server: Server) -> int:
    try:
        with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def connect(server: Server, sent: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port(server)), timeout=30)
    sock.sendall(sent)
    return sock


def stalled_upload(server: Server) -> socket.socket:
    """A /turns POST whose head is complete and whose body stops after a few bytes."""
    head = (
        f"POST /turns HTTP/1.1\r\nHost: 127.0.0.1:{port(server)}\r\n"
        f"x-ingest-key: {server.ingest_key}\r\ncontent-type: application/json\r\n"
        "content-length: 1000\r\n\r\n"
    )
    return connect(server, head.encode() + b'{"user": "al')


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, response.read()


def closed_by_server(sock: socket.socket, within: float = 30) -> bool:
    """Whether the server closes the connection (reading until it does) within `within` s."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


GET_HEALTH = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


# --- item 3: /mcp keeps no per-client state -----------------------------------------------------


async def test_many_initializes_by_one_token_open_no_session_and_another_user_is_served(
    server: Server,
) -> None:
    # given: one token holder initializing in a loop, as a client filling a session table would
    answers = [mcp_post(server, INITIALIZE, user="alice") for _ in range(50)]
    # then: every initialize succeeds and none opens a session the server must keep
    assert [status for status, _, _ in answers] == [200] * 50
    assert not [headers for _, headers, _ in answers if "mcp-session-id" in headers]
    # and another user's tool call through FastMCP's client is served
    assert await server.recall("bob", "N-11 upgrade decision") == NO_MEMORY


def test_a_tool_call_is_served_without_a_prior_initialize_or_session(server: Server) -> None:
    # given: no initialize and no session id, the state a stateful server would insist on
    # when: the tool is called straight away
    status, headers, body = mcp_post(server, CALL_TOOL, user="alice")
    # then: it is answered
    assert status == 200, body
    assert NO_MEMORY in body and "mcp-session-id" not in headers


# --- item 14: DNS-rebinding protection ----------------------------------------------------------


def test_a_foreign_host_is_refused_on_mcp(server: Server) -> None:
    status, _, body = mcp_post(server, INITIALIZE, host=f"attacker.example:{port(server)}")
    assert status == 421, body


def test_a_foreign_origin_is_refused_on_mcp(server: Server) -> None:
    status, _, body = mcp_post(server, INITIALIZE, origin="http://attacker.example")
    assert status == 403, body


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "[::1]"])
def test_the_loopback_names_are_served_on_mcp(server: Server, name: str) -> None:
    address = f"{name}:{port(server)}"
    status, _, body = mcp_post(server, INITIALIZE, host=address, origin=f"http://{address}")
    assert status == 200, body


def test_allowed_hosts_and_origins_add_those_names_and_no_others(tmp_path: Path) -> None:
    # given: a server told the name it is reached by and the one browser origin it trusts
    settings = {"ALLOWED_HOSTS": "recall.internal", "ALLOWED_ORIGINS": "https://chat.example.com"}
    with make_server(tmp_path, ENGINE="embedded", **settings).start() as server:
        # then: those are served, loopback still is, and other names are not
        assert mcp_post(server, INITIALIZE, host="recall.internal:8000")[0] == 200
        assert mcp_post(server, INITIALIZE, origin="https://chat.example.com")[0] == 200
        assert mcp_post(server, INITIALIZE, host=f"localhost:{port(server)}")[0] == 200
        assert mcp_post(server, INITIALIZE, host="recall.attacker.example")[0] == 421
        assert mcp_post(server, INITIALIZE, origin="https://chat.attacker.example")[0] == 403


def test_a_server_off_loopback_without_allowed_hosts_refuses_to_start(tmp_path: Path) -> None:
    # given: a non-loopback HOST (a documentation address: nothing is ever bound) and no names
    server = make_server(tmp_path, ENGINE="embedded")
    server.env["HOST"] = "192.0.2.1"
    # then: it will not start, and says which setting is missing
    with pytest.raises(RuntimeError, match="exited early") as refused:
        server.start()
    assert "ALLOWED_HOSTS" in str(refused.value)


# --- item 4: connection limits and deadlines ----------------------------------------------------


def test_a_stalled_turns_upload_gets_408_and_writes_nothing(impatient: Server) -> None:
    # given: an upload that sends its head and a few bytes of its body, then stalls
    upload = stalled_upload(impatient)
    # then: it is answered 408 (after BODY_TIMEOUT of 1 s), nothing is written, nothing logged
    with upload:
        status, body = read_response(upload)
    assert status == 408
    assert json.loads(body) == {"error": "body: not received within 1 s"}
    assert tree(impatient.data_dir) == []
    assert "Traceback" not in impatient.log()


def test_an_upload_that_trickles_on_after_its_408_is_disconnected(impatient: Server) -> None:
    # given: a stalled upload answered 408
    with stalled_upload(impatient) as upload:
        assert read_response(upload)[0] == 408
        # when: the client goes on sending its body a byte at a time
        try:
            for _ in range(100):
                upload.sendall(b" ")
                time.sleep(0.2)
        except OSError:  # closed by the server: what we want
            pass
        # then: the server has closed the connection rather than wait for the rest
        assert closed_by_server(upload, within=1)


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"],
    ids=["nothing", "half a request head"],
)
def test_a_connection_without_a_whole_request_head_is_closed(
    impatient: Server, sent: bytes
) -> None:
    with connect(impatient, sent) as idle:
        assert closed_by_server(idle)


def test_a_request_head_sent_a_byte_at_a_time_does_not_keep_its_connection(
    impatient: Server,
) -> None:
    # given: a client that keeps its head unfinished by trickling it, a byte every 0.2 s
    trickle = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 60
    with connect(impatient) as slow:
        try:
            for byte in trickle:
                slow.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:  # closed by the server: what we want
            pass
        # then: the server closed it although the client never went quiet for KEEPALIVE_TIMEOUT
        assert closed_by_server(slow, within=1)


def test_an_idle_keepalive_connection_is_closed_after_its_response(impatient: Server) -> None:
    with connect(impatient, GET_HEALTH) as idle:
        assert read_response(idle)[0] == 200
        assert closed_by_server(idle)


def test_an_idle_keepalive_connection_is_kept_for_keepalive_timeout(patient: Server) -> None:
    # given: KEEPALIVE_TIMEOUT 60 s, and a connection idle after its first response
    with connect(patient, GET_HEALTH) as kept:
        assert read_response(kept)[0] == 200
        time.sleep(7)  # longer than uvicorn's own default of 5 s
        # then: the same connection still serves a second request
        kept.sendall(GET_HEALTH)
        assert read_response(kept)[0] == 200


def test_past_max_connections_a_request_gets_503_until_they_close(patient: Server) -> None:
    # given: no connection left over from an earlier test, then MAX_CONNECTIONS (5) uploads
    # held open mid-body
    wait_for(lambda: health_status(patient) == 200, timeout=60)
    held = [stalled_upload(patient) for _ in range(5)]
    try:
        # then: one more connection is refused with 503
        wait_for(lambda: health_status(patient) == 503)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{patient.url}/healthz", timeout=5)
        assert refused.value.code == 503
        assert json.loads(refused.value.read()) == {
            "error": "connections: more than 5 open, retry later"
        }
    finally:
        for sock in held:
            sock.close()
    # and once they close, the server answers again
    wait_for(lambda: health_status(patient) == 200)
    assert tree(patient.data_dir) == []


@pytest.mark.parametrize("limit", ["asked for at start", "40 files to spare"])
def test_a_flood_of_half_open_connections_at_the_open_files_limit_leaves_no_tracebacks(
    tmp_path: Path, limit: str
) -> None:
    # given: a server with MAX_CONNECTIONS 20 held to the open-files limit it asks for at start,
    # or to fewer (the limit lowered under it), where accepting runs out of descriptors
    settings = {"MAX_CONNECTIONS": "20", "KEEPALIVE_TIMEOUT": "2"}
    with make_server(tmp_path, ENGINE="embedded", **settings).start() as server:
        assert server.process is not None
        in_use = len(list(Path(f"/proc/{server.process.pid}/fd").iterdir()))
        asked = 20 + ACCEPT_BACKLOG + DESCRIPTOR_HEADROOM
        files = asked if limit.startswith("asked") else in_use + 40
        resource.prlimit(server.process.pid, resource.RLIMIT_NOFILE, (files, files))
        # when: 300 clients each send half a request head and stall
        flood = [connect(server, b"GET /healthz HTTP/1.1\r\n") for _ in range(300)]
        try:
            # then: the server sheds them and answers again while they are still open
            wait_for(lambda: health_status(server) == 200, timeout=30)
        finally:
            for sock in flood:
                sock.close()
        # and the log holds a line or two about it, not a traceback per connection
        log = server.log()
        assert "Traceback" not in log
        lines = log.count("refused") + log.count("out of open files")
        assert 1 <= lines <= 4, log


def test_max_connections_beyond_the_open_files_limit_refuses_to_start(tmp_path: Path) -> None:
    # given: MAX_CONNECTIONS 5000 in a process allowed 1024 open files at most
    server = make_server(tmp_path, ENGINE="embedded", MAX_CONNECTIONS="5000")
    hard = min(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])

    def low_open_files_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    # then: it will not start, and says why
    result = subprocess.run(
        [sys.executable, str(ROOT / "recall_server.py")],
        env=server.env,
        cwd=ROOT,
        preexec_fn=low_open_files_limit,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "MAX_CONNECTIONS=5000" in result.stderr
