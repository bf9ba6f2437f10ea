"""recall-server: lets an agent search the current user's own earlier conversations.

Request handling and wiring: the HTTP routes, the MCP tools, the lifespan and the command line.
The write and read paths, the package map and where new code goes: docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_access_token
from mcp_types import ToolAnnotations
from pydantic import Field
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from recall import audit, reading
from recall.auth import MCP_PATH, TokenFirst, build_verifier, client_of, user_from_token
from recall.concurrency import BoundedRuns, Glance
from recall.conversations import PRIVATE_UMASK
from recall.domain.answers import (
    NO_MEMORY,
    NOT_YET,
    NOTHING_FOUND,
    UNAVAILABLE,
    Recalled,
    still_indexing,
)
from recall.domain.conversation import (
    LONE_SURROGATE,
    parse_audit_request,
    parse_conversation,
    parse_request,
    user_dir_name,
)
from recall.domain.errors import (
    EngineError,
    Forgotten,
    InvalidConversation,
    NotFound,
    StoreUnavailable,
)
from recall.domain.forgetting import forgotten_message
from recall.engines.factory import make_engine
from recall.files_store import FilesStore, hold_data_dir
from recall.lifecycle import sweep_forever
from recall.logs import Refusals, configure_logging, user_fields
from recall.memory_api import MemoryApi
from recall.metrics import Metrics, recall_timed_out
from recall.reading import checked_turns
from recall.settings import ConfigError, Settings, load_settings, settings_help
from recall.store import AuditLine, Mark, Store
from recall.transport import (
    BodyTooLarge,
    Refusal,
    fit_descriptor_limit,
    port_taken,
    read_limited,
    serve,
)

log = logging.getLogger("recall")
REFUSALS = Refusals(log)  # why requests were refused: each reason at INFO, rate-limited

T = TypeVar("T")  # what a keyed route parses its body into
RETRY_AFTER_SECONDS = 5  # a 503 of a store that is down: when the gateway may try again
# /healthz and /metrics wait this long at most for a figure from the store (the database): a
# liveness probe allows 1 s (Kubernetes' default), the image's HEALTHCHECK 4 s.
GLANCE_SECONDS = 0.25
MAX_QUERY_CHARS = 500  # a query is a few words; the cap bounds what one call can make us scan
# Durable writes are short (a file, two fsyncs); their own few threads, so that nothing else
# (index runs, recalls) can make the gateway's post wait for a thread.
WRITE_THREADS = 4

TOOL_DESCRIPTION = """\
Search this user's own earlier conversations with you and get back dated, word-for-word passages.

Use it whenever the user points back at something said before: "last time", "earlier", "as we
discussed", "what did we decide", "who owns", "the numbers we used", a ticket or ID they expect
you to know. Look it up before asking them to repeat themselves.

Query with a few words built around identifiers and key nouns ("MT-4471 K-2 ticket",
"N-11 upgrade decision", "forecast base case parameters"), not a whole sentence. If the first
search misses, search again with other words. Quote what comes back with its date; never fill
gaps with guesses, and say so when the earlier conversations do not contain the answer.

Passages and their neighbouring turns may be cut ("…"). Each passage's header ends with
"ref <ref> turn <n>": when you need a turn word for word (an exact error message, a table, the
numbers) or what was said around it, call read_my_conversation with that ref and turn range
rather than searching again."""

READ_DESCRIPTION = """\
Read turns of one of this user's own earlier conversations whole, word for word and dated.

Use it after recall_my_conversations, when a passage or a neighbouring turn was cut ("…") or
you need what was said just before or after it: pass the ref from the passage's header
("ref <ref> turn <n>") and the turns you want, e.g. from_turn=n-1, to_turn=n+1. It does not
search: to find something, use recall_my_conversations. The answer is capped in length; its
last line says which turns were shown of how many and gives the exact call that reads on."""

REF_DESCRIPTION = (
    "The conversation's reference, from a passage header of recall_my_conversations "
    '("ref <ref> turn <n>"): 12 hexadecimal characters.'
)
FROM_TURN_DESCRIPTION = "The first turn to read (turns are numbered from 1, as the headers show)."
TO_TURN_DESCRIPTION = (
    "The last turn to read (at least from_turn); leave it out to read on to the end, as far "
    "as the answer's cap allows."
)


def read_only_tool(title: str) -> ToolAnnotations:
    """Both tools only read the user's own stored conversations (not the web)."""
    return ToolAnnotations(
        title=title,
        read_only_hint=True,
        destructive_hint=False,
        idempotent_hint=True,
        open_world_hint=False,
    )


