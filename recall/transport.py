"""Connection bounds that uvicorn's h11 server lacks, and a request body read within bounds.

uvicorn accepts sockets without limit and refuses (503) only once a request head has arrived; it
times out idle keep-alive connections but never a request head that does not finish. So a few
hundred silent or half-sent connections held every descriptor, and then asyncio logged a
traceback for each failed accept, thousands a second. Here a connection past MAX_CONNECTIONS is
answered 503 and closed the moment it is accepted; a connection must deliver a whole request
head within KEEPALIVE_TIMEOUT of opening or of its last response, whatever else it trickles in;
and MAX_CONNECTIONS is checked against the open-files limit at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import sys
import time
from typing import ClassVar

import h11
import uvicorn
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from recall.settings import Settings

log = logging.getLogger("recall")

# asyncio accepts up to `backlog` sockets in one go, before any of them can be refused: a small
# batch bounds the descriptors a flood holds (uvicorn's default is 2048).
ACCEPT_BACKLOG = 128
# Descriptors besides client sockets: the log, the listening socket, index files, engine
# subprocess pipes.
DESCRIPTOR_HEADROOM = 100
LOG_INTERVAL = 10.0  # seconds: under a flood, one warning line per interval
OUT_OF_FILES = "socket.accept() out of system resource"  # asyncio's message
STARTUP_FAILURE = 3  # uvicorn's exit status for a start that failed; ours for a refused database


class Refusal:
    """Why this server stops serving for good: its database refused it, at start or later (a
    replica started during an outage). Said once, in one line; the process then exits with
    STARTUP_FAILURE, as uvicorn's own failed start does, and no traceback."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.server: uvicorn.Server | None = None

    def refuse(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            log.error("not serving: %s", reason)
        if self.server is not None:
            self.server.should_exit = True


def serve(app: ASGIApp, settings: Settings, refusal: Refusal | None = None) -> None:
    """Run the app under uvicorn with the bounds from settings (after fit_descriptor_limit);
    exit with STARTUP_FAILURE once ``refusal`` was refused."""
    logging.getLogger("asyncio").addFilter(OneLineWhenOutOfFiles())
    # Stateless /mcp: the SDK's "Terminating session: None" after every call says nothing.
    logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)
    refusal = refusal or Refusal()
    config = uvicorn.Config(
        _quiet_refusal(app, refusal),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # no formatter of uvicorn's own: its lines take ours (recall/logs.py)
        http=bounded_h11(settings.max_connections),
        # uvicorn counts the asking connection itself, and refuses once this many requests are
        # still running (a tool call goes on after its client has left).
        limit_concurrency=settings.max_connections + 1,
        timeout_keep_alive=settings.keepalive_timeout,  # type: ignore[arg-type]  # a float works
        backlog=ACCEPT_BACKLOG,
    )
    # uvicorn.run's own steps, with the server at hand: a refusal after start stops it.
    refusal.server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        refusal.server.run()  # a failed start exits here (uvicorn: status 3)
    if refusal.reason is not None:
        sys.exit(STARTUP_FAILURE)


def _quiet_refusal(app: ASGIApp, refusal: Refusal) -> ASGIApp:
    """``app``, except that a start it failed by a refusal (already said in one line) reaches
    uvicorn without the traceback uvicorn would log."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            return await app(scope, receive, send)

        async def send_quietly(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed" and refusal.reason is not None:
                message = {"type": message["type"], "message": ""}
            await send(message)

        return await app(scope, receive, send_quietly)

    return wrapped


def port_taken(host: str, port: int) -> str | None:
    """The one line to stop with when another program listens on PORT, checked before anything
    starts: uvicorn found out only after "Application startup complete." and said no more than
    "[Errno 98] ... address already in use". Binds as uvicorn's asyncio server will (each
    address HOST names, SO_REUSEADDR, IPv6 only on IPv6), then lets go."""
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError:  # a HOST that names nothing: uvicorn's own error says so
        return None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    other = port + 1 if port < 65535 else port - 1
                    return (
                        f"port {port} on {host} is already in use: stop the server that holds "
                        f"it, or choose another port with PORT (e.g. PORT={other})"
                    )
    return None


def fit_descriptor_limit(max_connections: int) -> str | None:
    """Raise the soft open-files limit to fit MAX_CONNECTIONS; the problem if the hard one can't."""
    needed = max_connections + ACCEPT_BACKLOG + DESCRIPTOR_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    if hard != resource.RLIM_INFINITY and hard < needed:
        return (
            f"MAX_CONNECTIONS={max_connections} needs {needed} open files and the limit is "
            f"{hard}: lower MAX_CONNECTIONS or raise the limit (ulimit -n)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return None


def bounded_h11(max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with at most `max_connections` open and a deadline for heads."""
    body = b'{"error": "connections: more than %d open, retry later"}' % max_connections
    refusal = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )

    class BoundedH11Protocol(H11Protocol):
        refused: ClassVar[int] = 0
        last_warning: ClassVar[float] = float("-inf")
        head_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self.refuse()
            else:
                self.expect_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.serving():  # a whole head is in
                self.cancel_head_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.expect_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self.cancel_head_deadline()
            super().connection_lost(exc)

        def expect_head(self) -> None:
            # Unlike uvicorn's keep-alive timer, bytes that are not a whole head (the start of
            # one, or the rest of a body already answered, say with 408) do not stop this one.
            self.cancel_head_deadline()
            self.head_deadline = self.loop.call_later(self.timeout_keep_alive, self.head_overdue)

        def head_overdue(self) -> None:
            self.head_deadline = None
            if not self.serving():
                self.transport.close()

        def serving(self) -> bool:
            """Whether a request head is in and its response not yet sent."""
            return self.conn.our_state is h11.SEND_RESPONSE

        def cancel_head_deadline(self) -> None:
            if self.head_deadline is not None:
                self.head_deadline.cancel()
                self.head_deadline = None

        def refuse(self) -> None:
            self.transport.write(refusal)
            self.transport.close()
            cls = type(self)
            cls.refused += 1
            now = time.monotonic()
            if now - cls.last_warning >= LOG_INTERVAL:
                log.warning(
                    "MAX_CONNECTIONS (%d) open: refused %d connections since the last warning",
                    max_connections,
                    cls.refused,
                )
                cls.refused, cls.last_warning = 0, now

    return BoundedH11Protocol


class OneLineWhenOutOfFiles(logging.Filter):
    """For asyncio's logger: out of descriptors, asyncio logs a traceback for every failed
    accept, thousands a second (it retries the whole batch); keep one line per LOG_INTERVAL."""

    def __init__(self) -> None:
        super().__init__()
        self.last = float("-inf")

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(OUT_OF_FILES):
            return True
        now = time.monotonic()
        if now - self.last < LOG_INTERVAL:
            return False
        self.last = now
        record.msg = (
            "out of open files, accepting no connections for now (MAX_CONNECTIONS too high?)"
        )
        record.args, record.exc_info = (), None
        return True


class BodyTooLarge(Exception):
    pass


async def read_limited(request: Request, limit: int, deadline: float) -> bytes:
    """The request body, refusing (without buffering) anything over `limit` bytes, and anything
    not in whole after `deadline` seconds (TimeoutError): a stalled upload frees its slot."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async with asyncio.timeout(deadline):
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
    return b"".join(chunks)
