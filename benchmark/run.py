"""The recall benchmark: the brief's synthetic history, asked through the real server's MCP tool.

    python -m benchmark.run                       # sizes 1,000 3,000 10,000; embedded (+ funes)
    python -m benchmark.run --sizes 100 --engines embedded --no-save
    python -m benchmark.run --report              # redraw the README table and chart only
    python -m benchmark.run --locomo ../shared/data/locomo-dev.json  # real histories (locomo.py)
    python -m benchmark.run --history clinic --sizes 300  # the held-out history (history_clinic.py)
    python -m benchmark.run --history de es zh --sizes 80 --no-save  # other languages (issue 24)
    python -m benchmark.run --history zh --sizes 80 --env EMBED_MODEL=... --no-save
    python -m benchmark.run --history clinic --sizes 300 --no-save --server-tree ../old \
        --out /tmp/clinic-old.json   # another checkout's server; compare: benchmark/compare.py

Per size and engine: the history (benchmark/history.py) is loaded the way production loads it,
through POST /turns for small sizes and through `recall-server backfill` for large ones; then a
server with k=3 (the default settings) and one with k=8 (and a larger character cap) answer
every question twice, as the long paraphrased question and as the short query an agent sends.
A hit means the expected answer string is in the text the tool returned. Also measured: recall
latency end to end (MCP call) and for the engine alone (in-process), server RSS with the index
cached, time and peak RSS of the backfill, disk per user, and how long a new conversation takes
to become searchable after its 202. funes runs when FUNES_BIN points at a binary.

`--server-tree PATH` starts the server of another checkout (its .venv) and measures it with this
checkout's questions (the engine-alone figures are left out: they would be this checkout's);
`--out F` writes the figures to F and each answer's SHA-256, by run, k, mode and question, to
F.answers.local.json, so that benchmark/compare.py can tell two runs' answers apart.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastmcp import Client

from benchmark import history_clinic, languages
from benchmark.common import (
    INDEX_TIMEOUT,
    answer_record,
    load_by_backfill,
    machine,
    postgres,
    timing,
    tree_rss_mb,
    write_out,
)
from benchmark.history import History, Question, generate
from devtools.testing import ROOT, LocalServer, make_server, server_command
from recall.domain.answers import NOTHING_FOUND
from recall.domain.conversation import parse_conversation, user_dir_name
from recall.files.engines.factory import make_engine
from recall.files.layout import write_conversation
from recall.settings import Settings

RESULTS = ROOT / "benchmark" / "results"
SIZES = (1_000, 3_000, 10_000)
ANSWERS = "answers_"  # the prefix of a result's answer digests (ask)
POST_UP_TO = 1_000  # larger histories go through the backfill command, as an operator would
USER = "bench-user"
CAP = {3: 4_000, 8: 12_000}  # k=8 needs room for eight passages (the brief: raise both together)
# The synthetic histories by name, each with its default question count: "ops" is the brief's;
# "clinic" the held-out one in another domain (issue 9: 60 questions), never tuned on.
# "de", "es", "zh", "zh_school", "ja": other languages (issues 24, 34, benchmark/languages/),
# measured at about 80.
HISTORIES = {
    "ops": (generate, 100),
    "clinic": (history_clinic.generate, 60),
    **{
        code: (languages.generator(code), languages.DEFAULT_QUESTIONS)
        for code in languages.LANGUAGES
    },
}


def disk_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


# "postgres" is the embedded ranking over the PostgreSQL store (STORE=postgres), on a PostgreSQL
# 18 + pgvector the benchmark starts itself (tests/pg.py), one fresh database per measurement.
POSTGRES = "postgres"


def server(
    workdir: Path,
    engine: str,
    k: int,
    database_url: str | None = None,
    env: dict[str, str] | None = None,
    command: tuple[str, ...] | None = None,
) -> LocalServer:
    """A benchmark server; ``env`` adds settings (``--env``, e.g. another EMBED_MODEL);
    ``command`` another checkout's server (server_command)."""
    settings = {"ENGINE": engine, "RECALL_K": str(k), "MAX_RESULT_CHARS": str(CAP[k])}
    settings.update(env or {})
    settings["LOG_LEVEL"] = "WARNING"
    settings.setdefault("INDEX_TIMEOUT", INDEX_TIMEOUT)  # a shared machine: see common.py
    if os.environ.get("FUNES_BIN"):
        settings["FUNES_BIN"] = os.environ["FUNES_BIN"]
    if engine == POSTGRES:
        assert database_url is not None
        settings.update(ENGINE="embedded", STORE="postgres", DATABASE_URL=database_url)
    log_name = f"server-k{k}.log"
    return make_server(workdir, users=[USER], log_name=log_name, command=command, **settings)