READ_ANNOTATIONS = read_only_tool("Read one of my earlier conversations")

QUERY_DESCRIPTION = f"""\
A few words built around identifiers and key nouns, e.g. "MT-4471 K-2 ticket" or "N-11 upgrade \
decision", not a whole sentence. At most {MAX_QUERY_CHARS} characters; longer is cut."""

TOOL_ANNOTATIONS = read_only_tool("Search my earlier conversations")

USAGE = """\
usage: recall-server                 serve the MCP endpoint /mcp, POST /turns, GET /healthz,
                                     /readyz, /metrics and POST /forget, /erase, /receipts, /audit
       recall-server backfill FILE   import a history in bulk while the server is stopped
                                     (recall-server backfill --help)
       recall-server migrate         STORE=postgres: create or upgrade the schema, as the
                                     tables' owner (recall-server migrate --help)
       recall-server import DATA_DIR load a files store into PostgreSQL; export --user USER
                                     --out DIR writes one user's conversations back as files
       recall-server --help          this text

Settings are environment variables (default after =):
"""


def describe(exc: Exception) -> str:
    """A failure's cause for the log: our own messages hold no user text; others by type only."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) if isinstance(exc, EngineError) else type(exc).__name__


def search_query(query: str) -> str:
    """What a query searches, from the tool and the memory page alike: trimmed, a cut character
    (a lone UTF-16 surrogate, which the page's JSON may carry) made U+FFFD, at most
    MAX_QUERY_CHARS."""
    return LONE_SURROGATE.sub("\ufffd", query.strip())[:MAX_QUERY_CHARS]


def error(status: int, message: str) -> JSONResponse:
    """A refusal: its message names the field and the rule, never a value, so it is logged too."""
    REFUSALS.note(f"request refused ({status}): {message}")
    return JSONResponse({"error": message}, status_code=status)


def unavailable() -> JSONResponse:
    """The store cannot be reached (the database is down): nothing was done; retry later."""
    response = error(503, "store: unavailable right now; nothing was stored or changed, retry")
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def make_store(settings: Settings, writes: ThreadPoolExecutor, metrics: Metrics) -> Store:
    """STORE=files: DATA_DIR and funes or the embedded engine; STORE=postgres: DATABASE_URL."""
    if settings.store == "postgres":
        from recall.pg.store import from_settings  # psycopg is needed only there

        return from_settings(settings)
    return FilesStore(
        settings.data_dir.resolve(),
        make_engine(settings),
        writes,
        debounce=settings.index_debounce,
        index_concurrency=settings.index_concurrency,
        measure_index=metrics.index,
    )


def create_app(settings: Settings) -> Starlette:
    os.umask(PRIVATE_UMASK)  # whatever builds the app: all it and its workers create is private
    if problems := settings.problems():
        raise ConfigError("; ".join(problems))
    if not (allowed_hosts := settings.host_allowlist()):
        raise ConfigError(
            f"HOST {settings.host} is not loopback: set ALLOWED_HOSTS to the host names "
            "clients reach this server by (comma-separated)"
        )
    verifier = build_verifier(settings)
    limits = settings.limits()
    ingest_key = settings.ingest_key.encode()
    recalls = BoundedRuns(settings.recall_concurrency, settings.recall_timeout)
    writes = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="recall-write")
    metrics = Metrics()
    store = make_store(settings, writes, metrics)
    # Gauges read at scrape time; the vector cache is the embedded engine's or the database's.
    metrics.watch(recalls, getattr(store, "engine", store))
    # The store's figures for the probes, read without waiting on a database that is down.
    indexing_now = Glance(store.indexing, GLANCE_SECONDS)
    index_lag_now = Glance(store.index_lag, GLANCE_SECONDS)
    refusal = Refusal()  # main() exits with status 3 once the store refused to serve

    async def stop_when_refused() -> None:
        # A replica started while the database was down checks its role and schema on the first
        # connection that succeeds: refused then, it stops rather than serve (status 3).
        refusal.refuse(await store.refused())

    @asynccontextmanager
    async def lifespan(_: FastMCP) -> AsyncIterator[dict[str, Any]]:
        try:
            await store.start()  # catches up on what changed while we were down
        except ConfigError as exc:  # one line, no traceback; nothing of the store left running
            await store.close()
            refusal.refuse(str(exc))
            raise
        watch = asyncio.create_task(stop_when_refused())
        log.info("serving with the %s", store.describe())
        # Where the write route's key comes from, for whoever follows the README (never the key).
        log.info("POST /turns takes this server's INGEST_KEY environment variable in x-ingest-key")
        sweeper = None
        if settings.retention_days > 0:
            sweeper = asyncio.create_task(
                sweep_forever(store, settings.retention_days, settings.retention_sweep_seconds)
            )
        try:
            yield {}
        finally:
            for task in (watch, sweeper):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            await indexing_now.close()
            await index_lag_now.close()
            await recalls.close()
            await store.close()
            writes.shutdown()

    mcp = FastMCP("recall", auth=verifier, lifespan=lifespan)

    # --- write path -------------------------------------------------------------------------

    async def keyed_body(request: Request) -> bytes | JSONResponse:
        """The body of a request to an ingest-key route, or the refusal to send."""
        # Custom routes sit outside FastMCP's auth: check the shared key here, in constant time.
        provided = request.headers.get("x-ingest-key", "").encode("latin-1")
        if not hmac.compare_digest(provided, ingest_key):
            return error(401, "x-ingest-key: missing or wrong")
        try:
            return await read_limited(request, settings.max_body_bytes, settings.body_timeout)
        except BodyTooLarge:
            return error(413, f"body: larger than {settings.max_body_bytes} bytes")
        except TimeoutError:
            return error(408, f"body: not received within {settings.body_timeout:g} s")

    async def keyed_request(request: Request, parse: Callable[[Any], T]) -> T | JSONResponse:
        """A keyed route's body, read and parsed by ``parse`` (InvalidConversation names the
        field), or the refusal to send."""
        if isinstance(raw := await keyed_body(request), JSONResponse):
            return raw
        try:
            return parse(json.loads(raw))
        except (ValueError, RecursionError) as exc:  # InvalidConversation is a ValueError
            message = str(exc) if isinstance(exc, InvalidConversation) else "body: not valid JSON"
            return error(400, message)

    def user_only(body: Any) -> str:
        return parse_request(body, limits, conversation=False)[0]

    @mcp.custom_route("/turns", methods=["POST"])
    @metrics.ingest
    async def ingest(request: Request) -> JSONResponse:
        conversation = await keyed_request(request, lambda body: parse_conversation(body, limits))
        if isinstance(conversation, JSONResponse):
            return conversation
        user = user_dir_name(conversation.user)
        if conversation.redactions:  # kinds and counts only, never a value
            log.info("user %s: redacted %s", user, conversation.redaction_summary())
        # Durable (committed) before 202. A stale re-post (an older snapshot of what is stored)
        # writes nothing. Tombstones: a forgotten (or erased) turn is never stored again.
        try:
            written = await store.put(user, conversation)
        except Forgotten:  # the receipts say which operation it was (both stores keep them)
            try:
                found = await store.receipts(user)
            except StoreUnavailable:
                found = []
            return error(410, forgotten_message(found, conversation.conversation_id))
        except StoreUnavailable:
            return unavailable()
        if not written:
            log.info("user %s: post already stored, nothing written", user)
        return JSONResponse({"stored": conversation.conversation_id}, status_code=202)

    # --- the data lifecycle (recall/lifecycle.py): the user in the body, never in a URL -----

    @mcp.custom_route("/forget", methods=["POST"])
    async def forget(request: Request) -> JSONResponse:
        parsed = await keyed_request(
            request, lambda body: parse_request(body, limits, conversation=True)
        )
        if isinstance(parsed, JSONResponse):
            return parsed
        user, conversation_id = user_dir_name(parsed[0]), parsed[1]
        try:
            receipt = await store.forget(user, conversation_id, "request")
        except NotFound:
            return error(404, "conversation_id: no such conversation for this user")
        except StoreUnavailable:
            return unavailable()
        except EngineError as exc:  # the source is gone and tombstoned; a retry finishes the job
            log.warning("forget for user %s failed: %s", user, describe(exc))
            return error(503, "index: could not be cleaned yet; repeat the request")
        return JSONResponse(receipt)

    @mcp.custom_route("/erase", methods=["POST"])
    async def erase(request: Request) -> JSONResponse:
        if isinstance(user := await keyed_request(request, user_only), JSONResponse):
            return user
        try:
            return JSONResponse(await store.erase(user_dir_name(user)))
        except StoreUnavailable:
            return unavailable()

    @mcp.custom_route("/receipts", methods=["POST"])
    async def receipts(request: Request) -> JSONResponse:
        if isinstance(user := await keyed_request(request, user_only), JSONResponse):
            return user
        user_hash = user_dir_name(user)
        try:
            found = await store.receipts(user_hash)
        except StoreUnavailable:
            return unavailable()
        return JSONResponse({"user": user_hash, "receipts": found})

    @mcp.custom_route("/audit", methods=["POST"])
    async def audit_log(request: Request) -> JSONResponse:
        """A user's recall audit, for the gateway or an admin: {"user", "since"?} in the body
        (never in the URL, where access logs would keep it)."""
        parsed = await keyed_request(request, lambda body: parse_audit_request(body, limits))
        if isinstance(parsed, JSONResponse):
            return parsed
        user, since = parsed
        try:
            entries = await store.audit(user_dir_name(user), since)
        except StoreUnavailable:
            return unavailable()
        return JSONResponse({"entries": entries})

    @mcp.custom_route("/healthz", methods=["GET"])
    async def healthz(_: Request) -> JSONResponse:
        # Liveness: answers at once whatever the database does (a probe that waited on it would
        # restart every replica during a failover). "indexing": users whose index run is due or
        # going on (0: every write went through a run), null when the store did not say within
        # GLANCE_SECONDS; the seeder waits for 0 so that the demo's first search finds it all.
        indexing = await indexing_now()
        return JSONResponse(
            {"status": "ok", "store": store.name, "engine": store.engine_name, "indexing": indexing}
        )

    @mcp.custom_route("/readyz", methods=["GET"])
    async def readyz(_: Request) -> JSONResponse:
        # Can requests succeed: the store takes a write (DATA_DIR, the database), the engine
        # can answer.
        if failed := await store.ready():
            return JSONResponse({"status": "not ready", "failed": failed}, status_code=503)
        return JSONResponse({"status": "ready", "store": store.name, "engine": store.engine_name})

    @mcp.custom_route("/metrics", methods=["GET"])
    async def metrics_page(request: Request) -> Response:
        if refused := metrics.refused(request, settings.metrics_token):
            return refused
        # The process' own figures always; the index backlog's when the store says it in time.
        return metrics.page(await index_lag_now())

    # --- read path --------------------------------------------------------------------------

    @mcp.tool(
        description=TOOL_DESCRIPTION,
        title=TOOL_ANNOTATIONS.title,
        annotations=TOOL_ANNOTATIONS,
        # The answer goes out once, as text. With an output schema FastMCP would send it again
        # as structuredContent ({"result": ...}): twice the characters in a client that shows both.
        output_schema=None,
    )
    async def recall_my_conversations(
        query: Annotated[str, Field(description=QUERY_DESCRIPTION)],
    ) -> str:
        query = search_query(query)
        return await as_caller(
            lambda user, mark: search(user, query, mark),
            lambda client, answer: audit.entry(client, query, answer),
        )

    @mcp.tool(
        description=READ_DESCRIPTION,
        title=READ_ANNOTATIONS.title,
        annotations=READ_ANNOTATIONS,
        output_schema=None,  # once, as text: as the search
    )
    async def read_my_conversation(
        ref: Annotated[str, Field(description=REF_DESCRIPTION)],
        from_turn: Annotated[int, Field(description=FROM_TURN_DESCRIPTION)] = 1,
        to_turn: Annotated[int | None, Field(description=TO_TURN_DESCRIPTION)] = None,
    ) -> str:
        try:
            checked_turns(from_turn, to_turn)
        except ValueError as exc:  # the argument named first; nothing read, nothing audited
            # The agent's mistake, not the server's: INFO, not FastMCP's default ERROR.
            raise ToolError(str(exc), log_level=logging.INFO) from exc
        ref = ref.strip()
        return await as_caller(
            lambda user, mark: read(user, ref, from_turn, to_turn, mark),
            lambda client, answer: reading.entry(client, ref, from_turn, to_turn, answer),
        )

    async def as_caller(
        answer: Callable[[str, Mark], Awaitable[Recalled]],
        audit_line: Callable[[str | None, Recalled], AuditLine],
    ) -> str:
        """A tool call for the user the verified token names (never an argument): its answer,
        recorded in that user's own audit. Fails soft, as every answer of the tools does."""
        token = get_access_token()
        user = user_from_token(token, settings.jwt_user_claim)
        if user is None:
            log.warning("tool call refused: token has no %s claim", settings.jwt_user_claim)
            return UNAVAILABLE
        user_hash = user_dir_name(user)  # from the verified token, never from an argument
        try:
            mark = await store.mark(user_hash)
        except StoreUnavailable:
            return UNAVAILABLE
        found = await answer(user_hash, mark)
        # The user's own audit: who looked up what, which passages; none when an erase overlapped.
        line = audit_line(client_of(token, user), found)
        try:
            await store.append_audit(user_hash, line, mark)
        except (OSError, StoreUnavailable) as exc:  # fail soft: the answer still goes out
            log.warning("audit for user %s not written: %s", user_hash, type(exc).__name__)
        return found.text

    async def read(
        user: str, ref: str, from_turn: int, to_turn: int | None, mark: Mark
    ) -> Recalled:
        """The read tool's answer, in the search's slots, timeout and fail-soft answers."""
        try:
            found = await recalls.run(lambda: reading.find(store, user, ref))
        except Exception as exc:
            return failed_soft(user, "read", exc)
        answer = (
            Recalled(reading.NOT_FOUND)
            if found is None
            else reading.Reading(ref, *found, from_turn, to_turn).render(settings.max_result_chars)
        )
        return await unless_erased(user, mark, answer, Recalled(reading.NOT_FOUND))

    async def page_search(user: str, query: str) -> Recalled:
        """The memory page's search: the tool's own (bounds, fail-soft), not audited."""
        try:
            mark = await store.mark(user)
        except StoreUnavailable:
            return Recalled(UNAVAILABLE)
        return await search(user, query, mark)

    @metrics.recall
    async def search(user: str, query: str, mark: Mark) -> Recalled:
        return await unless_erased(
            user, mark, await search_memory(user, query), Recalled(NO_MEMORY)
        )

    async def unless_erased(user: str, mark: Mark, found: Recalled, erased: Recalled) -> Recalled:
        """``found``, or ``erased`` when an erase came since ``mark``: a call that overlapped
        an erase may have read what it erased, and none of it goes out."""
        try:
            return erased if await store.erased_since(user, mark) else found
        except StoreUnavailable:
            return Recalled(UNAVAILABLE)

    def failed_soft(user: str, what: str, exc: Exception) -> Recalled:
        """What a tool answers when its work failed: the cause to the log, never to the agent;
        whatever went wrong, the conversation goes on."""
        log.warning("%s failed for user %s: %s", what, user, describe(exc), extra=user_fields(user))
        if isinstance(exc, TimeoutError):  # the same answer; another outcome in /metrics
            recall_timed_out()
        if isinstance(exc, EngineError):
            store.repair(user)  # an unreadable index is rebuilt, not waited on
        return Recalled(UNAVAILABLE)

    async def search_memory(user: str, query: str) -> Recalled:
        started = time.monotonic()
        try:
            state = await store.state(user)
            if state == "none":
                return Recalled(NO_MEMORY)
            if state == "pending":  # the first index run is not done: no loss, say it as it is
                store.repair(user)  # see that the run is due: the user is waiting for it
                return Recalled(NOT_YET)
            if state == "unindexed":
                # Conversations stored, and the index built for them lost (deleted, corrupt).
                log.warning(
                    "recall for user %s: no readable index; rebuilding",
                    user,
                    extra=user_fields(user),
                )
                store.repair(user)
                return Recalled(UNAVAILABLE)
            if not query:
                return Recalled(NOTHING_FOUND)
            found = await recalls.run(lambda: store.recall(user, query))
        except Exception as exc:  # fail soft
            return failed_soft(user, "recall", exc)
        seconds = time.monotonic() - started
        log.info("recall for user %s in %.3fs", user, seconds, extra=user_fields(user, seconds))
        if state == "behind":  # what the due run has not read yet is no "nothing" as a fact
            found = still_indexing(found)
        found = found.cut(settings.max_result_chars)
        return found if found.text else Recalled(NOTHING_FOUND)

    # --- the memory page (recall/memory_api.py): the person's bearer token, the tool's search ---

    memory = MemoryApi(
        store,
        user_dir_name,
        page_search,
        settings.jwt_user_claim,
        verifier.required_scopes,
        search_query,
    )
    for path, methods, endpoint in memory.routes():
        mcp.custom_route(path, methods)(endpoint)

    app = mcp.http_app(
        path=MCP_PATH,
        # The token checked first on every method of /mcp, and a 401 that clients show.
        middleware=[Middleware(TokenFirst, auth=verifier, refusals=REFUSALS)],
        # No per-client state: one token holder cannot fill a session table and lock others out.
        stateless_http=True,
        # One JSON body per call rather than an event stream: the tool sends nothing before its
        # answer, and the stream cost about a tenth of a call's CPU (benchmark/README.md, "Load").
        json_response=True,
        # DNS rebinding: a foreign Host gets 421, a foreign browser Origin 403, on every route.
        host_origin_protection=True,
        allowed_hosts=allowed_hosts,
        allowed_origins=settings.origin_allowlist(),
    )
    app.state.refusal = refusal
    return app


