"""Call the recall tool from a terminal, as an agent would: no agent CLI needed.

python examples/search.py [--url URL] [--token demo-token-alice] "N-11 upgrade"
"""

from __future__ import annotations

import argparse
import asyncio

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
    print(asyncio.run(recall(args.url, args.token, args.query)))


if __name__ == "__main__":
    main()
