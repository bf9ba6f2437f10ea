"""The person's own view of their memory: the page at GET /memory and its JSON API under /api/me/.

Who: every /api/me route takes the bearer token the person's agent uses, verified where /mcp's
is, by the authentication middleware FastMCP puts in front of the whole app with the server's one
verifier (recall/auth.py); the user comes from that token only (`user_from_token`), never from a
path, a query string or a body. A conversation id is the person's own, looked up in their own
directory only. No user id, token, query or conversation id goes into a URL: access logs keep
URLs, and a gateway's conversation ids may name the user.

What (docs/CONTRACTS.md, "The memory page"):

    GET  /api/me                         {"user"}: who the token names
    GET  /api/me/conversations           newest first: id, ref, date, first line, number of turns
    POST /api/me/conversation {"ref"} (or {"conversation_id"})  every turn: seq, ts, role, text,
                                         recalled
    POST /api/me/search {"query"}        the tool's answer, word for word; its passages as a person
                                         reads them (who, when, which conversation, the turn
                                         whole, the turns beside it); its lines beside them
    POST /api/me/forget {"conversation_id"}  Lifecycle.forget's receipt
    POST /api/me/erase {"confirm": "erase"}  Lifecycle.erase's receipt
    GET  /api/me/audit?limit=&before=    a page of the recall audit, newest first, passages
                                         linked to their turn and named by their conversation,
                                         and the cursor of the next page
    POST /api/me/import?format=F, GET /api/me/import   "Bring your history": a chat export into
                                         this memory (recall/importing/routes.py, wrapped by
                                         `signed_in` here)

The search is the tool's own (the same function, bound, timeout and fail-soft answers) but is
not audited: the audit says what the *assistant* looked up. The page is three static files
(recall/static/) under a Content-Security-Policy that allows only this server's own script and
style, no inline code and no framing; the script inserts every piece of data as text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastmcp.server.auth import AccessToken
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from recall.auth import user_from_token
from recall.domain import audit
from recall.domain.answers import Passage, Recalled
from recall.domain.conversation import CONVERSATION_ID, conversation_ref, is_recalled
from recall.domain.errors import EngineError, NotFound, StoreUnavailable
from recall.reading import find, turn_text
from recall.store import Store
from recall.transport import BodyTooLarge, read_limited

log = logging.getLogger("recall.memory")

STATIC = Path(__file__).resolve().parent / "static"
ERASE_WORD = "erase"  # what the person types to erase everything
MAX_BODY_BYTES = 16 * 1024  # a query or an id: anything larger is not the page talking
BODY_TIMEOUT = 10.0  # seconds for such a small body
FIRST_LINE_CHARS = 160  # what the list shows of a conversation's first turn
# The audit comes a page at a time: a page's work (reading it, linking its passages) is bounded
# by its size, whatever the audit and the conversations hold.
AUDIT_PAGE = 20
MAX_AUDIT_PAGE = 100
PAGE_NEIGHBOURS = 1  # turns shown before and after a search's hit: the exchange it sits in
SPEAKERS = {"user": "You", "assistant": "Assistant"}  # who said a turn, to its person

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
RETRY_LATER = {"Retry-After": "5"}  # the store is down: seconds before a retry may succeed


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


# --- a user's conversations as the page shows them ------------------------------------------


def page_turns(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One conversation's stored lines as the page shows them."""
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


def first_line(turns: list[dict[str, Any]]) -> str:
    """What names a conversation to its person: its first turn's first line (it has no title)."""
    text = next((t["text"] for t in turns if t["text"].strip()), "").strip()
    return text.splitlines()[0][:FIRST_LINE_CHARS] if text else ""


