"""One log format for the whole process: FastMCP's and uvicorn's lines come out like ours, at
LOG_LEVEL, one record a line (no Rich console that pads, wraps and colours them)."""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
from pathlib import Path

import pytest
from conftest import Server, conversation, make_server
from fastmcp import Client
from test_auth import mcp_status
from test_memory_api import call

from recall import logs
from recall.logs import CONTROLS, LOG_FORMAT, JsonFormatter, TextFormatter
from recall.settings import Settings

# `<asctime> <LEVEL> <logger name> <message>`: recall/logs.py's LOG_FORMAT
OUR_FORMAT = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+ \S"
)


async def call_without_its_argument(server: Server) -> None:
    """A tool call FastMCP refuses, and logs at WARNING ("Invalid arguments for tool ...")."""
    async with Client(f"{server.url}/mcp", auth=server.tokens["alice"]) as client:
        result = await client.call_tool("recall_my_conversations", {}, raise_on_error=False)
    assert result.is_error


async def test_fastmcp_and_uvicorn_lines_have_the_projects_format(tmp_path: Path) -> None:
    # given a server at INFO
    with make_server(tmp_path, ENGINE="embedded", LOG_LEVEL="INFO").start() as server:
        # when a refused token and a bad tool call are logged (ours, FastMCP's), and uvicorn
        # logs its start and the requests
        assert mcp_status(server, "not-a-token") == 401
        await call_without_its_argument(server)
    lines = server.log().splitlines()
    # then every line, whoever wrote it, is ours: time, level, logger, message
    assert [line for line in lines if not OUR_FORMAT.match(line)] == []
    names = {line.split()[3] for line in lines}
    assert "fastmcp.server.server" in names  # "Invalid arguments for tool ..."
    assert "uvicorn.error" in names and "uvicorn.access" in names


async def test_fastmcp_follows_log_level(tmp_path: Path) -> None:
    # given a server at ERROR (FastMCP's own default would be INFO)
    with make_server(tmp_path, ENGINE="embedded", LOG_LEVEL="ERROR").start() as server:
        # when FastMCP refuses a tool call, which it reports at WARNING
        await call_without_its_argument(server)
    # then the line is not written
    assert "Invalid arguments" not in server.log()


async def test_at_debug_no_query_or_conversation_text_reaches_the_log(tmp_path: Path) -> None:
    # given a server logging everything, ours and the libraries'
    marker = f"word{secrets.token_hex(6)}"
    settings = {"LOG_LEVEL": "DEBUG", "FASTMCP_LOG_LEVEL": "DEBUG"}
    with make_server(tmp_path, ENGINE="embedded", **settings).start() as server:
        # when a conversation carrying a marker is posted and the agent searches for it
        assert server.post(conversation("alice", "c", f"the {marker} ticket", "ok"))[0] == 202
        server.wait_indexed("alice")
        assert marker in await server.recall("alice", f"{marker}\n{marker}")
    # then our DEBUG lines are written, and the marker is in none of the lines
    log = server.log()
    assert " DEBUG recall.embedded " in log
    assert [line for line in log.splitlines() if marker in line] == []


FORGED = "/x\n2026-01-01 INFO recall forged\r\x1b[2J\x0b\x85\u2028\u2029end\x7f"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_message_with_control_characters_is_one_line_with_them_escaped(log_format: str) -> None:
    # given a record whose message and exception carry line breaks and other controls
    try:
        raise ValueError(FORGED)
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, "f", 1, "GET %s", (FORGED,), exc_info
    )
    # when it is formatted
    formatter = JsonFormatter() if log_format == "json" else TextFormatter(LOG_FORMAT)
    line = formatter.format(record)
    # then it is one line without a control character, that says what was logged
    assert len(line.splitlines()) == 1 and not CONTROLS.search(line)
    if log_format == "json":  # the JSON escapes decode to the message as it was
        assert json.loads(line)["event"] == f"GET {FORGED}"
        assert FORGED in json.loads(line)["exception"]
    else:
        escaped = "/x\\n2026-01-01 INFO recall forged\\r\\x1b[2J\\x0b\\x85\\u2028\\u2029end\\x7f"
        assert line.split(" ", 4)[4].startswith(f"GET {escaped}\\nTraceback")
        assert line.endswith(f"ValueError: {escaped}")


