"""POST /turns: the chat gateway posts a finished conversation (the whole conversation so far)
with the shared key; it is validated, redacted and stored durably before the 202."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse

from recall.app.context import App
from recall.app.keyed import Keyed, Route, error, unavailable
from recall.domain.conversation import parse_conversation, user_dir_name
from recall.domain.errors import Forgotten, StoreUnavailable
from recall.domain.forgetting import forgotten_message

log = logging.getLogger("recall")


class Ingest:
    def __init__(self, app: App) -> None:
        self.app = app
        self.keyed = Keyed(app.settings)

    def routes(self) -> list[Route]:
        return [("/turns", ["POST"], self.app.metrics.ingest(self.turns))]

    async def turns(self, request: Request) -> JSONResponse:
        limits, store = self.app.limits, self.app.store
        conversation = await self.keyed.request(request, lambda b: parse_conversation(b, limits))
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
