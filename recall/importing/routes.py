"""The memory page's "Bring your history": `POST /api/me/import?format=F` takes the person's
export (its zip, or its one file) as the request body under their own bearer token, into their
memory only; `GET /api/me/import` says how the last import of theirs is going.

The upload is streamed to a private temporary file, refused (413) the moment it passes
IMPORT_MAX_BYTES; the whole export is then read and checked before the answer, so a hostile or
unusable one gets its error (4xx, naming the file or field and the problem) with nothing
written. A good one is answered 202 with the plan and written in the background, through the
store seam as POST /turns writes (importer.py); the page polls for progress and the summary.
Progress lives in this process: with replicas, the page polls the one that took the upload
(docs/import.md).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from recall.domain.conversation import Limits
from recall.domain.errors import StoreUnavailable
from recall.importing import importer
from recall.importing.errors import ImportRefused, TooLarge
from recall.importing.formats.base import Format
from recall.importing.registry import FORMATS
from recall.memory_api import BadRequest, answer, error
from recall.store import Store

log = logging.getLogger("recall.import")

MAX_RUNNING = 2  # imports at once in this process: each reads an export in a thread
UPLOAD_SECONDS = 1800.0  # a stalled upload frees its slot
BUSY = {"Retry-After": "60"}


@dataclass
class Job:
    """One person's import: its state, progress and summary (counts and reasons only)."""

    summary: importer.Summary
    state: str = "importing"  # then "done" or "failed"
    done: int = 0  # conversations put so far
    problem: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "done": self.done,
            "total": self.summary.to_import,
            "summary": self.summary.view(),
            "error": self.problem,
        }


@dataclass
class ChatImports:
    store: Store
    limits: Limits
    max_bytes: int
    jobs: dict[str, Job] = field(default_factory=dict)  # user hash -> the last import
    running: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, request: Request, user: str) -> Response:
        if request.method == "GET":
            job = self.jobs.get(user)
            return answer({"import": job.view() if job else None})
        return await self.upload(request, user)

    async def upload(self, request: Request, user: str) -> Response:
        fmt = FORMATS.get(request.query_params.get("format", ""))
        if fmt is None:
            raise BadRequest(f"format: must be one of {', '.join(sorted(FORMATS))}")
        if (job := self.jobs.get(user)) and job.state == "importing":
            return error(409, "import: one of yours is still running; wait for its summary")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            message = f"upload: {declared} bytes, more than IMPORT_MAX_BYTES ({self.max_bytes})"
            return error(413, message)
        if self.running >= MAX_RUNNING:
            return error(429, "import: the server is busy importing; try again shortly", BUSY)
        self.running += 1
        folder = Path(tempfile.mkdtemp(prefix="recall-import-"))  # 0700, this process only
        started = False
        try:
            path = folder / "export"
            await self.receive(request, path)
            planned = await asyncio.to_thread(
                importer.plan, path, fmt, user, self.limits, self.max_bytes
            )
            job = Job(planned)
            self.jobs[user] = job
            task = asyncio.create_task(self.write(job, user, path, fmt, folder))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            started = True
            return answer({"import": job.view()}, 202)
        except ImportRefused as exc:
            log.info("user %s: import refused, nothing written", user)
            return error(exc.status, str(exc))
        finally:
            if not started:
                shutil.rmtree(folder, ignore_errors=True)
                self.running -= 1

    async def receive(self, request: Request, path: Path) -> None:
        """The body into ``path``, refused past the limit or the time."""
        size = 0
        with open(path, "wb") as handle:
            try:
                async with asyncio.timeout(UPLOAD_SECONDS):
                    async for chunk in request.stream():
                        size += len(chunk)
                        if size > self.max_bytes:
                            raise TooLarge(f"upload: more than IMPORT_MAX_BYTES ({self.max_bytes})")
                        await asyncio.to_thread(handle.write, chunk)
            except TimeoutError as exc:
                raise ImportRefused(
                    f"upload: not received within {UPLOAD_SECONDS:g} s", 408
                ) from exc
        if size == 0:
            raise ImportRefused("upload: empty; send the export's zip as the request body")

    async def write(self, job: Job, user: str, path: Path, fmt: Format, folder: Path) -> None:
        def moved(done: int) -> None:
            job.done = done

        try:
            limits, most = self.limits, self.max_bytes
            await importer.write(self.store, user, path, fmt, limits, most, job.summary, moved)
            job.state = "done"
        except ImportRefused as exc:  # cannot happen unless the file changed under us
            job.state, job.problem = "failed", str(exc)
        except StoreUnavailable:
            job.state = "failed"
            job.problem = "store: unavailable; import again (what was written stays, once)"
        except Exception:
            log.exception("user %s: import failed", user)
            job.state, job.problem = "failed", "import: failed; the server's log says why"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            self.running -= 1
