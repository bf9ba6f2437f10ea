"""The server's parts, built once from the settings by `build`: what every route and tool is
handed, and the lifespan that starts and stops them."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastmcp import FastMCP
from fastmcp.server.auth import AuthProvider

from recall.app.answers import Answers
from recall.auth import build_verifier
from recall.concurrency import BoundedRuns, Glance
from recall.domain.conversation import Limits
from recall.files.engines.factory import make_engine
from recall.files.layout import PRIVATE_UMASK
from recall.files.lifecycle import sweep_forever
from recall.files.store import FilesStore
from recall.metrics import Metrics
from recall.settings import ConfigError, Settings
from recall.store import Store
from recall.transport import Refusal

if TYPE_CHECKING:
    from recall.pg.database import StartCheck  # psycopg is imported only for STORE=postgres

log = logging.getLogger("recall")

# /healthz and /metrics wait this long at most for a figure from the store (the database): a
# liveness probe allows 1 s (Kubernetes' default), the image's HEALTHCHECK 4 s.
GLANCE_SECONDS = 0.25
# Durable writes are short (a file, two fsyncs); their own few threads, so that nothing else
# (index runs, recalls) can make the gateway's post wait for a thread.
WRITE_THREADS = 4


@dataclass
class App:
    settings: Settings
    verifier: AuthProvider  # the bearer tokens of /mcp and the memory page
    allowed_hosts: list[str]  # Host names clients reach us by (DNS rebinding)
    limits: Limits  # what one posted conversation may hold, what is redacted from it
    store: Store
    metrics: Metrics
    recalls: BoundedRuns  # the recall slots: concurrency and timeout of searches and reads
    writes: ThreadPoolExecutor  # the files store's durable writes
    answers: Answers  # what the tools and the page's search answer, failing soft
    indexing_now: Glance[int]  # the store's figures for the probes, read without waiting on a
    index_lag_now: Glance[tuple[int, float]]  # database that is down
    refusal: Refusal  # main() exits with status 3 once the store refused to serve

    @asynccontextmanager
    async def lifespan(self, _: FastMCP) -> AsyncIterator[dict[str, Any]]:
        store, settings = self.store, self.settings
        try:
            await store.start()  # catches up on what changed while we were down
        except ConfigError as exc:  # one line, no traceback; nothing of the store left running
            await store.close()
            self.refusal.refuse(str(exc))
            raise
        tasks = [asyncio.create_task(self.stop_when_refused())]
        log.info("serving with the %s", store.describe())
        # Where the write route's key comes from, for whoever follows the README (never the key).
        log.info("POST /turns takes this server's INGEST_KEY environment variable in x-ingest-key")
        if settings.retention_days > 0:
            sweep = sweep_forever(store, settings.retention_days, settings.retention_sweep_seconds)
            tasks.append(asyncio.create_task(sweep))
        try:
            yield {}
        finally:
            for task in tasks:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await self.close()

    async def stop_when_refused(self) -> None:
        # A replica started while the database was down checks its role and schema on the first
        # connection that succeeds: refused then, it stops rather than serve (status 3).
        self.refusal.refuse(await self.store.refused())

    async def close(self) -> None:
        await self.indexing_now.close()
        await self.index_lag_now.close()
        await self.recalls.close()
        await self.store.close()
        self.writes.shutdown()


def make_store(
    settings: Settings,
    writes: ThreadPoolExecutor,
    metrics: Metrics,
    checked: StartCheck | None = None,
) -> Store:
    """STORE=files: DATA_DIR and funes or the embedded engine; STORE=postgres: DATABASE_URL
    (``checked``: what the start's check of it found already)."""
    if settings.store == "postgres":
        from recall.pg.store import from_settings  # psycopg is needed only there

        return from_settings(settings, checked)
    return FilesStore(
        settings.data_dir.resolve(),
        make_engine(settings),
        writes,
        debounce=settings.index_debounce,
        index_concurrency=settings.index_concurrency,
        measure_index=metrics.index,
    )


def build(settings: Settings, store: Store | None = None, checked: StartCheck | None = None) -> App:
    """The parts, from the settings (ConfigError names what cannot serve); ``store`` replaces
    the configured one, for a test that runs routes over a store of its own; ``checked``: the
    database's check this start made before the model (main), which the lifespan does not
    repeat."""
    os.umask(PRIVATE_UMASK)  # whatever builds the app: all it and its workers create is private
    if refused := settings.refusal():
        raise ConfigError(refused)
    allowed_hosts = settings.host_allowlist()
    verifier = build_verifier(settings)
    limits = settings.limits()
    recalls = BoundedRuns(settings.recall_concurrency, settings.recall_timeout)
    writes = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="recall-write")
    metrics = Metrics()
    if store is None:
        store = make_store(settings, writes, metrics, checked)
    # Gauges read at scrape time; the vector cache is the embedded engine's or the database's.
    metrics.watch(recalls, getattr(store, "engine", store))
    answers = Answers(store, recalls, metrics, settings.max_result_chars, settings.jwt_user_claim)
    return App(
        settings=settings,
        verifier=verifier,
        allowed_hosts=allowed_hosts,
        limits=limits,
        store=store,
        metrics=metrics,
        recalls=recalls,
        writes=writes,
        answers=answers,
        indexing_now=Glance(store.indexing, GLANCE_SECONDS),
        index_lag_now=Glance(store.index_lag, GLANCE_SECONDS),
        refusal=Refusal(),
    )
