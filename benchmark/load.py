"""Load: concurrent gateway posts and MCP recalls against one server, with figures (issue 12).

    python -m benchmark.load                                  # every phase, 60 s each
    python -m benchmark.load --phase mixed --duration 600     # the 10-minute RSS check
    python -m benchmark.load --url http://127.0.0.1:8000 --ingest-key KEY --tokens tokens.json

Bounded: loopback only (a non-loopback URL is refused), every phase stops after `--duration`
seconds. By default it starts its own server (devtools/testing.py, embedded engine, a temporary
DATA_DIR, generated key and tokens) so a run is reproducible; `--url` targets a running one.

Phases:
- ingest: `--ingest-concurrency` workers post six-turn conversations (benchmark/history.py's
  synthetic bodies, a new conversation every post, spread over `--ingest-users` users) to
  POST /turns for the duration, back to back, or paced at `--rate` requests/s in all.
- recall: `--users` users with `--conversations` conversations each (loaded by the
  `recall-server backfill` command when the server is ours, else through POST /turns), then
  `--recall-concurrency` MCP callers (a real fastmcp Client each, reused, with the user's bearer
  token) call the tool back to back with the history's short queries.
- mixed: both at once on new users, so index runs lag behind the posts: shows that ingest keeps
  accepting, and samples the lag (/healthz "indexing", and /metrics' index-wait gauges when the
  server has /metrics) until indexing has caught up.
- saturate (own server only): one recall slot and a short RECALL_TIMEOUT under the same callers:
  every caller must be answered within about RECALL_TIMEOUT, with the fail-soft answer if need be.
- rounds (not part of "all"): `--rounds` rounds of `--round-posts` posts, each followed by the
  index runs catching up; server RSS at each round's peak and once indexed (index runs take
  memory while they embed and give it back, so RSS once indexed is what must stay flat).

Printed per phase: requests/s, p50/p99/max latency, answers by status (and by recall outcome),
errors, server RSS over time (min/max/first/last, flat within 10% after the warm-up or not), CPU
seconds of the server and of this client, and the load average. Latency is measured by this
client, which shares the machine's cores with the server (and, here, with other work).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import psutil
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from benchmark.common import machine, percentile
from benchmark.history import generate
from devtools.testing import ROOT, LocalServer, make_server
from recall.domain.answers import OUTCOMES
from recall.domain.conversation import user_dir_name
from recall.metrics import PREFIX

PHASES = ("ingest", "recall", "mixed", "saturate")
# Gauges of /metrics that tell how far indexing lags (printed without PREFIX).
LAG_METRIC = re.compile(r"^(\w*index\w*(?:wait|lag|pending|oldest)\w*)(\{[^}]*\})?\s+(\S+)$")
# The server's own histogram of accepted posts: its latency without this client's share.
INGEST_BUCKET = re.compile(
    rf'^{PREFIX}ingest_duration_seconds_bucket{{(?=[^}}]*status="202")[^}}]*le="([^"]+)"[^}}]*}}'
    r"\s+(\S+)$"
)
SERVER_SIDE_MS = (10, 50, 100, 250)  # the bounds whose share of posts is printed
SATURATE_SETTINGS = {"RECALL_CONCURRENCY": "1", "RECALL_TIMEOUT": "0.25"}
INGEST_BODIES = 2_000  # distinct synthetic bodies, reused with a new user and conversation id


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


# --- measurements ------------------------------------------------------------------------------


@dataclass
class Calls:
    """What one kind of call did: latencies of the answered ones, answers by kind, errors."""

    name: str
    latencies_ms: list[float] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)  # HTTP status or recall outcome
    errors: Counter[str] = field(default_factory=Counter)  # no answer at all, by exception
    started: float = 0.0
    ended: float = 0.0

    by_answer: dict[str, list[float]] = field(default_factory=dict)

    def record(self, started: float, answer: str) -> None:
        latency = (time.perf_counter() - started) * 1000
        self.latencies_ms.append(latency)
        self.by_answer.setdefault(answer, []).append(latency)
        self.answers[answer] += 1

    def figures(self) -> dict[str, Any]:
        seconds = max(self.ended - self.started, 1e-9)
        values = self.latencies_ms
        return {
            "calls": len(values),
            "per_s": round(len(values) / seconds, 1),
            "p50_ms": round(percentile(values, 0.50), 1),
            "p99_ms": round(percentile(values, 0.99), 1),
            "max_ms": round(max(values, default=0.0), 1),
            "answers": dict(sorted(self.answers.items())),
            "errors": dict(self.errors),
            "by_answer_p50_p99_max_ms": {
                answer: [
                    round(percentile(v, 0.5), 1),
                    round(percentile(v, 0.99), 1),
                    round(max(v), 1),
                ]
                for answer, v in sorted(self.by_answer.items())
            },
        }

    def line(self) -> str:
        f = self.figures()
        return (
            f"{self.name}: {f['calls']} answered, {f['per_s']}/s, p50 {f['p50_ms']} ms, "
            f"p99 {f['p99_ms']} ms, max {f['max_ms']} ms; answers {f['answers']}; "
            f"errors {f['errors'] or 'none'}"
        )


@dataclass
class Sampler:
    """Server RSS, load average and indexing lag, every `every` seconds during a phase."""

    url: str
    pid: int | None
    every: float
    metrics_token: str | None = None  # the server's METRICS_TOKEN, when it guards /metrics
    rss_mb: list[tuple[float, float]] = field(default_factory=list)  # the server process
    workers_mb: list[tuple[float, float]] = field(default_factory=list)  # its index workers
    load: list[float] = field(default_factory=list)
    indexing: list[tuple[float, int]] = field(default_factory=list)
    lag_metrics: list[tuple[float, str]] = field(default_factory=list)
    has_metrics: bool | None = None  # unknown until asked once

    async def run(self, http: httpx2.AsyncClient, stop: asyncio.Event) -> None:
        started = time.monotonic()
        while True:
            at = round(time.monotonic() - started, 1)
            if (rss := rss_mb(self.pid)) is not None:
                self.rss_mb.append((at, rss[0]))
                self.workers_mb.append((at, rss[1]))
            self.load.append(os.getloadavg()[0])
            await self.sample_lag(http, at)
            try:
                await asyncio.wait_for(stop.wait(), self.every)
                return
            except TimeoutError:
                continue

    async def sample_lag(self, http: httpx2.AsyncClient, at: float) -> None:
        try:
            health = (await http.get(f"{self.url}/healthz", timeout=10)).json()
            # null: the store did not say within /healthz's bound (a busy or absent database)
            if (indexing := health.get("indexing", -1)) is not None:
                self.indexing.append((at, int(indexing)))
        except (httpx2.HTTPError, ValueError):
            pass
        if self.has_metrics is False:
            return
        response = await get_metrics(http, self.url, self.metrics_token)
        if response is None:
            return
        if response.status_code == 401:  # there, but guarded: say so rather than "absent"
            self.lag_metrics.append((at, "401: /metrics wants --metrics-token"))
            self.has_metrics = False
            return
        self.has_metrics = response.status_code == 200
        if self.has_metrics:
            found = [  # "index_waiting_users 63": short names, whole numbers
                f"{m.group(1).removeprefix(PREFIX)}{m.group(2) or ''} {float(m.group(3)):.0f}"
                for line in response.text.splitlines()
                if (m := LAG_METRIC.match(line))
            ]
            self.lag_metrics.append((at, "; ".join(found) or "(no index-wait gauge)"))

    def report(self, warmup: float) -> dict[str, Any]:
        figures: dict[str, Any] = {
            "load_avg_max": round(max(self.load, default=0.0), 2),
            "indexing": self.indexing,
        }
        if self.rss_mb:
            values = [mb for _, mb in self.rss_mb]
            steady = [mb for at, mb in self.rss_mb if at >= warmup] or values
            figures["rss_mb"] = {
                "first": round(values[0]),
                "last": round(values[-1]),
                "min": round(min(values)),
                "max": round(max(values)),
                "after_warmup_min": round(min(steady)),
                "after_warmup_max": round(max(steady)),
                "flat_within_10pct": max(steady) <= 1.10 * min(steady),
                "samples": len(values),
            }
            figures["rss_series"] = [(at, round(mb)) for at, mb in self.rss_mb]
            workers = [mb for _, mb in self.workers_mb]
            figures["workers_rss_mb"] = {"min": round(min(workers)), "max": round(max(workers))}
            figures["workers_rss_series"] = [(at, round(mb)) for at, mb in self.workers_mb]
        if self.has_metrics is False and not self.lag_metrics:
            figures["metrics"] = "absent"
        else:
            figures["metrics"] = self.lag_metrics or "not sampled"
        return figures


async def get_metrics(
    http: httpx2.AsyncClient, url: str, token: str | None
) -> httpx2.Response | None:
    """GET /metrics, with the server's METRICS_TOKEN when it has one; None when unreachable."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        return await http.get(f"{url}/metrics", headers=headers, timeout=10)
    except httpx2.HTTPError:
        return None


