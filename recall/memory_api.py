"""The person's own view of their memory: the page at GET /memory and its JSON API under /api/me/.

Who: every /api/me route takes the bearer token the person's agent uses, verified where /mcp's
is, by the authentication middleware FastMCP puts in front of the whole app with the server's one
verifier (recall/auth.py); the user comes from that token only (`user_from_token`), never from a
path, a query string or a body. A conversation id is the person's own, looked up in their own
directory only. No user id, token, query or conversation id goes into a URL: access logs keep
URLs, and a gateway's conversation ids may name the user.

What (docs/CONTRACTS.md, "The memory page"):

    GET  /api/me                         {"user"}: who the token names
    GET  /api/me/conversations           newest first: id, date, first line, number of turns
    POST /api/me/conversation {"conversation_id"}  every turn: seq, ts, role, text, recalled
    POST /api/me/search {"query"}        the tool's answer, word for word, split into passages
    POST /api/me/forget {"conversation_id"}  Lifecycle.forget's receipt
    POST /api/me/erase {"confirm": "erase"}  Lifecycle.erase's receipt
    GET  /api/me/audit                   the recall audit, newest first, passages linked

The search is the tool's own (the same function, bound, timeout and fail-soft answers) but is
not audited: the audit says what the *assistant* looked up. The page is three static files
(recall/static/) under a Content-Security-Policy that allows only this server's own script and
style, no inline code and no framing; the script inserts every piece of data as text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastmcp.server.auth import AccessToken
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from recall import audit
from recall.auth import user_from_token
from recall.concurrency import run_in
from recall.conversations import CONVERSATION_ID, SOURCE_SUFFIX, is_recalled, read_source
from recall.engines.base import EngineError
from recall.lifecycle import Lifecycle, NotFound
from recall.transport import BodyTooLarge, read_limited

log = logging.getLogger("recall.memory")

STATIC = Path(__file__).resolve().parent / "static"
ERASE_WORD = "erase"  # what the person types to erase everything
MAX_BODY_BYTES = 16 * 1024  # a query or an id: anything larger is not the page talking
BODY_TIMEOUT = 10.0  # seconds for such a small body
FIRST_LINE_CHARS = 160  # what the list shows of a conversation's first turn

# The page: this server's own script and style only; no inline code, no plugins, no framing, no
# other origin; and (Chromium) no string may ever be assigned to innerHTML and the like.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; "
    "require-trusted-types-for 'script'; trusted-types 'none'"
)
API_POLICY = "default-src 'none'; frame-ancestors 'none'"
COMMON_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",  # a person's conversations: no cache keeps a copy
}
STATIC_FILES = {  # path -> (file in recall/static, media type)
    "/memory": ("memory.html", "text/html; charset=utf-8"),
    "/memory/memory.js": ("memory.js", "text/javascript; charset=utf-8"),
    "/memory/memory.css": ("memory.css", "text/css; charset=utf-8"),
}

Endpoint = Callable[[Request], Awaitable[Response]]


class BadRequest(Exception):
    """A refused request; the message starts with the offending field."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def answer(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        body,
        status_code=status,
        headers={**COMMON_HEADERS, "Content-Security-Policy": API_POLICY, **(headers or {})},
    )


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return answer({"error": message}, status, headers)


# --- reading a user's conversations (on the write pool: file reads) --------------------------


def turn_text(turn: dict[str, Any]) -> str:
    blocks = turn.get("blocks")
    if not isinstance(blocks, list):
        return ""
    return "\n".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))


def conversation_ids(home: Path) -> list[str]:
    src = home / "src"
    if not src.is_dir():
        return []
    return sorted(p.name[: -len(SOURCE_SUFFIX)] for p in src.glob(f"*{SOURCE_SUFFIX}"))


def read_turns(home: Path, conversation_id: str) -> list[dict[str, Any]] | None:
    """One conversation's turns as the page shows them; None when there is no such source."""
    try:
        lines = read_source(home / "src" / f"{conversation_id}{SOURCE_SUFFIX}")
    except FileNotFoundError:
        return None
    return [
        {
            "seq": line.get("seq", index),
            "ts": line.get("ts", ""),
            "role": line.get("role", ""),
            "text": turn_text(line),
            "recalled": is_recalled(line),
        }
        for index, line in enumerate(lines)
    ]


