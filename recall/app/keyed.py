"""What the routes that take the shared ingest key have in common (POST /turns, /forget, /erase,
/receipts, /audit): the key checked in constant time, the body read within its bounds and
parsed, and the refusals they answer, each naming the field and the rule, never a value."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from recall.domain.errors import InvalidConversation
from recall.logs import Refusals
from recall.settings import Settings
from recall.transport import BodyTooLarge, read_limited

log = logging.getLogger("recall")
REFUSALS = Refusals(log)  # why requests were refused: each reason at INFO, rate-limited

T = TypeVar("T")  # what a keyed route parses its body into
RETRY_AFTER_SECONDS = 5  # a 503 of a store that is down: when the gateway may try again

Endpoint = Callable[[Request], Awaitable[Response]]
Route = tuple[str, list[str], Endpoint]  # (path, methods, endpoint): a custom route to register


def error(status: int, message: str) -> JSONResponse:
    """A refusal: its message names the field and the rule, never a value, so it is logged too."""
    REFUSALS.note(f"request refused ({status}): {message}")
    return JSONResponse({"error": message}, status_code=status)


def unavailable() -> JSONResponse:
    """The store cannot be reached (the database is down): nothing was done; retry later."""
    response = error(503, "store: unavailable right now; nothing was stored or changed, retry")
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


class Keyed:
    """Reads the body of a request to an ingest-key route."""

    def __init__(self, settings: Settings) -> None:
        self.key = settings.ingest_key.encode()
        self.max_body_bytes = settings.max_body_bytes
        self.body_timeout = settings.body_timeout

    async def body(self, request: Request) -> bytes | JSONResponse:
        """The body of a request to an ingest-key route, or the refusal to send."""
        # Custom routes sit outside FastMCP's auth: check the shared key here, in constant time.
        provided = request.headers.get("x-ingest-key", "").encode("latin-1")
        if not hmac.compare_digest(provided, self.key):
            return error(401, "x-ingest-key: missing or wrong")
        try:
            return await read_limited(request, self.max_body_bytes, self.body_timeout)
        except BodyTooLarge:
            return error(413, f"body: larger than {self.max_body_bytes} bytes")
        except TimeoutError:
            return error(408, f"body: not received within {self.body_timeout:g} s")

    async def request(self, request: Request, parse: Callable[[Any], T]) -> T | JSONResponse:
        """A keyed route's body, read and parsed by ``parse`` (InvalidConversation names the
        field), or the refusal to send."""
        if isinstance(raw := await self.body(request), JSONResponse):
            return raw
        try:
            return parse(json.loads(raw))
        except (ValueError, RecursionError) as exc:  # InvalidConversation is a ValueError
            message = str(exc) if isinstance(exc, InvalidConversation) else "body: not valid JSON"
            return error(400, message)
