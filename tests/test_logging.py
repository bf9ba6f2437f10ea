"""One log format for the whole process: FastMCP's and uvicorn's lines come out like ours, at
LOG_LEVEL, one record a line (no Rich console that pads, wraps and colours them)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import make_server
from test_auth import mcp_status

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
