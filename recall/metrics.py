"""What an operator watches: readiness (GET /readyz) and Prometheus metrics (GET /metrics).

Labels are HTTP statuses and fixed outcome names only: never a user id or hash, a token, a
conversation id or any text, so a scrape reveals nothing about anyone. Each app has its own
registry (tests build several apps in one process); gauges are read at scrape time.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from recall.concurrency import BoundedRuns
from recall.domain.answers import OUTCOMES, Recalled
from recall.domain.answers import outcome as answer_outcome

PREFIX = "recall_server_"
# A `_created` timestamp series beside every counter and histogram only doubles the page (and
# Prometheus tells resets by itself): off. The switch is process-wide, like the setting it is.
disable_created_metrics()
# The recall outcomes: base.outcome's (by the fixed answer each gives the agent), or a timeout.
TIMEOUT = "timeout"
# Index runs take from well under a second (a post) to INDEX_TIMEOUT (300 s by default).
INDEX_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, float("inf"))

# Set by search() when its UNAVAILABLE came from RECALL_TIMEOUT: the answer text is the same,
# the outcome label is not. Per task, so concurrent recalls cannot mix their outcomes up.
_timed_out: ContextVar[bool] = ContextVar("recall_timed_out", default=False)


def recall_timed_out() -> None:
    """Mark the recall under way as ended by RECALL_TIMEOUT (outcome `timeout`)."""
    _timed_out.set(True)


# --- readiness ----------------------------------------------------------------------------


def data_dir_writable(data_dir: Path) -> bool:
    """Whether a file can be created and removed in DATA_DIR now (blocking: run it off the loop)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".readyz-", dir=data_dir)  # dot: no user home
        try:
            os.write(fd, b"ok")  # a byte, so that a full disk fails here too
        finally:
            os.close(fd)
            os.unlink(name)
    except OSError:
        return False
    return True


# --- metrics ------------------------------------------------------------------------------


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.ingest_requests = Counter(
            f"{PREFIX}ingest_requests",
            "POST /turns requests by HTTP status",
            ["status"],
            registry=registry,
        )
        self.ingest_seconds = Histogram(
            f"{PREFIX}ingest_duration_seconds",
            "POST /turns latency by HTTP status",
            ["status"],
            registry=registry,
        )
        self.recalls = Counter(
            f"{PREFIX}recalls", "tool calls by outcome", ["outcome"], registry=registry
        )
        self.recall_seconds = Histogram(
            f"{PREFIX}recall_duration_seconds",
            "tool call latency by outcome",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("passages", *OUTCOMES.values(), TIMEOUT):  # every outcome shows, from 0
            self.recalls.labels(outcome)
            self.recall_seconds.labels(outcome)
        self.index_runs = Counter(
            f"{PREFIX}index_runs", "index runs ended, failed ones included", registry=registry
        )
        self.index_failures = Counter(
            f"{PREFIX}index_failures", "index runs that failed", registry=registry
        )
        self.index_seconds = Histogram(
            f"{PREFIX}index_duration_seconds",
            "index run duration",
            buckets=INDEX_BUCKETS,
            registry=registry,
        )

    def watch(self, recalls: BoundedRuns, engine: object | None) -> None:
        """Read the gauges from these at each scrape (and the index lag given to ``page``);
        ``engine``'s ``cached_bytes``, when it has one, is the vector cache's gauge."""
        self.gauges = _Gauges(recalls, engine)
        self.registry.register(self.gauges)

    # -- wrappers for the routes and runs they measure -------------------------------------

    def ingest(
        self, route: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """POST /turns, counted and timed by the status it answers (500: it raised)."""

        @functools.wraps(route)
        async def measured(request: Request) -> Response:
            started, status = time.monotonic(), "500"
            try:
                response = await route(request)
                status = str(response.status_code)
                return response
            finally:
                self.ingest_requests.labels(status).inc()
                self.ingest_seconds.labels(status).observe(time.monotonic() - started)

        return measured

    def recall(
        self, search: Callable[..., Awaitable[Recalled]]
    ) -> Callable[..., Awaitable[Recalled]]:
        """The server's search, counted and timed by outcome, told from the answer it gives."""

        @functools.wraps(search)
        async def measured(*args: Any) -> Recalled:
            started = time.monotonic()
            _timed_out.set(False)
            answer = await search(*args)  # fails soft: never raises
            outcome = TIMEOUT if _timed_out.get() else answer_outcome(answer)
            self.recalls.labels(outcome).inc()
            self.recall_seconds.labels(outcome).observe(time.monotonic() - started)
            return answer

        return measured

    def index(self, run: Callable[[Path], Awaitable[None]]) -> Callable[[Path], Awaitable[None]]:
        """An index run, counted and timed; a failure counted too (a cancelled run is neither)."""

        @functools.wraps(run)
        async def measured(home: Path) -> None:
            started = time.monotonic()
            try:
                await run(home)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.index_failures.inc()
                self._index_ended(started)
                raise
            self._index_ended(started)

        return measured

    def _index_ended(self, started: float) -> None:
        self.index_runs.inc()
        self.index_seconds.observe(time.monotonic() - started)

    # -- the page --------------------------------------------------------------------------

    @staticmethod
    def refused(request: Request, token: str) -> Response | None:
        """The 401 for a scrape without the METRICS_TOKEN bearer (None: it may read the page)."""
        if token:
            provided = request.headers.get("authorization", "").encode("latin-1")
            if not hmac.compare_digest(provided, f"Bearer {token}".encode()):
                return JSONResponse(
                    {"error": "authorization: missing or wrong METRICS_TOKEN bearer"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return None

    def page(self, index_lag: tuple[int, float] | None) -> Response:
        """The Prometheus text page; ``index_lag`` is the store's (read from the database when
        it is shared, so every replica reports the same), None when it did not answer in time:
        its two gauges are then left out, not reported as 0."""
        self.gauges.index_lag = index_lag
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class _Gauges(Collector):
    """What is true now, read at scrape time: the index backlog, busy recall slots, the cache."""

    def __init__(self, recalls: BoundedRuns, engine: object | None) -> None:
        self.recalls = recalls
        self.engine = engine
        self.index_lag: tuple[int, float] | None = (0, 0.0)  # set by Metrics.page per scrape

    def collect(self) -> Iterator[Metric]:
        if self.index_lag is not None:
            waiting, oldest = self.index_lag
            yield GaugeMetricFamily(
                f"{PREFIX}index_waiting_users",
                "users with writes no index run has started on yet (debounce or queue)",
                value=waiting,
            )
            yield GaugeMetricFamily(
                f"{PREFIX}index_oldest_wait_seconds",
                "how long the oldest write not yet in an index run has waited (0: none)",
                value=oldest,
            )
        yield GaugeMetricFamily(
            f"{PREFIX}recall_slots_in_use",
            "recall slots held (RECALL_CONCURRENCY is the limit)",
            value=self.recalls.in_use,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}recall_slots",
            "recall slots in all (RECALL_CONCURRENCY)",
            value=self.recalls.limit,
        )
        # The embedded engine and the PostgreSQL store cache vectors; funes' page has no gauge.
        cached: int | None = getattr(self.engine, "cached_bytes", None)
        if cached is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}vector_cache_bytes",
                "bytes of vector matrices cached (VECTOR_CACHE_MB bounds it)",
                value=cached,
            )