def load_into_postgres(
    live: LocalServer, bodies: list[dict[str, Any]], workdir: Path, owner_url: str
) -> dict[str, float]:
    """As an operator moves a large history in: a files store's sources (written as the files
    store writes them; its index is not imported, so none is built), `recall-server import`,
    then the replica's index runs (timed until no run is due)."""
    data_dir = workdir / "files" / "data"
    home = data_dir / user_dir_name(USER)
    started = time.monotonic()
    for body in bodies:
        write_conversation(home, parse_conversation(body))
    figures = {"load_s": round(time.monotonic() - started, 1)}
    command = [*live.command, "import", str(data_dir)]
    env = {**live.env, "DATABASE_URL": owner_url}
    subprocess.run(command, env=env, check=True, capture_output=True)
    figures["import_s"] = round(time.monotonic() - started - figures["load_s"], 1)
    return figures


def load_by_posting(live: LocalServer, history: History) -> dict[str, float]:
    started = time.monotonic()
    for body in history.conversations:
        status, answer = live.post(body)
        if status != 202:
            raise RuntimeError(f"POST /turns answered {status}: {answer}")
    live.wait_indexed(USER, timeout=3_600)
    return {"load_s": round(time.monotonic() - started, 1)}


async def ask(
    live: LocalServer, questions: list[Question], k: int, label: str = ""
) -> dict[str, Any]:
    """Every question, long and short, through one MCP session with the user's token; the
    figures' names end in ``label`` (the month questions: "_month")."""
    figures: dict[str, Any] = {}
    misses: list[dict[str, str]] = []
    answers: dict[str, list[dict[str, Any]]] = {}
    async with Client(f"{live.url}/mcp", auth=live.tokens[USER]) as client:
        for mode in ("long", "short"):
            hits, nothing, latencies = 0, 0, []
            for q in questions:
                query = q.question if mode == "long" else q.short_query
                started = time.perf_counter()
                result = await client.call_tool("recall_my_conversations", {"query": query})
                latencies.append((time.perf_counter() - started) * 1000)
                text = result.content[0].text  # type: ignore[union-attr]
                answers.setdefault(mode, []).append(answer_record(text, query=query))
                nothing += text == NOTHING_FOUND  # a miss at every k: the floor, not the ranking
                if q.answer in text:
                    hits += 1
                else:
                    # what ranked above the right passage: each returned hit's date and opening
                    blocks = [block.strip().splitlines() for block in text.split("\n---")]
                    headers = [" ".join(lines[:2])[:160] for lines in blocks if lines]
                    misses.append(
                        {"k": str(k), "mode": mode, "query": query, "answer": q.answer}
                        | {"ranked_above": " | ".join(headers)}
                    )
            figures[f"hit@{k}_{mode}{label}"] = round(hits / len(questions), 3)
            figures[f"nothing@{k}_{mode}{label}"] = nothing
            figures[f"e2e_k{k}_{mode}{label}"] = timing(latencies)
    figures[f"misses_k{k}{label}"] = misses
    figures[f"{ANSWERS}k{k}{label}"] = answers  # main takes them out of the figures
    return figures


async def freshness(live: LocalServer) -> float:
    """Seconds from a new conversation's 202 until the tool finds it (default debounce)."""
    marker = f"FR-{secrets.randbelow(10**6):06d}"
    texts = [f"Open a ticket {marker} for the leaking valve.", f"Ticket {marker} is open."] * 3
    now = datetime.now(UTC).replace(microsecond=0)
    turns = [
        {
            "role": ("user", "assistant")[n % 2],
            "text": text,
            "ts": (now + timedelta(seconds=n)).isoformat().replace("+00:00", "Z"),
        }
        for n, text in enumerate(texts)
    ]
    body = {"user": USER, "conversation_id": f"fresh-{marker}", "turns": turns}
    started = time.monotonic()
    assert live.post(body)[0] == 202
    # Found in a passage: an answer naming it as never mentioned holds the marker too.
    while f"Ticket {marker} is open." not in await live.recall(USER, marker):
        if time.monotonic() - started > 120:
            return float("inf")
        await asyncio.sleep(0.1)
    return round(time.monotonic() - started, 2)