def list_conversations(home: Path) -> list[dict[str, Any]]:
    """Every readable conversation, newest first (by its first turn), with its first line."""
    found = []
    for conversation_id in conversation_ids(home):
        try:
            turns = read_turns(home, conversation_id)
        except (OSError, ValueError):  # unreadable: the list goes on without it
            log.warning("user %s: a source could not be read for the list", home.name)
            continue
        if not turns:
            continue
        first_text = next((t["text"] for t in turns if t["text"].strip()), "")
        first_line = first_text.strip().splitlines()[0] if first_text.strip() else ""
        found.append(
            {
                "conversation_id": conversation_id,
                "date": turns[0]["ts"],
                "last": turns[-1]["ts"],
                "first_line": first_line[:FIRST_LINE_CHARS],
                "turns": len(turns),
            }
        )
    found.sort(key=lambda c: (c["date"], c["conversation_id"]), reverse=True)
    return found


def where_served(home: Path, served: list[dict[str, str]]) -> list[list[dict[str, Any]]]:
    """For each served passage (its turn's time, and role when the engine prints it), the turns
    still stored that it can be: the embedded engine gives the minute and the role, funes the
    exact time. A forgotten conversation's passages lead nowhere."""
    stored: list[tuple[str, str, str, int]] = []  # (ts, role, conversation id, seq)
    for conversation_id in conversation_ids(home):
        try:
            turns = read_turns(home, conversation_id) or []
        except (OSError, ValueError):
            continue
        stored += [(t["ts"], t["role"], conversation_id, t["seq"]) for t in turns]
    places = []
    for hit in served:
        ts, role = hit.get("ts", ""), hit.get("role")
        if role:
            same = [s for s in stored if s[0][:16] == ts[:16] and s[1] == role]
        else:
            same = [s for s in stored if s[0][:19] == ts[:19]]
        places.append([{"conversation_id": cid, "seq": seq} for _, _, cid, seq in same])
    return places


def passages(answer_text: str) -> list[dict[str, Any]]:
    """The tool's answer cut at each passage's dated header line (what audit.served reads)."""
    starts = sorted(
        m.start()
        for pattern in (audit.EMBEDDED_HEADER, audit.FUNES_HEADER)
        for m in pattern.finditer(answer_text)
    )
    found = []
    for start, end in zip(starts, [*starts[1:], len(answer_text)], strict=False):
        text = answer_text[start:end].rstrip("\n")
        text = text.removesuffix("\n---").rstrip("\n")
        found.append({"text": text, **audit.served(text)[0]})
    return found


