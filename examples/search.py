"""Call the recall tools from a terminal, as an agent would: no agent CLI needed.

python examples/search.py [--url URL] [--token demo-token-alice] "N-11 upgrade"
python examples/search.py [--url URL] [--token ...] --read REF [--from-turn N] [--to-turn M]

The first searches (recall_my_conversations); the second reads turns of the conversation a
passage header names ("ref <ref> turn <n>") whole (read_my_conversation).

Exit status: 0 with the tool's answer on stdout; 1 with a one-line reason on stderr when the
server cannot be reached or refuses the token.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.error
import urllib.request
from typing import Any

from fastmcp import Client


async def call(url: str, token: str, tool: str, arguments: dict[str, Any]) -> str:
    async with Client(f"{url.rstrip('/')}/mcp", auth=token) as client:
        result = await client.call_tool(tool, arguments)
        return result.content[0].text  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description="Search a user's earlier conversations.")
    parser.add_argument("query", nargs="?", help="what to search for (not with --read)")
    parser.add_argument("--read", metavar="REF", help="read the conversation a header names")
    parser.add_argument("--from-turn", type=int, default=1, help="with --read: the first turn")
    parser.add_argument("--to-turn", type=int, help="with --read: the last turn (default: on)")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default="demo-token-alice", help="the user's bearer token")
    args = parser.parse_args()
    if (args.query is None) == (args.read is None):
        parser.error("give a query to search for, or --read REF")
    if args.read is None:
        tool, arguments = "recall_my_conversations", {"query": args.query}
    else:
        tool, arguments = "read_my_conversation", {"ref": args.read, "from_turn": args.from_turn}
        if args.to_turn is not None:
            arguments["to_turn"] = args.to_turn
    try:
        print(asyncio.run(call(args.url, args.token, tool, arguments)))
    except Exception as exc:  # one line for a person at a terminal, not a traceback
        sys.exit(f"search.py: {reason(exc, args.url, args.token)}")


def reason(exc: Exception, url: str, token: str) -> str:
    """Why the call failed, in words. The MCP client reports an HTTP refusal only as a generic
    protocol error, so ask the endpoint once more, plainly, for its status."""
    initialize = (
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":'
        b'"2025-06-18","capabilities":{},"clientInfo":{"name":"search.py","version":"1"}}}'
    )
    request = urllib.request.Request(f"{url.rstrip('/')}/mcp", data=initialize, method="POST")
    request.add_header("content-type", "application/json")
    request.add_header("accept", "application/json, text/event-stream")
    request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10):
            pass
    except urllib.error.HTTPError as http:
        if http.code == 401:
            return "401: the token was refused (check --token)"
        return f"the server at {url} answered {http.code}"
    except OSError:
        return f"cannot reach the recall server at {url} (is it running?)"
    return f"the tool call failed: {type(exc).__name__}: {str(exc)[:200]}"


if __name__ == "__main__":
    main()