def server_and_children(
    pid: int | None, measure: Callable[[psutil.Process], float]
) -> tuple[float, float] | None:
    """``measure`` of the server process, and summed over its children (the embedded engine's
    index workers, or funes processes); None when the server cannot be seen."""
    if pid is None:
        return None
    try:
        process = psutil.Process(pid)
        server = measure(process)
    except psutil.Error:
        return None
    children = 0.0
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # it may end as we look
            children += measure(child)
    return server, children


def rss_mb(pid: int | None) -> tuple[float, float] | None:
    """RSS of the server process, and of its children in all, in MB."""
    return server_and_children(pid, lambda p: p.memory_info().rss / 2**20)


def total_rss_mb(pid: int | None) -> float:
    """The server's RSS with its children's: its whole footprint."""
    rss = rss_mb(pid)
    return sum(rss) if rss is not None else 0.0


def cpu_seconds(pid: int | None) -> tuple[float, float] | None:
    """CPU seconds of the server process, and of its children, the ended ones included."""
    spent = server_and_children(pid, lambda p: sum(p.cpu_times()[:2]))  # user + system
    if spent is None:
        return None
    with contextlib.suppress(psutil.Error):  # children that ended and were reaped
        reaped = psutil.Process(pid).cpu_times()
        return spent[0], spent[1] + reaped.children_user + reaped.children_system
    return spent