def test_each_refusal_is_logged_with_its_reason_once_per_reason_and_interval_and_no_value(
    tmp_path: Path,
) -> None:
    # given markers for a user id, a key, a token and conversation text
    user, key, token, text = (f"{kind}{secrets.token_hex(6)}" for kind in ("u", "k", "t", "w"))
    server = make_server(tmp_path, ENGINE="embedded", users=(user,))  # type: ignore[arg-type]
    bad_time = conversation(user, "c1", f"the {text} ticket", "ok")
    bad_time["turns"][0]["ts"] = f"{text} o'clock"
    with server.start():
        # when requests are refused: a bad field twice, a wrong key, an unknown conversation,
        # a token no one was given at /mcp and at the memory page
        assert [server.post(bad_time)[0] for _ in range(2)] == [400, 400]
        assert server.post(bad_time, key=key)[0] == 401
        forget = {"user": user, "conversation_id": f"c-{text}"}
        assert server.post(forget, route="/forget")[0] == 404
        assert mcp_status(server, token) == 401
        assert call(server, "GET", "/api/me", token=token)[0] == 401
    lines = server.log().splitlines()

    def written(reason: str) -> int:
        return len([line for line in lines if line.endswith(f" INFO recall {reason}")])

    # then each reason is written once (the same reason again within the interval is not),
    # naming the field and the rule
    ts_rule = "turns[0].ts: must be an RFC 3339 timestamp with Z or an offset"
    assert written(f"request refused (400): {ts_rule}") == 1
    assert written("request refused (401): x-ingest-key: missing or wrong") == 1
    assert (
        written("request refused (404): conversation_id: no such conversation for this user") == 1
    )
    assert written("bearer token refused: unknown token") == 1
    # and no line holds the user id, the key, the token or the text
    assert [line for line in lines if any(m in line for m in (user, key, token, text))] == []


def test_a_reason_refused_again_after_the_interval_is_written_with_the_count_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # given the refusal log at a moment of its clock
    now = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: now[0])
    refusals = logs.Refusals(logging.getLogger("recall.test"), interval=10.0)
    caplog.set_level(logging.INFO, "recall.test")
    # when one reason comes three times within the interval, another once, then the first again
    for _ in range(3):
        refusals.note("request refused (400): turns: must be a non-empty list")
    refusals.note("request refused (401): x-ingest-key: missing or wrong")
    now[0] += 10.0
    refusals.note("request refused (400): turns: must be a non-empty list")
    # then each reason's first is written, and the first reason's next line counts the two
    assert caplog.messages == [
        "request refused (400): turns: must be a non-empty list",
        "request refused (401): x-ingest-key: missing or wrong",
        "request refused (400): turns: must be a non-empty list (2 more since its last line)",
    ]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_written_line_holds_a_password_or_key_whatever_a_library_quotes(
    log_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the server's logging, with a DATABASE_URL whose password libpq cannot parse
    password = "Tr0ub4dor%zz3-horse"
    ingest_key = secrets.token_hex(16)
    url = f"postgresql://recall_app:{password}@db.internal:5432/recall"
    settings = Settings(
        INGEST_KEY=ingest_key, STORE="postgres", DATABASE_URL=url, AUTH_TOKENS_FILE="t.json"
    )
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        root.handlers = []  # pytest's own: basicConfig adds ours only to a root without any
        logs.configure_logging("INFO", log_format, settings.secrets())
        # When libraries quote it: psycopg_pool the token libpq quotes, a URL, a connection
        # string, a traceback
        pool = logging.getLogger("psycopg.pool")
        pool.warning(
            "error connecting in %r: invalid percent-encoded token: %r", "recall", password
        )
        pool.warning("cannot connect to %s", url.replace("db.internal", "other.internal"))
        pool.warning("dsn host=db password=%s user=recall_app", "an0ther-secret")
        try:
            raise ValueError(f"bad key {ingest_key} in {url}")
        except ValueError:
            logging.getLogger("uvicorn.error").exception("failed")
    finally:
        root.handlers, root.level = saved[0], saved[1]
    # Then no line holds the password, any part of the key or the connection string's password
    written = capsys.readouterr().err
    assert len(written.splitlines()) == 4, written
    for secret in (password, "Tr0ub4dor", ingest_key, "an0ther-secret"):
        assert secret not in written
    assert written.count("[redacted]") >= 5
