"""Call the recall tool from a terminal, as an agent would: no agent CLI needed.

python examples/search.py [--url URL] [--token demo-token-alice] "N-11 upgrade"

Exit status: 0 with the tool's answer on stdout; 1 with a one-line reason on stderr when the
server cannot be reached or refuses the token.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.error
import urllib.request

from fastmcp import Client


async def recall(url: str, token: str, query: str) -> str:
    async with Client(f"{url.rstrip('/')}/mcp", auth=token) as client:
        result = await client.call_tool("recall_my_conversations", {"query": query})
        return result.content[0].text  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description="Search a user's earlier conversations.")
    parser.add_argument("query")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default="demo-token-alice", help="the user's bearer token")
    args = parser.parse_args()
    try:
        print(asyncio.run(recall(args.url, args.token, args.query)))
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