async def engine_alone(data_dir: Path, engine: str, questions: list[Question]) -> dict[str, Any]:
    """The engine in this process, no HTTP: load time and recall latency (index cached)."""
    started = time.perf_counter()
    searcher = make_engine(Settings(engine=engine, funes_bin=os.environ.get("FUNES_BIN")))
    load_s = time.perf_counter() - started
    home = data_dir / user_dir_name(USER)
    figures = await timed_recalls(lambda query: searcher.recall(home, query), questions)
    return {"engine_load_s": round(load_s, 2), **figures}


async def timed_recalls(
    recall: Callable[[str], Awaitable[Any]], questions: list[Question]
) -> dict[str, Any]:
    """Every question, long and short, through ``recall`` after one warm-up call (it loads and
    caches what a first recall needs): the latency by mode."""
    await recall("warm up")
    figures: dict[str, Any] = {}
    for mode in ("long", "short"):
        latencies = []
        for q in questions:
            started = time.perf_counter()
            await recall(q.question if mode == "long" else q.short_query)
            latencies.append((time.perf_counter() - started) * 1000)
        figures[f"engine_{mode}"] = timing(latencies)
    return figures


def measure(
    size: int,
    engine: str,
    questions: int | None = None,
    seed: int = 7,
    history_name: str = "ops",
    env: dict[str, str] | None = None,
    server_tree: Path | None = None,
    engine_alone_too: bool = True,
) -> dict[str, Any]:
    """One history on one engine; ``env`` goes into the servers' environment (and should be in
    this process's too, for the engine-alone figures: ``main`` puts it there); ``server_tree``:
    the server of that checkout, not this one's (no engine-alone figures then);
    ``engine_alone_too`` False: the figures through the tool only (a quality check)."""
    make_history, default_questions = HISTORIES[history_name]
    history = make_history(size, seed=seed, questions=questions or default_questions)
    result: dict[str, Any] = {"size": size, "engine": engine, "history": history_name}
    if env:
        result["env"] = dict(env)
    result["questions"] = len(history.questions)
    result["month_questions"] = len(history.month_questions)
    database = postgres().new_database() if engine == POSTGRES else None
    command = server_command(server_tree) if server_tree else None
    if server_tree:
        result["server"] = str(server_tree)
    with tempfile.TemporaryDirectory(prefix=f"bench-{engine}-{size}-") as tmp:
        workdir = Path(tmp)
        for k in (3, 8):
            url = database.app_url if database else None
            live = server(workdir, engine, k, url, env, command)
            if k == 3 and size > POST_UP_TO:
                if database is None:
                    result.update(load_by_backfill(live, history.conversations, workdir))
                else:
                    loaded = load_into_postgres(
                        live, history.conversations, workdir, database.owner_url
                    )
                    result.update(loaded)
            with live.start(timeout=120):
                if k == 3 and size <= POST_UP_TO:
                    result.update(load_by_posting(live, history))
                elif k == 3 and database is not None:
                    started = time.monotonic()
                    live.wait_indexed(USER, timeout=7_200)
                    result["index_s"] = round(time.monotonic() - started, 1)
                live.wait_no_index_run()  # else a search may say "still being indexed"
                result.update(asyncio.run(ask(live, history.questions, k)))
                if history.month_questions:  # a month named as the subject (issue 23)
                    result.update(asyncio.run(ask(live, history.month_questions, k, "_month")))
                if k == 3:
                    result["server_rss_mb"] = round(tree_rss_mb(live.process.pid))  # type: ignore[union-attr]
                    result["disk_per_user_mb"] = (
                        round(disk_mb(live.home(USER)), 1)
                        if database is None
                        else database_mb(database.superuser_url)
                    )
                    result["searchable_after_s"] = asyncio.run(freshness(live))
        if server_tree or not engine_alone_too:
            pass  # not asked for; with server_tree they would measure this checkout instead
        elif database is None:
            result.update(asyncio.run(engine_alone(workdir / "data", engine, history.questions)))
        else:
            result.update(asyncio.run(store_alone(database.app_url, history.questions)))
    return result


def database_mb(superuser_url: str) -> float:
    """What the recall tables take in the database (one user's history), indexes included."""
    import psycopg

    from recall.pg.schema import USER_TABLES

    with psycopg.connect(superuser_url) as conn:
        total = sum(
            conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0]
            for table in USER_TABLES
        )
    return round(total / 2**20, 1)


async def store_alone(database_url: str, questions: list[Question]) -> dict[str, Any]:
    """The PostgreSQL store's recall in this process, no HTTP (as engine_alone)."""
    from recall.pg.store import from_settings

    started = time.perf_counter()
    store = from_settings(
        Settings(store="postgres", database_url=database_url, index_debounce=3600)
    )
    await store.start()
    load_s = time.perf_counter() - started
    user = user_dir_name(USER)
    try:
        figures = await timed_recalls(lambda query: store.recall(user, query), questions)
    finally:
        await store.close()
    return {"engine_load_s": round(load_s, 2), **figures}