# --- the routes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryApi:
    """The page and /api/me, wired to the server's own parts (recall_server.py)."""

    home: Callable[[str], Path]  # the user's directory (a hash of the id)
    search: Callable[[Path, str], Awaitable[str]]  # the tool's search: bounds and fail-soft
    lifecycle: Lifecycle
    files: Executor  # the pool file work runs on (the server's write pool)
    user_claim: str  # JWT_USER_CLAIM
    required_scopes: list[str]  # the verifier's, as /mcp requires them
    max_query_chars: int  # the tool's cut

    def routes(self) -> list[tuple[str, list[str], Endpoint]]:
        """(path, methods, endpoint) for every route, to register as custom routes."""
        return [
            *((path, ["GET"], self.static(path)) for path in STATIC_FILES),
            ("/api/me", ["GET"], self.signed_in(self.me)),
            ("/api/me/conversations", ["GET"], self.signed_in(self.conversations)),
            ("/api/me/conversation", ["POST"], self.signed_in(self.conversation)),
            ("/api/me/search", ["POST"], self.signed_in(self.search_memory)),
            ("/api/me/forget", ["POST"], self.signed_in(self.forget)),
            ("/api/me/erase", ["POST"], self.signed_in(self.erase)),
            ("/api/me/audit", ["GET"], self.signed_in(self.recall_audit)),
        ]

    @staticmethod
    def static(path: str) -> Endpoint:
        name, media_type = STATIC_FILES[path]
        content = (STATIC / name).read_bytes()  # read once, at start: a missing file stops it
        headers = {**COMMON_HEADERS, "Content-Security-Policy": PAGE_POLICY}

        async def serve_file(_: Request) -> Response:
            return Response(content, media_type=media_type, headers=headers)

        return serve_file

    def signed_in(self, handler: Callable[[Request, str], Awaitable[Response]]) -> Endpoint:
        """The route, for a request whose bearer token the server's verifier accepted (the user
        from the token only); 401 otherwise, as /mcp answers it."""

        async def endpoint(request: Request) -> Response:
            token = verified_token(request)
            if token is None or not set(self.required_scopes) <= set(token.scopes):
                offered = request.headers.get("authorization", "").lower().startswith("bearer ")
                challenge = 'Bearer error="invalid_token"' if offered else "Bearer"
                return error(
                    401,
                    "authorization: a valid bearer token is required",
                    {"WWW-Authenticate": challenge},
                )
            user = user_from_token(token, self.user_claim)
            if user is None:
                log.warning("memory page refused: token has no %s claim", self.user_claim)
                return error(401, f"authorization: the token names no user ({self.user_claim})")
            try:
                return await handler(request, user)
            except BadRequest as exc:
                return error(exc.status, str(exc))

        return endpoint

    async def me(self, _: Request, user: str) -> Response:
        return answer({"user": user})

    async def conversations(self, _: Request, user: str) -> Response:
        found = await run_in(self.files, list_conversations, self.home(user))
        return answer({"conversations": found})

    async def conversation(self, request: Request, user: str) -> Response:
        conversation_id = checked_id((await json_body(request)).get("conversation_id"))
        try:
            turns = await run_in(self.files, read_turns, self.home(user), conversation_id)
        except (OSError, ValueError):
            return error(503, "conversation_id: stored but not readable right now")
        if turns is None:
            return error(404, "conversation_id: no such conversation (or it was forgotten)")
        return answer({"conversation_id": conversation_id, "turns": turns})

    async def search_memory(self, request: Request, user: str) -> Response:
        body = await json_body(request)
        query = body.get("query")
        if not isinstance(query, str):
            raise BadRequest("query: must be a string")
        query = query.strip()[: self.max_query_chars]  # exactly what the tool searches
        home = self.home(user)
        text = await self.search(home, query)
        found = passages(text)
        places = await run_in(self.files, where_served, home, found)
        for passage, turns in zip(found, places, strict=True):
            passage["turns"] = turns
        return answer({"query": query, "answer": text, "passages": found})

    async def forget(self, request: Request, user: str) -> Response:
        body = await json_body(request)
        conversation_id = checked_id(body.get("conversation_id"))
        home = self.home(user)
        try:
            receipt = await self.lifecycle.forget(home, conversation_id, "request")
        except NotFound:
            return error(404, "conversation_id: no such conversation")
        except EngineError:  # the source is gone and tombstoned; a retry finishes the job
            log.warning("forget from the memory page for user %s: index not cleaned", home.name)
            return error(503, "index: could not be cleaned yet; repeat the request")
        return answer(receipt)

    async def erase(self, request: Request, user: str) -> Response:
        body = await json_body(request)
        if body.get("confirm") != ERASE_WORD:
            raise BadRequest(f'confirm: must be the word "{ERASE_WORD}"')
        return answer(await self.lifecycle.erase(self.home(user)))

    async def recall_audit(self, _: Request, user: str) -> Response:
        home = self.home(user)
        entries = list(reversed(await run_in(self.files, audit.read, home)))
        served = [hit for entry in entries for hit in entry.get("served", [])]
        places = iter(await run_in(self.files, where_served, home, served))
        for entry in entries:
            entry["served"] = [{**hit, "turns": next(places)} for hit in entry.get("served", [])]
        return answer({"entries": entries})


def verified_token(request: Request) -> AccessToken | None:
    """The token FastMCP's authentication middleware verified for this request, if any."""
    user = request.scope.get("user")
    return user.access_token if isinstance(user, AuthenticatedUser) else None


def checked_id(value: Any) -> str:
    if not isinstance(value, str) or not CONVERSATION_ID.fullmatch(value):
        raise BadRequest("conversation_id: must match [A-Za-z0-9_-]{1,128}")
    return value


async def json_body(request: Request) -> dict[str, Any]:
    """A small JSON object body; BadRequest names what is wrong with it."""
    try:
        raw = await read_limited(request, MAX_BODY_BYTES, BODY_TIMEOUT)
    except BodyTooLarge as exc:
        raise BadRequest(f"body: larger than {MAX_BODY_BYTES} bytes", 413) from exc
    except TimeoutError as exc:
        raise BadRequest(f"body: not received within {BODY_TIMEOUT:g} s", 408) from exc
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest("body: not valid JSON") from exc
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    return body
