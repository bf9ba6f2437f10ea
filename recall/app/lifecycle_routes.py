"""The data lifecycle over HTTP (recall/files/lifecycle.py does the work): POST /forget, /erase,
/receipts and /audit, for the gateway or an admin, with the shared key. The user is in the
body, never in a URL, where access logs would keep it."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from recall.app.answers import describe
from recall.app.context import App
from recall.app.keyed import Keyed, Route, error, unavailable
from recall.domain.conversation import parse_audit_request, parse_request, user_dir_name
from recall.domain.errors import EngineError, NotFound, StoreUnavailable

log = logging.getLogger("recall")


class LifecycleRoutes:
    def __init__(self, app: App) -> None:
        self.store = app.store
        self.limits = app.limits
        self.keyed = Keyed(app.settings)

    def routes(self) -> list[Route]:
        return [
            ("/forget", ["POST"], self.forget),
            ("/erase", ["POST"], self.erase),
            ("/receipts", ["POST"], self.receipts),
            ("/audit", ["POST"], self.audit),
        ]

    def user_only(self, body: Any) -> str:
        return parse_request(body, self.limits, conversation=False)[0]

    async def forget(self, request: Request) -> JSONResponse:
        parsed = await self.keyed.request(
            request, lambda body: parse_request(body, self.limits, conversation=True)
        )
        if isinstance(parsed, JSONResponse):
            return parsed
        user, conversation_id = user_dir_name(parsed[0]), parsed[1]
        try:
            receipt = await self.store.forget(user, conversation_id, "request")
        except NotFound:
            return error(404, "conversation_id: no such conversation for this user")
        except StoreUnavailable:
            return unavailable()
        except EngineError as exc:  # the source is gone and tombstoned; a retry finishes the job
            log.warning("forget for user %s failed: %s", user, describe(exc))
            return error(503, "index: could not be cleaned yet; repeat the request")
        return JSONResponse(receipt)

    async def erase(self, request: Request) -> JSONResponse:
        if isinstance(user := await self.keyed.request(request, self.user_only), JSONResponse):
            return user
        try:
            return JSONResponse(await self.store.erase(user_dir_name(user)))
        except StoreUnavailable:
            return unavailable()

    async def receipts(self, request: Request) -> JSONResponse:
        if isinstance(user := await self.keyed.request(request, self.user_only), JSONResponse):
            return user
        user_hash = user_dir_name(user)
        try:
            found = await self.store.receipts(user_hash)
        except StoreUnavailable:
            return unavailable()
        return JSONResponse({"user": user_hash, "receipts": found})

    async def audit(self, request: Request) -> JSONResponse:
        """A user's recall audit: {"user", "since"?} in the body."""
        parsed = await self.keyed.request(
            request, lambda body: parse_audit_request(body, self.limits)
        )
        if isinstance(parsed, JSONResponse):
            return parsed
        user, since = parsed
        try:
            entries = await self.store.audit(user_dir_name(user), since)
        except StoreUnavailable:
            return unavailable()
        return JSONResponse({"entries": entries})