def print_result(result: dict[str, Any]) -> None:
    shown = {k: v for k, v in result.items() if not k.startswith("misses")}
    print(json.dumps(shown, indent=1))
    for key in (key for key in result if key.startswith("misses_k")):
        for miss in result[key]:
            print(
                f"  miss k={miss['k']} {miss['mode']}: {miss['query']!r} wants {miss['answer']!r}"
            )
            print(f"    returned: {miss['ranked_above'][:300]}")


def run_locomo(path: Path, engine: str, *, post: bool, save: bool) -> None:
    from benchmark import locomo

    started = time.monotonic()
    figures, misses = locomo.measure_locomo(path, engine, post=post)
    locomo.stamp(figures, started)
    locomo.print_figures(figures, misses)
    if save:
        locomo.save(figures, misses, RESULTS)


def env_setting(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the ``--env`` option) as a pair."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--env wants KEY=VALUE, got {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> int:
    from benchmark import locomo

    parser = argparse.ArgumentParser(description="Run the recall benchmark.")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument(
        "--engines", nargs="+", default=None,
        help="default: embedded (+ funes); postgres: the embedded ranking on STORE=postgres",
    )  # fmt: skip
    parser.add_argument("--questions", type=int, default=None, help="default: 100 (clinic: 60)")
    parser.add_argument(
        "--history", choices=sorted(HISTORIES), nargs="+", default=["ops"],
        help="synthetic histories: ops (the brief's), clinic (held out, another domain), "
        "de es zh zh_school ja (other languages)",
    )  # fmt: skip
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", type=env_setting,
        help="a setting for the benchmark's servers (and this process), e.g. EMBED_MODEL=...",
    )  # fmt: skip
    parser.add_argument("--no-save", action="store_true", help="print only; keep results/ as is")
    parser.add_argument("--report", action="store_true", help="only redraw table and chart")
    parser.add_argument(
        "--locomo", type=Path, nargs="?", const=locomo.DEFAULT_DATA, metavar="PATH",
        help=f"run the LoCoMo benchmark on this file instead (default {locomo.DEFAULT_DATA})",
    )  # fmt: skip
    parser.add_argument("--post", action="store_true", help="LoCoMo: load by POST /turns")
    parser.add_argument(
        "--server-tree", type=Path,
        help="start the server of this checkout (its .venv), e.g. an older version; with --no-save",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path,
        help="also write the figures to this file and each answer's SHA-256 to "
        "OUT.answers.local.json (compare two runs: python -m benchmark.compare A B)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    from benchmark.report import hits_table, write_report

    if args.report:
        write_report(RESULTS)
        return 0
    engines = args.engines or ["embedded", *(["funes"] if os.environ.get("FUNES_BIN") else [])]
    env = dict(args.env)
    if env and not args.no_save:
        parser.error("--env measures another setting, not the record: add --no-save")
    if args.server_tree and not args.no_save:
        parser.error("--server-tree measures another checkout, not the record: add --no-save")
    os.environ.update(env)  # the engine-alone figures build their settings in this process
    if args.locomo:
        for engine in engines:
            run_locomo(args.locomo, engine, post=args.post, save=not args.no_save)
        if not args.no_save:
            write_report(RESULTS, synthetic_too=False)
        return 0
    results, answers = [], {}
    for history_name, engine, size in itertools.product(args.history, engines, args.sizes):
        started = time.monotonic()
        result = measure(
            size, engine, args.questions, history_name=history_name, env=env,
            server_tree=args.server_tree,
        )  # fmt: skip
        for key in [key for key in result if key.startswith(ANSWERS)]:  # by run and k
            answers[f"{history_name}-{size}-{engine} {key[len(ANSWERS) :]}"] = result.pop(key)
        result["machine"] = machine()
        result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        result["wall_s"] = round(time.monotonic() - started)
        result["date"] = time.strftime("%Y-%m-%d", time.gmtime())
        print_result(result)
        results.append(result)
        if not args.no_save:
            RESULTS.mkdir(parents=True, exist_ok=True)
            name = engine if history_name == "ops" else f"{engine}-{history_name}"
            path = RESULTS / f"{name}-{size}.json"
            path.write_text(json.dumps(result, indent=1) + "\n")
    print("\n" + hits_table(results, env))  # one table over every run above
    if args.out:
        write_out(args.out, results, answers)
    if not args.no_save:
        write_report(RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
