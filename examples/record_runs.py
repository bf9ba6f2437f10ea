"""Record what the recall tool returns for the demo's five questions, on a freshly seeded server.

    python examples/record_runs.py [--out examples/recall-runs.md]
    python -m examples.record_runs [--out ...]   (the same)

Starts recall_server.py with the embedded engine and the demo tokens, seeded by seeds/seed.py the
way the chat gateway does (devtools.demo.seeded_demo, the same server tests/test_demo.py asks),
sends the short queries an agent sends for each question through an MCP client, and writes every
answer verbatim to a Markdown file. The file holds nothing that changes from run to run (no
recording date, no timings): the same code gives the same file, and
tests/test_demo.py::test_the_committed_recall_runs_record_is_what_a_fresh_run_gives fails when it
is stale. Timings (seeding, index, each call) go to stderr only.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout this script is in
# This checkout's code, not an installed copy: after the README's `pip install .` (not editable),
# `import recall` from examples/ finds the copy in site-packages, which has no examples/tokens.json
# or seeds/ beside it, and which records the code as installed, not as it is now.
sys.path.insert(0, str(ROOT))

from devtools.demo import seeded_demo  # noqa: E402 - after the path above
from devtools.testing import LocalServer  # noqa: E402
from recall.settings import Settings  # noqa: E402

RECORD = ROOT / "examples" / "recall-runs.md"
COMMAND = ".venv/bin/python examples/record_runs.py"
INDEX_TIMEOUT = 180.0  # seconds for seeding and both users' index runs

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


def fenced(text: str) -> str:
    """A code fence longer than any run of backticks in the text."""
    fence = "`" * max(3, 1 + max(map(len, re.findall(r"`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


def header(engine: str) -> list[str]:
    defaults = Settings.model_fields
    k, cap = defaults["recall_k"].default, defaults["max_result_chars"].default
    return [
        "# Recall runs: the demo's five questions, the tool's answers verbatim",
        "",
        f"Regenerate with `{COMMAND}` from the repository root (about 20 s): it seeds a "
        "fresh server with `seeds/seed.py`, one post after every turn as the chat gateway does, "
        f"waits for the index and asks. Engine: **{engine}** (from `/healthz`), default settings "
        f"(k {k}, answers capped at {cap:,} characters). Each heading is a query as an agent "
        "sends it, as the user named under the question. Nothing here changes from run to run "
        "(timings go to the command's stderr), so `tests/test_demo.py` fails when this file "
        "differs from what the code gives now.",
        "",
    ]


async def record(server: LocalServer) -> str:
    """The record's text, from a started, seeded and indexed demo server."""
    lines = header(server.health()["engine"])
    for number, (title, question, user, queries) in enumerate(QUESTIONS, 1):
        lines += [f"## {number}. {title}", "", f"> {question}", "", f"As **{user}**.", ""]
        for query in queries:
            started = time.perf_counter()
            answer = await server.recall(user, query)
            took = (time.perf_counter() - started) * 1000
            print(f"{user} {query!r}: {len(answer)} chars, {took:.0f} ms", file=sys.stderr)
            lines += [f"### `{query}`", "", fenced(answer), ""]
    return "\n".join(lines).rstrip() + "\n"


def run(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="recall-runs-") as tmp:
        started = time.monotonic()
        server = seeded_demo(Path(tmp), timeout=INDEX_TIMEOUT)
        try:
            print(f"seeded and indexed in {time.monotonic() - started:.1f}s", file=sys.stderr)
            text = asyncio.run(record(server))
        except BaseException:
            print("server log tail:\n" + server.log()[-2000:], file=sys.stderr)
            raise
        finally:
            server.stop()
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description="Record the demo's recall runs as Markdown.")
    parser.add_argument("--out", type=Path, default=RECORD)
    run(parser.parse_args().out)


if __name__ == "__main__":
    main()