def listening_pid(url: str) -> int | None:
    """The process that listens on the URL's port (for RSS), when this user may see it."""
    port = urlsplit(url).port or 80
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return conn.pid
    except psutil.Error:
        pass
    return None


def thin(series: list[tuple[float, Any]], points: int = 16) -> str:
    """A series as `t=..s value` pairs, at most `points` of them, evenly spaced."""
    if not series:
        return "(none)"
    step = max(1, len(series) // points)
    shown = series[::step]
    if shown[-1] is not series[-1]:
        shown.append(series[-1])
    return ", ".join(f"{at:.0f}s {value:.0f}" if isinstance(value, float) else f"{at:.0f}s {value}"
                     for at, value in shown)  # fmt: skip


# --- the target --------------------------------------------------------------------------------


@dataclass
class Target:
    url: str
    ingest_key: str
    tokens: dict[str, str]  # user -> bearer token
    pid: int | None
    recall_timeout: float | None  # known only for our own server


def freeze_own_heap() -> None:
    """Keep this client's own garbage collector from pausing the calls it times: a full
    collection over its thousands of prepared bodies stopped every call in flight for up to
    80 ms (three times a minute), which this client then reported as the server's latency."""
    gc.collect()
    gc.freeze()


def ingest_bodies(seed: int = 99) -> list[dict[str, Any]]:
    return generate(INGEST_BODIES, seed=seed, questions=1).conversations


def user_history(index: int, size: int) -> tuple[list[dict[str, Any]], list[str]]:
    """User `load-user-<index>`'s bodies and short queries: a history of its own (own seed)."""
    history = generate(size, seed=7 + index, questions=min(100, size))
    user = f"load-user-{index}"
    bodies = [{**body, "user": user} for body in history.conversations]
    return bodies, [q.short_query for q in history.questions]


def backfill(server: LocalServer, bodies: list[dict[str, Any]], workdir: Path) -> float:
    """Load the bodies with `recall-server backfill` (the server must be stopped); seconds."""
    source = workdir / "prefill.jsonl"
    source.write_text("".join(json.dumps(body) + "\n" for body in bodies))
    started = time.monotonic()
    command = [sys.executable, str(ROOT / "recall_server.py"), "backfill", str(source)]
    subprocess.run(command, env=server.env, check=True, stderr=subprocess.DEVNULL)
    source.unlink()
    return time.monotonic() - started


async def post_all(target: Target, bodies: list[dict[str, Any]], concurrency: int = 8) -> None:
    """Load the bodies through POST /turns (a server that is not ours), then wait for indexing."""
    queue = iter(bodies)
    async with httpx2.AsyncClient(headers={"x-ingest-key": target.ingest_key}) as http:

        async def worker() -> None:
            for body in queue:
                response = await http.post(f"{target.url}/turns", json=body, timeout=60)
                if response.status_code != 202:
                    raise SystemExit(f"prefill: POST /turns answered {response.status_code}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        await drain(http, target.url, timeout=3_600)


async def drain(http: httpx2.AsyncClient, url: str, timeout: float) -> float | None:
    """Seconds until /healthz says no index run is due or going on; None if not within timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if (await http.get(f"{url}/healthz", timeout=10)).json().get("indexing") == 0:
            return round(time.monotonic() - started, 1)
        await asyncio.sleep(0.5)
    return None


# --- the callers -------------------------------------------------------------------------------


class Poster:
    """POST /turns on one keep-alive connection, for as little of the client's CPU as a post
    can take. The loader shares the server's cores: httpx spent about 2 ms of CPU a post, as
    much as the server itself, and on 2 cores that time is taken from the server it measures
    (``--client httpx`` keeps the old way, for comparison)."""

    def __init__(self, url: str, ingest_key: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.head = (
            f"POST /turns HTTP/1.1\r\nhost: {parts.netloc}\r\nx-ingest-key: {ingest_key}\r\n"
            "content-type: application/json\r\ncontent-length: %d\r\n\r\n"
        )
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, body: bytes) -> int:
        """The answer's status; OSError (the connection then opens anew) when there is none."""
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        try:
            writer.write((self.head % len(body)).encode() + body)
            status = int((await reader.readline()).split()[1])
            length, close = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
                elif name.lower() == b"connection":
                    close = value.strip().lower() == b"close"
            await reader.readexactly(length)
        except (OSError, IndexError, ValueError, asyncio.IncompleteReadError) as exc:
            writer.close()
            self.streams = None
            raise OSError(f"no answer: {type(exc).__name__}") from exc
        if close:
            writer.close()
            self.streams = None
        return status

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()


async def ingest_worker(
    http: httpx2.AsyncClient | Poster,
    target: Target,
    bodies: list[dict[str, Any]],
    users: list[str],
    ticket: Callable[[], int],
    rate: float | None,
    t0: float,
    deadline: float,
    calls: Calls,
) -> None:
    while True:
        n = ticket()
        # Paced: each post has its slot in time, and its latency counts from that slot (a late
        # server delays the posts behind it, as it would delay a gateway).
        planned = t0 + n / rate if rate else None
        if planned is not None and (wait := planned - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        if time.perf_counter() >= deadline:
            return
        body = {
            **bodies[n % len(bodies)],
            "user": users[n % len(users)],
            "conversation_id": f"L{n}",
        }
        started = planned or time.perf_counter()
        try:
            if isinstance(http, Poster):
                status = await asyncio.wait_for(http.post(json.dumps(body).encode()), 30)
            else:
                status = (await http.post(f"{target.url}/turns", json=body, timeout=30)).status_code
            calls.record(started, str(status))
        except (httpx2.HTTPError, OSError, TimeoutError) as exc:
            calls.errors[type(exc).__name__] += 1


async def recall_caller(
    target: Target,
    user: str,
    queries: list[str],
    offset: int,
    deadline: float,
    calls: Calls,
    statuses: Counter[str],
    think: float,
) -> None:
    async def count(response: httpx2.Response) -> None:
        statuses[str(response.status_code)] += 1

    def factory(**kwargs: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(event_hooks={"response": [count]}, **kwargs)

    transport = StreamableHttpTransport(
        f"{target.url}/mcp", auth=target.tokens[user], httpx_client_factory=factory
    )
    try:
        async with Client(transport, timeout=60) as client:
            for n in itertools.count(offset):
                if time.perf_counter() >= deadline:
                    return
                started = time.perf_counter()
                try:
                    result = await client.call_tool(
                        "recall_my_conversations", {"query": queries[n % len(queries)]}
                    )
                    text = result.content[0].text  # type: ignore[union-attr]
                    calls.record(started, OUTCOMES.get(text, "passages"))
                except Exception as exc:  # counted, and the caller goes on
                    calls.errors[type(exc).__name__] += 1
                if think:  # an agent reads the answer before it asks again
                    await asyncio.sleep(think)
    except Exception as exc:  # the session itself failed
        calls.errors[f"session {type(exc).__name__}"] += 1


async def ingest_buckets(
    http: httpx2.AsyncClient, url: str, token: str | None
) -> dict[float, float] | None:
    """The server's count of 202 posts at or under each latency bound (cumulative since it
    started), from its /metrics; None without one."""
    response = await get_metrics(http, url, token)
    if response is None or response.status_code != 200:
        return None
    return {
        float(m.group(1)): float(m.group(2))
        for line in response.text.splitlines()
        if (m := INGEST_BUCKET.match(line))
    }


def server_side_shares(
    before: dict[float, float] | None, after: dict[float, float] | None
) -> dict[str, float] | None:
    """Of the posts accepted between two snapshots, the share the server answered within each
    SERVER_SIDE_MS bound (its own clock: no client queueing in it)."""
    if before is None or not after or not after.get(float("inf")):
        return None
    total = after[float("inf")] - before.get(float("inf"), 0.0)
    if total <= 0:
        return None
    return {
        str(ms): round((after[ms / 1000] - before.get(ms / 1000, 0.0)) / total, 4)
        for ms in SERVER_SIDE_MS
        if ms / 1000 in after
    }


async def run_phase(
    name: str,
    target: Target,
    args: argparse.Namespace,
    *,
    ingest_users: list[str] | None = None,
    recall_users: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """One phase: the callers for the duration, the sampler alongside; its figures, printed."""
    sampler = Sampler(target.url, target.pid, args.sample_every, args.metrics_token)
    ingest, recall = Calls("ingest POST /turns"), Calls("recall (MCP tool call)")
    mcp_statuses: Counter[str] = Counter()
    stop = asyncio.Event()
    cpu_server, cpu_client = cpu_seconds(target.pid), time.process_time()
    limits = httpx2.Limits(max_connections=args.ingest_concurrency + 4)
    async with httpx2.AsyncClient(
        headers={"x-ingest-key": target.ingest_key}, limits=limits
    ) as http:
        buckets_before = await ingest_buckets(http, target.url, args.metrics_token)
        sampling = asyncio.create_task(sampler.run(http, stop))
        tasks = []
        bodies = ingest_bodies() if ingest_users else []
        freeze_own_heap()
        t0 = time.perf_counter()
        deadline = t0 + args.duration
        posters = [
            http if args.client == "httpx" else Poster(target.url, target.ingest_key)
            for _ in range(args.ingest_concurrency if ingest_users else 0)
        ]
        if ingest_users:
            counter = itertools.count()
            tasks += [
                ingest_worker(
                    poster, target, bodies, ingest_users, counter.__next__, args.rate, t0,
                    deadline, ingest,
                )
                for poster in posters
            ]  # fmt: skip
        if recall_users:
            users = list(recall_users)
            for caller in range(args.recall_concurrency):
                user = users[caller % len(users)]
                tasks.append(
                    recall_caller(
                        target,
                        user,
                        recall_users[user],
                        caller * 7,
                        deadline,
                        recall,
                        mcp_statuses,
                        args.think,
                    )
                )
        ingest.started = recall.started = t0
        await asyncio.gather(*tasks)
        ingest.ended = recall.ended = time.perf_counter()
        for poster in posters:
            if isinstance(poster, Poster):
                poster.close()
        buckets_after = await ingest_buckets(http, target.url, args.metrics_token)
        caught_up = None
        if name == "mixed":  # keep sampling until the index runs have caught up with the posts
            caught_up = await drain(http, target.url, timeout=args.drain_timeout)
        stop.set()
        await sampling
    cpu_after = cpu_seconds(target.pid)
    figures: dict[str, Any] = {"phase": name, "duration_s": args.duration}
    if ingest_users:
        figures["ingest"] = ingest.figures() | {
            "workers": args.ingest_concurrency,
            "client": args.client,
            "users": len(ingest_users),
            "rate": args.rate,
            "server_side_within_ms": server_side_shares(buckets_before, buckets_after),
        }
    if recall_users:
        figures["recall"] = recall.figures() | {
            "callers": args.recall_concurrency,
            "think_s": args.think,
            "mcp_http_statuses": dict(mcp_statuses),
        }
        if target.recall_timeout is not None:
            figures["recall"]["recall_timeout_s"] = target.recall_timeout
    if caught_up is not None or name == "mixed":
        figures["indexing_caught_up_after_s"] = caught_up
    server_cpu = workers_cpu = None
    if cpu_after is not None and cpu_server is not None:
        spent = zip(cpu_after, cpu_server, strict=True)
        server_cpu, workers_cpu = (round(after - before, 1) for after, before in spent)
    figures["cpu_s"] = {
        "server": server_cpu,
        "index_workers": workers_cpu,
        "this_client": round(time.process_time() - cpu_client, 1),
    }
    figures.update(sampler.report(warmup=args.warmup))
    statuses = Counter(ingest.answers) + mcp_statuses
    figures["responses_5xx"] = sum(n for status, n in statuses.items() if status.startswith("5"))
    print_phase(figures, ingest if ingest_users else None, recall if recall_users else None)
    return figures


def print_phase(figures: dict[str, Any], posts: Calls | None, recalls: Calls | None) -> None:
    setup = []
    if ingest := figures.get("ingest"):
        paced = f", paced at {ingest['rate']:g}/s" if ingest["rate"] else ", back to back"
        setup.append(
            f"{ingest['workers']} posting workers ({ingest['client']}) "
            f"to {ingest['users']} users{paced}"
        )
    if recall := figures.get("recall"):
        setup.append(f"{recall['callers']} MCP callers, {recall['think_s']:g} s between calls")
    print(f"\n== {figures['phase']} ({figures['duration_s']:g} s; {'; '.join(setup)})")
    for calls in (posts, recalls):
        if calls is not None:
            print("  " + calls.line())
    if ingest and (shares := ingest.get("server_side_within_ms")):
        within = ", ".join(f"{share:.1%} within {ms} ms" for ms, share in shares.items())
        print(f"  the same posts by the server's own clock (/metrics): {within}")
    if recalls is not None:
        print(f"  MCP HTTP statuses: {figures['recall']['mcp_http_statuses']}")
        if (timeout := figures["recall"].get("recall_timeout_s")) is not None:
            print(
                f"  RECALL_TIMEOUT {timeout:g} s; slowest answer {recalls.figures()['max_ms']} ms"
            )
        print(f"  p50 / p99 / max ms by answer: {figures['recall']['by_answer_p50_p99_max_ms']}")
    print(f"  5xx responses: {figures['responses_5xx']}")
    if rss := figures.get("rss_mb"):
        print(
            f"  server RSS MB: first {rss['first']}, last {rss['last']}, min {rss['min']}, "
            f"max {rss['max']}; after warm-up {rss['after_warmup_min']}-{rss['after_warmup_max']}"
            f", flat within 10%: {rss['flat_within_10pct']}"
        )
        print(f"  server RSS MB over time: {thin(figures['rss_series'])}")
        workers = figures["workers_rss_mb"]
        print(
            f"  index workers' RSS MB in all (0: none running): min {workers['min']}, max "
            f"{workers['max']}; over time: {thin(figures['workers_rss_series'])}"
        )
    print(f"  CPU seconds: server {figures['cpu_s']['server']}, its index workers "
          f"{figures['cpu_s']['index_workers']}, this client "
          f"{figures['cpu_s']['this_client']} (they share the machine's cores)")  # fmt: skip
    print(f"  load average (1 min), highest seen: {figures['load_avg_max']}")
    if figures["phase"] in ("ingest", "mixed"):
        print(f"  users with an index run due or going on (/healthz): {thin(figures['indexing'])}")
        metrics = figures["metrics"]
        if metrics == "absent":
            print("  /metrics: not on this server (index-wait gauges not sampled)")
        elif isinstance(metrics, list):
            print(f"  /metrics index-wait gauges: {thin(metrics, 8)}")
    if "indexing_caught_up_after_s" in figures:
        print(f"  indexing caught up {figures['indexing_caught_up_after_s']} s after the load")


# --- main --------------------------------------------------------------------------------------


def own_server(
    workdir: Path, users: list[str], args: argparse.Namespace, **extra: str
) -> LocalServer:
    settings = {"ENGINE": "embedded", **dict(s.split("=", 1) for s in args.server_env), **extra}
    args.metrics_token = args.metrics_token or settings.get("METRICS_TOKEN")
    return make_server(workdir, users=users, **settings)


def prefill_own(
    workdir: Path, server: LocalServer, args: argparse.Namespace
) -> dict[str, list[str]]:
    """Each recall user's history, backfilled once per workdir; user -> short queries."""
    marker = workdir / "prefilled.json"
    wanted = {"users": args.users, "conversations": args.conversations}
    queries, bodies = {}, []
    for index in range(args.users):
        user_bodies, user_queries = user_history(index, args.conversations)
        queries[f"load-user-{index}"] = user_queries
        bodies += user_bodies
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        # Only the histories are reused: the users an earlier run posted to would be indexed
        # (or still be) at this server's start, under this run's load.
        keep = {user_dir_name(user) for user in queries}
        for home in (workdir / "data").iterdir():
            if home.is_dir() and home.name not in keep and not home.name.startswith("_"):
                shutil.rmtree(home)
        print(f"prefill: reusing {workdir / 'data'}")
    else:
        seconds = backfill(server, bodies, workdir)
        marker.write_text(json.dumps(wanted))
        print(f"prefill: {len(bodies)} conversations backfilled in {seconds:.0f} s")
    return queries


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    phases = PHASES if args.phase == "all" else (args.phase,)
    recall_names = [f"load-user-{i}" for i in range(args.users)]
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f} at the start")
    print("latency is this client's, measured on the same cores as the server")
    results = []
    if args.url:
        tokens = {user: token for token, user in json.loads(Path(args.tokens).read_text()).items()}
        pid = args.pid or listening_pid(args.url)
        target = Target(args.url, args.ingest_key, tokens, pid, None)
        if {"recall", "mixed", "saturate"} & set(phases) and (
            missing := set(recall_names) - set(tokens)
        ):
            raise SystemExit(f"--tokens: no token for {', '.join(sorted(missing))}")
        queries: dict[str, list[str]] = {}
        if {"recall", "mixed", "saturate"} & set(phases):
            bodies = []
            for index in range(args.users):
                user_bodies, queries[f"load-user-{index}"] = user_history(index, args.conversations)
                bodies += user_bodies
            if args.prefill:
                await post_all(target, bodies)
        for name in phases:
            if name == "saturate":
                print("\n== saturate: skipped (it needs the server's settings: run without --url)")
                continue
            results.append(await phase(name, target, args, queries))
        return results
    with tempfile.TemporaryDirectory(prefix="recall-load-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        server = own_server(workdir, recall_names, args)
        queries = (
            prefill_own(workdir, server, args)
            if {"recall", "mixed", "saturate"} & set(phases)
            else {}
        )
        for name in phases:
            extra = SATURATE_SETTINGS if name == "saturate" else {}
            server = own_server(workdir, recall_names, args, **extra)
            with server.start(timeout=120):
                timeout = float(server.env.get("RECALL_TIMEOUT", "10"))
                target = Target(
                    server.url, server.ingest_key, server.tokens, server.process.pid, timeout
                )  # type: ignore[union-attr]
                results.append(await phase(name, target, args, queries))
    return results


async def rounds(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """Posts in rounds, each followed by the index runs catching up: server RSS at each round's
    peak and once indexing is done. Index runs take memory while they embed and give it back
    afterwards, so RSS after each round is what must stay flat."""
    users = [f"load-rounds-{i}" for i in range(args.ingest_users)]
    bodies = ingest_bodies()
    figures: dict[str, Any] = {"phase": "rounds", "rounds": [], "responses_5xx": 0}
    print(f"\n== rounds ({args.rounds} of {args.round_posts} posts, each then indexed)")
    async with httpx2.AsyncClient(headers={"x-ingest-key": target.ingest_key}) as http:
        for number in range(args.rounds):
            posts = Calls(f"round {number}")
            tickets = iter(range(number * args.round_posts, (number + 1) * args.round_posts))

            async def worker(tickets: Any = tickets, posts: Calls = posts) -> None:
                for n in tickets:
                    body = bodies[n % len(bodies)] | {
                        "user": users[n % len(users)],
                        "conversation_id": f"R{n}",
                    }
                    started = time.perf_counter()
                    response = await http.post(f"{target.url}/turns", json=body, timeout=60)
                    posts.record(started, str(response.status_code))

            posts.started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(args.ingest_concurrency)))
            posts.ended = time.perf_counter()
            peak, waited = 0.0, time.monotonic()
            while (await http.get(f"{target.url}/healthz", timeout=10)).json()["indexing"]:
                peak = max(peak, total_rss_mb(target.pid))
                if time.monotonic() - waited > args.drain_timeout:
                    break
                await asyncio.sleep(1)
            indexed_after = round(time.monotonic() - waited)
            await asyncio.sleep(10)  # what the last run freed is given back
            after = total_rss_mb(target.pid)
            result = posts.figures() | {
                "indexed_after_s": indexed_after,
                "rss_peak_mb": round(peak),
                "rss_after_mb": round(after),
            }
            figures["rounds"].append(result)
            figures["responses_5xx"] += sum(
                n for status, n in posts.answers.items() if status.startswith("5")
            )
            print(
                f"  {posts.line()}\n    indexed {indexed_after} s after the round; server RSS "
                f"peak {peak:.0f} MB, {after:.0f} MB once indexed"
            )
    afters = [r["rss_after_mb"] for r in figures["rounds"]]
    if afters and all(afters):
        figures["rss_after_flat_within_10pct"] = max(afters) <= 1.10 * min(afters)
        print(
            f"  RSS once indexed: {min(afters)}-{max(afters)} MB, flat within 10%: "
            f"{figures['rss_after_flat_within_10pct']}"
        )
    print(f"  5xx responses: {figures['responses_5xx']}")
    return figures


async def phase(
    name: str, target: Target, args: argparse.Namespace, queries: dict[str, list[str]]
) -> dict[str, Any]:
    if name == "rounds":
        return await rounds(target, args)
    # Ingest goes to users of its own (a phase's own prefix): new users, whose index runs queue.
    ingest_users = [f"load-{name}-{i}" for i in range(args.ingest_users)]
    if name == "ingest":
        return await run_phase(name, target, args, ingest_users=ingest_users)
    if name == "mixed":
        return await run_phase(name, target, args, ingest_users=ingest_users, recall_users=queries)
    return await run_phase(name, target, args, recall_users=queries)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.load", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--phase", choices=(*PHASES, "rounds", "all"), default="all", help="all: not rounds"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of posts (rounds phase)")
    parser.add_argument("--round-posts", type=int, default=800, help="posts per round")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="callers of each kind")
    parser.add_argument("--ingest-concurrency", type=int, help="posting workers (--concurrency)")
    parser.add_argument("--recall-concurrency", type=int, help="MCP callers (--concurrency)")
    parser.add_argument("--rate", type=float, help="pace the posts at this many per second")
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="how posts are sent: raw, one keep-alive connection per worker (least CPU); httpx",
    )
    parser.add_argument(
        "--think", type=float, default=0.0, help="seconds a recall caller pauses between calls"
    )
    parser.add_argument("--users", type=int, default=4, help="recall users")
    parser.add_argument("--conversations", type=int, default=1_000, help="per recall user")
    parser.add_argument("--ingest-users", type=int, default=64, help="users the posts go to")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, help="seconds before RSS must stay flat")
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--workdir", help="keep (and reuse) the own server's data here")
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="NAME=VALUE",
        help="a setting for the own server (repeatable)",
    )  # fmt: skip
    parser.add_argument("--url", help="a running server (loopback only) instead of our own")
    parser.add_argument("--ingest-key", help="with --url: its INGEST_KEY")
    parser.add_argument("--tokens", help="with --url: its AUTH_TOKENS_FILE (token -> user)")
    parser.add_argument("--pid", type=int, help="with --url: the server's pid, for RSS")
    parser.add_argument("--metrics-token", help="with --url: its METRICS_TOKEN, if it has one")
    parser.add_argument("--prefill", action="store_true", help="with --url: post the histories")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.url and not is_loopback_url(args.url):
        parser.error(f"--url {args.url}: loopback only (127.0.0.0/8, ::1, localhost)")
    if args.url and not (args.ingest_key and args.tokens):
        parser.error("--url needs --ingest-key and --tokens")
    args.ingest_concurrency = args.ingest_concurrency or args.concurrency
    args.recall_concurrency = args.recall_concurrency or args.concurrency
    args.warmup = args.warmup if args.warmup is not None else min(60.0, args.duration / 5)
    if args.duration <= 0 or args.duration > 3_600:
        parser.error("--duration: 0 < seconds <= 3600")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if any(r["responses_5xx"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
