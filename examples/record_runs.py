"""Record what the recall tool returns for the demo's five questions, on a freshly seeded server.

    python examples/record_runs.py [--out examples/recall-runs.md]

Starts recall_server.py (embedded engine, a temporary DATA_DIR, a random ingest key, the demo
tokens, a free loopback port), seeds it with seeds/seed.py the way the chat gateway does (after
every turn), waits for the index, then sends the short queries an agent sends for each question
through an MCP client and writes every answer verbatim, with its latency, to a Markdown file.
Logs hold counts and timings only, never conversation text.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from fastmcp import Client

from recall.testing import LocalServer

ROOT = Path(__file__).resolve().parent.parent
TOKENS_FILE = ROOT / "examples" / "tokens.json"
START_TIMEOUT, INDEX_TIMEOUT = 60.0, 180.0  # seconds

P7 = "Did I ever discuss motor P-7 or ticket MT-5120?"
# fmt: off
QUESTIONS: list[tuple[str, str, str, list[str]]] = [  # title, question, user, the agent's queries
    ("A decision and its blocker, across two chats",
     "What did we decide about the N-11 upgrade, and what has to happen before it can be "
     "scheduled? Is that blocker still open according to my notes?", "alice",
     ["N-11 upgrade", "N-11 blocker schedule", "MT-4471 K-2 machine", "MT-4471 closed",
      "K-2 closed"]),
    ("A cause found across two chats",
     "Why were the reconciliation columns empty at the end of September, and who did I "
     "escalate it to?", "alice",
     ["reconciliation columns empty", "reconciliation failed", "F-204 escalated"]),
    ("A cross-chat to-do list",
     "Give me one consolidated list of my open follow-ups across all earlier chats.", "alice",
     ["follow-ups", "follow-up due", "by Friday", "escalated follow-up"]),
    ("Exact numbers",
     "Which forecast case did we pick as base case, with which parameters, and what did it "
     "give at 18 months?", "alice",
     ["forecast base case", "base case parameters", "forecast 18 months"]),
    ("Negative control, as alice", P7, "alice", ["P-7 motor", "MT-5120"]),
    ("Isolation, as bob", P7, "bob", ["P-7 motor", "MT-5120"]),
]
# fmt: on


async def recall(url: str, token: str, query: str) -> tuple[str, float]:
    """The tool's answer and the latency of the call itself (session setup excluded)."""
    async with Client(f"{url}/mcp", auth=token) as client:
        started = time.perf_counter()
        result = await client.call_tool("recall_my_conversations", {"query": query})
        return result.content[0].text, time.perf_counter() - started  # type: ignore[union-attr]


def fenced(text: str) -> str:
    """A code fence longer than any run of backticks in the text."""
    fence = "`" * max(3, 1 + max(map(len, re.findall(r"`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


async def record(url: str, tokens: dict[str, str]) -> list[str]:
    lines: list[str] = []
    for number, (title, question, user, queries) in enumerate(QUESTIONS, 1):
        lines += [f"## {number}. {title}", "", f"> {question}", "", f"As **{user}**.", ""]
        for query in queries:
            answer, latency = await recall(url, tokens[user], query)
            print(
                f"question {number}: {len(answer)} chars, {latency * 1000:.0f} ms", file=sys.stderr
            )
            lines += [f"### `{query}` ({latency * 1000:.0f} ms)", "", fenced(answer), ""]
    return lines


def run(out: Path) -> None:
    tokens = {user: token for token, user in json.loads(TOKENS_FILE.read_text()).items()}
    with tempfile.TemporaryDirectory(prefix="recall-runs-") as tmp:
        server = LocalServer.create(  # only what the server needs: no stray setting recorded
            Path(tmp) / "data",
            Path(tmp) / "server.log",
            tokens,
            ENGINE="embedded",
            INGEST_KEY=secrets.token_hex(16),
            AUTH_TOKENS_FILE=str(TOKENS_FILE),
            INDEX_DEBOUNCE="0.2",
            LOG_LEVEL="WARNING",
        )
        try:
            engine = server.start(START_TIMEOUT).health()["engine"]
            started = time.monotonic()
            seeder = [sys.executable, str(ROOT / "seeds" / "seed.py"), "--url", server.url]
            seeded = subprocess.run(seeder, env=server.env, capture_output=True, text=True)
            if seeded.returncode != 0:
                raise RuntimeError(f"seeding failed: {seeded.stderr.strip()}")
            seed_s = time.monotonic() - started
            posts = seeded.stdout.split()[-4]  # the last line: "posted N times to URL/turns"
            started = time.monotonic()
            server.wait_indexed(*tokens, timeout=INDEX_TIMEOUT)
            index_s = time.monotonic() - started
            print(f"seeded: {posts} posts in {seed_s:.1f}s, index {index_s:.1f}s", file=sys.stderr)
            lines = [
                "# Recall runs: the demo's five questions, the tool's answers verbatim",
                "",
                f"Recorded {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `python examples/"
                f"record_runs.py`. Engine: **{engine}** (from `/healthz`), default settings "
                "(k 3, answers capped at 4,000 characters). A fresh server was seeded by "
                f"`seeds/seed.py` ({posts} posts, one after every turn, {seed_s:.1f} s); the "
                f"index was ready {index_s:.1f} s later. Each heading is a query as an agent "
                "sends it, with the latency of the tool call measured by the client.",
                "",
                *asyncio.run(record(server.url, tokens)),
            ]
        except BaseException:
            print("server log tail:\n" + server.log()[-2000:], file=sys.stderr)
            raise
        finally:
            server.stop()
    out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description="Record the demo's recall runs as Markdown.")
    parser.add_argument("--out", type=Path, default=ROOT / "examples" / "recall-runs.md")
    run(parser.parse_args().out)


if __name__ == "__main__":
    main()
