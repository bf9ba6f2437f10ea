"""The app: the HTTP and MCP face of the server, one module per concern, each handed the parts
that `context.build` makes once from the settings; recall_server.create_app registers them.

- context.py: `App`, the parts (settings, store, metrics, recall slots, verifier) and the
  lifespan that starts and stops them; `build(settings)`.
- keyed.py: the shared ingest key, the bounded body and the refusals of the keyed routes.
- ingest.py: POST /turns, the write path.
- lifecycle_routes.py: POST /forget, /erase, /receipts, /audit.
- operations.py: GET /healthz, /readyz, /metrics.
- tools.py: the MCP tools recall_my_conversations and read_my_conversation.
- answers.py: what the tools and the memory page's search answer, and how each fails soft.

The memory page's routes live in recall/memory_api.py, wired the same way.
"""