def summary(user: str, conversation_id: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """A conversation in the list: its id and reference (by which the page opens it, as the
    agent's read tool does), dates, first line and number of turns."""
    return {
        "conversation_id": conversation_id,
        "ref": conversation_ref(user, conversation_id),
        "date": turns[0]["ts"],
        "last": turns[-1]["ts"],
        "first_line": first_line(turns),
        "turns": len(turns),
    }


async def list_conversations(store: Store, user: str) -> list[dict[str, Any]]:
    """Every readable conversation, newest first (by its first turn), with its first line."""
    found = [
        summary(user, conversation_id, page_turns(lines))
        for conversation_id, lines in (await store.conversations(user)).items()
        if lines
    ]
    found.sort(key=lambda c: (c["date"], c["conversation_id"]), reverse=True)
    return found


def speaker(role: str) -> str:
    """A role as the person reads it: they are "You"."""
    return SPEAKERS.get(role, role.capitalize())


@dataclass(frozen=True)
class Stored:
    """One conversation as a page of passages shows it: its turns as the page shows them, where
    each turn id sits among them, and its name."""

    conversation_id: str
    turns: list[dict[str, Any]]
    index: dict[str, int]  # turn id -> position in turns
    title: str

    def said(self, at: int) -> dict[str, Any]:
        """The turn at position ``at``, as a person reads it: its number, who said it, when."""
        turn = self.turns[at]
        return {
            "number": turn["seq"] + 1,
            "ts": turn["ts"],
            "role": turn["role"],
            "speaker": speaker(turn["role"]),
            "text": turn["text"],
            "recalled": turn["recalled"],
        }


async def read_conversations(
    store: Store, user: str, conversation_ids: Iterable[str]
) -> dict[str, Stored]:
    """The conversations passages name, each read once; one forgotten (or unreadable right now)
    is missing, and its passages lead nowhere."""
    found = {}
    for conversation_id in dict.fromkeys(conversation_ids):
        if not CONVERSATION_ID.fullmatch(conversation_id):
            continue
        try:
            lines = await store.turns(user, conversation_id) or []
        except (OSError, ValueError):  # unreadable right now: no link
            continue
        lines = [line for line in lines if isinstance(line, dict)]
        if not lines:
            continue
        turns = page_turns(lines)
        index = {
            line["turn_uuid"]: at
            for at, line in enumerate(lines)
            if isinstance(line.get("turn_uuid"), str)
        }
        found[conversation_id] = Stored(conversation_id, turns, index, first_line(turns))
    return found


def reference(hit: dict[str, Any]) -> tuple[str, str] | None:
    """The (conversation id, turn id) a served passage names; None on an audit line from before
    passages named their turn."""
    conversation_id, turn_id = hit.get("conversation_id"), hit.get("turn")
    if isinstance(conversation_id, str) and isinstance(turn_id, str):
        return conversation_id, turn_id
    return None


def place(hit: dict[str, Any], stored: dict[str, Stored]) -> tuple[Stored, int] | None:
    """The stored conversation and position of the turn a served passage names, if still stored."""
    where = reference(hit)
    conversation = stored.get(where[0]) if where else None
    at = conversation.index.get(where[1]) if conversation and where else None
    return None if conversation is None or at is None else (conversation, at)


def linked(user: str, hit: dict[str, Any], stored: dict[str, Stored]) -> dict[str, Any]:
    """A served passage with the turn it leads to (none when it is no longer stored, or names
    none): its conversation, seq and name, the reference and turn number by which the page opens
    it, and who said it (funes names no role: the stored turn does)."""
    found = place(hit, stored)
    if found is None:
        return {**hit, "turns": []}
    conversation, at = found
    turn = conversation.turns[at]
    link = {
        "conversation_id": conversation.conversation_id,
        "seq": turn["seq"],
        "ref": conversation_ref(user, conversation.conversation_id),
        "turn": turn["seq"] + 1,
        "title": conversation.title,
    }
    return {**hit, "role": turn["role"], "speaker": speaker(turn["role"]), "turns": [link]}


def as_read(user: str, passage: Passage, stored: dict[str, Stored]) -> dict[str, Any] | None:
    """One passage of a search, as the person reads it: the whole turn it came from (who, when,
    which turn of which conversation) and the turns around it, from the store, never parsed out
    of the agent's text. None when the turn is no longer stored (forgotten since)."""
    hit = linked(user, audit.served(passage), stored)
    found = place(hit, stored)
    if found is None:
        return None
    conversation, at = found
    before = range(max(at - PAGE_NEIGHBOURS, 0), at)
    after = range(at + 1, min(at + 1 + PAGE_NEIGHBOURS, len(conversation.turns)))
    return {
        **hit,
        **conversation.said(at),
        "title": conversation.title,
        "before": [conversation.said(n) for n in before],
        "after": [conversation.said(n) for n in after],
    }


def notes(recalled: Recalled) -> list[str]:
    """The answer's lines outside its passages (the passages' spans, as the engine told them):
    what it says beside them (an identifier no conversation mentions, more passages match), or
    the whole answer when it has none."""
    outside, at = [], 0
    for passage in recalled.passages:
        outside.append(recalled.text[at : passage.start])
        at = passage.end
    outside.append(recalled.text[at:])
    lines = (line.strip() for part in outside for line in part.splitlines())
    return [line for line in lines if line and line != "---"]


# --- the routes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryApi:
    """The page and /api/me, wired to the server's own parts (recall_server.py)."""

    store: Store
    user_key: Callable[[str], str]  # the user's hash: what the store is keyed by
    search: Callable[[str, str], Awaitable[Recalled]]  # the tool's search: bounds, fail-soft
    user_claim: str  # JWT_USER_CLAIM
    required_scopes: list[str]  # the verifier's, as /mcp requires them
    clean_query: Callable[[str], str]  # the tool's own: what a query searched is

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
                return await handler(request, self.user_key(user))
            except BadRequest as exc:
                return error(exc.status, str(exc))
            except StoreUnavailable:
                return error(503, "store: unavailable right now; try again", RETRY_LATER)

        return endpoint

    async def me(self, request: Request, _: str) -> Response:
        token = verified_token(request)
        return answer({"user": user_from_token(token, self.user_claim) if token else None})

    async def conversations(self, _: Request, user: str) -> Response:
        found = await list_conversations(self.store, user)
        return answer({"conversations": found})

    async def conversation(self, request: Request, user: str) -> Response:
        """One conversation, by its reference (the page's links, as the agent reads it) or by
        its id."""
        body = await json_body(request)
        field = "ref" if "ref" in body else "conversation_id"
        try:
            if field == "ref":
                if not isinstance(ref := body["ref"], str):
                    raise BadRequest("ref: must be a string")
                found = await find(self.store, user, ref)
            else:
                conversation_id = checked_id(body.get("conversation_id"))
                lines = await self.store.turns(user, conversation_id)
                found = None if lines is None else (conversation_id, lines)
        except (OSError, ValueError):
            return error(503, f"{field}: stored but not readable right now")
        if found is None:
            return error(404, f"{field}: no such conversation (or it was forgotten)")
        conversation_id, lines = found
        return answer(
            {
                "conversation_id": conversation_id,
                "ref": conversation_ref(user, conversation_id),
                "turns": page_turns(lines),
            }
        )

    async def search_memory(self, request: Request, user: str) -> Response:
        body = await json_body(request)
        query = body.get("query")
        if not isinstance(query, str):
            raise BadRequest("query: must be a string")
        query = self.clean_query(query)  # exactly what the tool searches
        recalled = await self.search(user, query)
        ids = (p.conversation_id for p in recalled.passages)
        stored = await read_conversations(self.store, user, ids)
        found = [hit for p in recalled.passages if (hit := as_read(user, p, stored))]
        return answer(
            {"query": query, "answer": recalled.text, "notes": notes(recalled), "passages": found}
        )

    async def forget(self, request: Request, user: str) -> Response:
        body = await json_body(request)
        conversation_id = checked_id(body.get("conversation_id"))
        try:
            receipt = await self.store.forget(user, conversation_id, "request")
        except NotFound:
            return error(404, "conversation_id: no such conversation")
        except EngineError:  # the source is gone and tombstoned; a retry finishes the job
            log.warning("forget from the memory page for user %s: index not cleaned", user)
            return error(503, "index: could not be cleaned yet; repeat the request")
        return answer(receipt)

    async def erase(self, request: Request, user: str) -> Response:
        body = await json_body(request)
        if body.get("confirm") != ERASE_WORD:
            raise BadRequest(f'confirm: must be the word "{ERASE_WORD}"')
        return answer(await self.store.erase(user))

    async def recall_audit(self, request: Request, user: str) -> Response:
        limit = query_number(request, "limit", AUDIT_PAGE, MAX_AUDIT_PAGE)
        before = query_number(request, "before", None)
        entries, more = await self.store.audit_page(user, limit, before)
        served = [hit for entry in entries for hit in entry.get("served", [])]
        ids = [where[0] for hit in served if (where := reference(hit))]
        stored = await read_conversations(self.store, user, ids)
        for entry in entries:
            entry["served"] = [linked(user, hit, stored) for hit in entry.get("served", [])]
        return answer({"entries": entries, "next": more})


def query_number(
    request: Request, name: str, default: int | None, most: int | None = None
) -> int | None:
    """A whole number from the query string (a page's size or cursor); BadRequest names it."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise BadRequest(f"{name}: must be a whole number")
    value = int(raw)
    if most is not None and not 1 <= value <= most:
        raise BadRequest(f"{name}: must be from 1 to {most}")
    return value


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
