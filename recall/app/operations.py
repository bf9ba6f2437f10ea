"""What an operator or an orchestrator asks: GET /healthz (liveness), /readyz (can requests
succeed) and /metrics (Prometheus text, recall/metrics.py)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from recall.app.context import App
from recall.app.keyed import Route


class Operations:
    def __init__(self, app: App) -> None:
        self.app = app

    def routes(self) -> list[Route]:
        return [
            ("/healthz", ["GET"], self.healthz),
            ("/readyz", ["GET"], self.readyz),
            ("/metrics", ["GET"], self.metrics),
        ]

    async def healthz(self, _: Request) -> JSONResponse:
        # Liveness: answers at once whatever the database does (a probe that waited on it would
        # restart every replica during a failover). "indexing": users whose index run is due or
        # going on (0: every write went through a run), null when the store did not say within
        # GLANCE_SECONDS; the seeder waits for 0 so that the demo's first search finds it all.
        store = self.app.store
        indexing = await self.app.indexing_now()
        return JSONResponse(
            {"status": "ok", "store": store.name, "engine": store.engine_name, "indexing": indexing}
        )

    async def readyz(self, _: Request) -> JSONResponse:
        # Can requests succeed: the store takes a write (DATA_DIR, the database), the engine
        # can answer.
        store = self.app.store
        if failed := await store.ready():
            return JSONResponse({"status": "not ready", "failed": failed}, status_code=503)
        return JSONResponse({"status": "ready", "store": store.name, "engine": store.engine_name})

    async def metrics(self, request: Request) -> Response:
        if refused := self.app.metrics.refused(request, self.app.settings.metrics_token):
            return refused
        # The process' own figures always; the index backlog's when the store says it in time.
        return self.app.metrics.page(await self.app.index_lag_now())
