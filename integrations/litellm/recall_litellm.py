"""LiteLLM proxy callback: every finished chat completion is forwarded to recall-server.

In the proxy's config.yaml, with this file and recall_forward.py beside it (or installed with
`pip install ./integrations/litellm`):

    litellm_settings:
      callbacks: recall_litellm.handler

and RECALL_URL (e.g. http://recall-server:8000) and RECALL_INGEST_KEY in the proxy's
environment. The hook only queues the conversation (recall_forward.Forwarder); the chat never
waits for recall-server nor fails because of it. Which identity becomes recall's `user`, and the
conversation id, are in docs/gateways.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from typing import Any

from recall_forward import Forwarder, TurnClock, rfc3339, turns_from_messages

try:  # LiteLLM calls the async hooks of CustomLogger instances only
    from litellm.integrations.custom_logger import CustomLogger
except ImportError:  # the module's logic stays usable (and testable) without LiteLLM
    CustomLogger = object  # type: ignore[assignment,misc]

log = logging.getLogger("recall_forward")
CONVERSATION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _metadata(kwargs: dict[str, Any]) -> dict[str, Any]:
    payload = kwargs.get("standard_logging_object") or {}
    return payload.get("metadata") or {}


def recall_user(kwargs: dict[str, Any]) -> str | None:
    """The request's `user` (the end user the caller names), else the virtual key's user."""
    payload = kwargs.get("standard_logging_object") or {}
    metadata = _metadata(kwargs)
    for found in (
        payload.get("end_user"),
        metadata.get("user_api_key_end_user_id"),
        metadata.get("user_api_key_user_id"),
    ):
        if isinstance(found, str) and found.strip():
            return found
    return None


def conversation_id(kwargs: dict[str, Any], user: str, messages: list[dict[str, Any]]) -> str:
    """The request's session (litellm_session_id, or metadata session_id / trace_id); without
    one, a stable id from the user and the conversation's first message, which every later
    request of the same chat repeats."""
    params = kwargs.get("litellm_params") or {}
    requested = _metadata(kwargs).get("requester_metadata") or {}
    for found in (
        params.get("litellm_session_id"),
        requested.get("session_id"),
        requested.get("trace_id"),
    ):
        if isinstance(found, str) and found:
            if CONVERSATION_ID.fullmatch(found):
                return found
            return "h-" + hashlib.sha256(found.encode()).hexdigest()[:24]
    first = messages[0].get("content") if messages else ""
    seed = f"{user}\0{first}".encode()
    return "chat-" + hashlib.sha256(seed).hexdigest()[:24]


def response_message(response_obj: Any) -> dict[str, Any] | None:
    """The first choice's message of a chat completion, as a dict."""
    choices = getattr(response_obj, "choices", None)
    if choices is None and isinstance(response_obj, dict):
        choices = response_obj.get("choices")
    if not choices:
        return None
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if message is None:
        message = getattr(choices[0], "message", None)
    if hasattr(message, "model_dump"):
        message = message.model_dump()
    return message if isinstance(message, dict) else None


class RecallLogger(CustomLogger):  # type: ignore[misc,valid-type]
    def __init__(self, url: str | None = None, key: str | None = None, **limits: Any) -> None:
        super().__init__()
        url = url or os.environ.get("RECALL_URL", "")
        key = key or os.environ.get("RECALL_INGEST_KEY", "")
        self.forwarder = Forwarder(url, key, **limits) if url and key else None
        self.clock = TurnClock()
        if self.forwarder is None:
            log.warning("recall: RECALL_URL or RECALL_INGEST_KEY not set; not forwarding")

    def body(self, kwargs: dict[str, Any], response_obj: Any, end: float) -> dict[str, Any] | None:
        """The POST /turns body for one finished completion: its messages plus the answer."""
        user = recall_user(kwargs)
        messages = [m for m in kwargs.get("messages") or [] if isinstance(m, dict)]
        answer = response_message(response_obj)
        if not user or not messages:
            return None
        cid = conversation_id(kwargs, user, messages)
        turns = turns_from_messages(
            messages + ([answer] if answer else []), cid, self.clock, rfc3339(end)
        )
        return {"user": user, "conversation_id": cid, "turns": turns} if turns else None

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self.forward(kwargs, response_obj, end_time)

    def log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self.forward(kwargs, response_obj, end_time)

    def forward(self, kwargs: dict[str, Any], response_obj: Any, end_time: Any) -> None:
        """Queue the conversation; never raises into LiteLLM, never blocks."""
        if self.forwarder is None:
            return
        try:
            end = end_time.timestamp() if hasattr(end_time, "timestamp") else float(end_time)
            body = self.body(kwargs, response_obj, end)
            if body:
                self.forwarder.submit(body)
        except Exception as exc:  # the chat must never fail because of memory
            log.warning("recall: completion not forwarded (%s)", type(exc).__name__)


handler = RecallLogger()
