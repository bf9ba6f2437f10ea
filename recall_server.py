"""recall-server: lets an agent search the current user's own earlier conversations.

Two paths, two credentials; each route's module in brackets (recall/app/__init__.py lists them):

- Write path. The chat gateway POSTs each finished conversation (the whole conversation so far)
  to /turns with the shared `x-ingest-key`; the store keeps it durably before the 202 and
  schedules a debounced index run. [recall/app/ingest.py]
- Read path. The agent calls `recall_my_conversations(query)` and `read_my_conversation(ref,
  from_turn, to_turn)` at /mcp. The user comes from the verified bearer token, never from an
  argument; bounded, timed, capped, and both fail soft. [recall/app/tools.py; the answers and how
  they fail soft: recall/app/answers.py]
- Lifecycle: POST /forget, /erase, /receipts, /audit [recall/app/lifecycle_routes.py]; the memory
  page and its API under /api/me/ [recall/memory_api.py; its chat import:
  recall/importing/routes.py]; GET /healthz, /readyz, /metrics
  [recall/app/operations.py].

Here only this map, the wiring (create_app, which reads as the list of routes) and the command
line (main). The package map and where new code goes: docs/architecture.md.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import TYPE_CHECKING

from recall.files.layout import PRIVATE_UMASK
from recall.files.store import hold_data_dir
from recall.logs import adopt_library_loggers, configure_logging
from recall.settings import ConfigError, Settings, load_settings, settings_help
from recall.transport import STARTUP_FAILURE, Refusal, fit_descriptor_limit, port_taken, serve

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from recall.pg.database import StartCheck

USAGE = """\
usage: recall-server                 serve the MCP endpoint /mcp, POST /turns, GET /healthz,
                                     /readyz, /metrics and POST /forget, /erase, /receipts, /audit
       recall-server backfill FILE   import a history in bulk while the server is stopped
                                     (recall-server backfill --help)
       recall-server migrate         STORE=postgres: create or upgrade the schema, as the
                                     tables' owner (recall-server migrate --help)
       recall-server import DATA_DIR load a files store into PostgreSQL; export --user USER
                                     --out DIR writes one user's conversations back as files
       recall-server import-chats --format F --user U PATH
                                     import one person's ChatGPT, Claude, Claude Code, Codex
                                     or Open WebUI export (docs/import.md)
       recall-server --help          this text

Settings are environment variables (default after =):
"""


def create_app(settings: Settings, checked: StartCheck | None = None) -> Starlette:
    """The server for ``settings``: its parts built once, its routes and tools registered, the
    Starlette app uvicorn serves (ConfigError names what cannot serve). ``checked``: what
    main's check of the database found, so the lifespan does not connect for it again."""
    # Imported here, not at the top: FastMCP, the app and the engine they load take about a
    # CPU-second, which a start that main() refuses for its settings never pays.
    from fastmcp import FastMCP
    from starlette.middleware import Middleware

    from recall.app import context
    from recall.app.answers import search_query
    from recall.app.ingest import Ingest
    from recall.app.keyed import REFUSALS
    from recall.app.lifecycle_routes import LifecycleRoutes
    from recall.app.operations import Operations
    from recall.app.tools import Tools
    from recall.auth import MCP_PATH, TokenFirst
    from recall.domain.conversation import user_dir_name
    from recall.importing.routes import ChatImports
    from recall.memory_api import MemoryApi

    app = context.build(settings, checked=checked)
    mcp = FastMCP("recall", auth=app.verifier, lifespan=app.lifespan)
    # The person's memory page and its API: the same bearer token as /mcp, the tool's search.
    memory = MemoryApi(
        app.store,
        user_dir_name,
        app.answers.page_search,
        settings.jwt_user_claim,
        app.verifier.required_scopes,
        search_query,
    )
    # "Bring your history": a person's chat export into their own memory, as POST /turns stores.
    imports = ChatImports(app.store, app.limits, settings.import_max_bytes)
    routes = [
        *Ingest(app).routes(),  # POST /turns: the write path
        *LifecycleRoutes(app).routes(),  # POST /forget, /erase, /receipts, /audit
        *Operations(app).routes(),  # GET /healthz, /readyz, /metrics
        *memory.routes(),  # GET /memory, /api/me/...
        ("/api/me/import", ["GET", "POST"], memory.signed_in(imports.handle)),
    ]
    for path, methods, endpoint in routes:
        mcp.custom_route(path, methods)(endpoint)
    Tools(app.answers).register(mcp)  # recall_my_conversations, read_my_conversation
    starlette = mcp.http_app(
        path=MCP_PATH,
        # The token checked first on every method of /mcp, and a 401 that clients show.
        middleware=[Middleware(TokenFirst, auth=app.verifier, refusals=REFUSALS)],
        # No per-client state: one token holder cannot fill a session table and lock others out.
        stateless_http=True,
        # One JSON body per call rather than an event stream: the tool sends nothing before its
        # answer, and the stream cost about a tenth of a call's CPU (benchmark/README.md, "Load").
        json_response=True,
        # DNS rebinding: a foreign Host gets 421, a foreign browser Origin 403, on every route.
        host_origin_protection=True,
        allowed_hosts=app.allowed_hosts,
        allowed_origins=settings.origin_allowlist(),
    )
    starlette.state.refusal = app.refusal
    return starlette


def main() -> None:
    os.umask(PRIVATE_UMASK)  # before anything is created under DATA_DIR, by the server or backfill
    arguments = sys.argv[1:]
    if arguments[:1] == ["backfill"]:  # the operator's bulk import, same settings, no server
        from recall.files.backfill import main as backfill

        sys.exit(backfill(arguments[1:]))
    if arguments[:1] == ["migrate"]:  # STORE=postgres: the schema, as the tables' owner
        from recall.pg.schema import main as migrate

        sys.exit(migrate(arguments[1:]))
    if arguments[:1] == ["import-chats"]:  # one person's chat export into their memory
        from recall.importing.cli import main as import_chats

        sys.exit(import_chats(arguments[1:]))
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
    # What the settings alone refuse, before create_app's imports: a quarter of the CPU.
    if refused := settings.refusal():
        sys.exit(f"recall-server: {refused}")
    if problem := fit_descriptor_limit(settings.max_connections):
        sys.exit(f"recall-server: {problem}")
    checked = None
    if settings.store == "postgres" and settings.database_url:
        from recall.pg.database import check_at_start  # psycopg is needed only there

        # The one check of the database, before the model: one that refuses this replica is
        # said as the lifespan says it; what it found goes to the lifespan, which connects no
        # more (a host that drops packets is waited for once).
        checked = check_at_start(settings.database_url)
        if checked.refused is not None:
            Refusal().refuse(checked.refused)
            sys.exit(STARTUP_FAILURE)
    try:
        app = create_app(settings, checked)
    except ConfigError as exc:
        sys.exit(f"recall-server: {exc}")
    adopt_library_loggers()  # FastMCP, imported by create_app, brought its own handler
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
