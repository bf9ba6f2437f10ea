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
from conftest import conversation, make_server
from test_auth import mcp_status

from recall.logs import CONTROLS, LOG_FORMAT, JsonFormatter, TextFormatter

# `<asctime> <LEVEL> <logger name> <message>`: recall/logs.py's LOG_FORMAT
OUR_FORMAT = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+ \S"
)


def test_fastmcp_and_uvicorn_lines_have_the_projects_format(tmp_path: Path) -> None:
    # given a server at INFO
    with make_server(tmp_path, ENGINE="embedded", LOG_LEVEL="INFO").start() as server:
        # when a refused token makes FastMCP log, and uvicorn logs its start and the request
        assert mcp_status(server, "not-a-token") == 401
    lines = server.log().splitlines()
    # then every line, whoever wrote it, is ours: time, level, logger, message
    assert [line for line in lines if not OUR_FORMAT.match(line)] == []
    names = {line.split()[3] for line in lines}
    assert "fastmcp.server.auth.middleware" in names  # "Auth error returned: invalid_token"
    assert "uvicorn.error" in names and "uvicorn.access" in names


def test_fastmcp_follows_log_level(tmp_path: Path) -> None:
    # given a server at WARNING (FastMCP's own default would be INFO)
    with make_server(tmp_path, ENGINE="embedded", LOG_LEVEL="WARNING").start() as server:
        # when FastMCP refuses a token, which it reports at INFO
        assert mcp_status(server, "not-a-token") == 401
    # then the line is not written
    assert "Auth error returned" not in server.log()


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