def main() -> None:
    os.umask(PRIVATE_UMASK)  # before anything is created under DATA_DIR, by the server or backfill
    arguments = sys.argv[1:]
    if arguments[:1] == ["backfill"]:  # the operator's bulk import, same settings, no server
        from recall.backfill import main as backfill

        sys.exit(backfill(arguments[1:]))
    if arguments[:1] == ["migrate"]:  # STORE=postgres: the schema, as the tables' owner
        from recall.pg.schema import main as migrate

        sys.exit(migrate(arguments[1:]))
    if arguments[:1] in (["import"], ["export"]):  # STORE=postgres: a files store in, a user out
        from recall.transfer import main as transfer

        sys.exit(transfer(arguments))
    if arguments[:1] in (["--help"], ["-h"]):  # before the settings: help needs none of them
        print(USAGE + settings_help())
        return
    if arguments:
        print(f"recall-server: unknown argument {arguments[0]!r}; see --help", file=sys.stderr)
        sys.exit(2)
    try:
        settings = load_settings()
    except ConfigError as exc:
        sys.exit(f"recall-server: {exc}")
    configure_logging(settings.log_level, settings.log_format, settings.secrets())
    # Before anything starts (the model, the lifespan): a taken port or DATA_DIR, in one line.
    if taken := port_taken(settings.host, settings.port):
        sys.exit(f"recall-server: {taken}")
    try:  # held until the process exits; only the files store lives in one process
        owned = hold_data_dir(settings.data_dir, "server") if settings.store == "files" else None
    except ConfigError as exc:
        sys.exit(f"recall-server: {exc}")
    try:
        app = create_app(settings)
    except ConfigError as exc:
        sys.exit(f"recall-server: {exc}")
    if problem := fit_descriptor_limit(settings.max_connections):
        sys.exit(f"recall-server: {problem}")
    # What lives as long as the server (modules, the model, FastMCP's tables) leaves the garbage
    # collector's view: its full collections over them stopped every request for 60-95 ms,
    # about twice a minute under load (benchmark/README.md, "Load").
    gc.collect()
    gc.freeze()
    serve(app, settings, app.state.refusal)  # a refused start exits here; the lock goes with us
    if owned is not None:
        os.close(owned)  # DATA_DIR is free for the next server or backfill


if __name__ == "__main__":
    main()
