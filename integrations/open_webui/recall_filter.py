"""
title: Recall forwarder
description: Forwards finished chats to recall-server (POST /turns); never holds up a chat.
version: 0.1.0
license: Apache-2.0
"""

# Paste this whole file into Open WebUI: Admin Panel > Functions > + (a Filter), then enable it
# globally (or per model) and set its valves. The ingest key comes from the valve or, when that
# is empty, from the RECALL_INGEST_KEY environment variable of the Open WebUI process; it is
# never logged. See docs/gateways.md in recall-server.
# The Forwarder class is a verbatim copy of integrations/litellm/recall_forward.py's.

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

RECALL_TOOL = "recall_my_conversations"


# --- Forwarder: begin (copied verbatim into integrations/open_webui/recall_filter.py) ---
class Forwarder:
    """A bounded queue of POST /turns bodies and one thread that sends them."""

    def __init__(
        self,
        url: str,
        key: str,
        max_queue: int = 1000,
        attempts: int = 4,
        backoff: float = 0.5,
        timeout: float = 5.0,
    ) -> None:
        self.endpoint = url.rstrip("/") + "/turns"
        self._key = key  # sent in x-ingest-key only; never logged
        self.attempts, self.backoff, self.timeout = attempts, backoff, timeout
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=max_queue)
        self.sent = self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="recall-forward", daemon=True)
        self._thread.start()

    def submit(self, body: dict[str, Any]) -> bool:
        """Queue one body; never blocks. False (counted, logged) when the queue is full."""
        try:
            self.queue.put_nowait(body)
            return True
        except queue.Full:
            self._drop(body, "queue full")
            return False

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every queued body was sent or dropped (for tests and shutdown)."""
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.queue.unfinished_tasks

    def _run(self) -> None:
        while True:
            body = self.queue.get()
            try:
                self._send(body)
            except Exception as exc:  # the thread must outlive any one body
                self._drop(body, type(exc).__name__)
            finally:
                self.queue.task_done()

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        why = ""
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            status, why = self._post(data)
            if status == 202:
                self.sent += 1
                return
            if 400 <= status < 500 and status not in (408, 429):
                break  # the server refused this body: the same body would be refused again
        self._drop(body, why)

    def _post(self, data: bytes) -> tuple[int, str]:
        request = urllib.request.Request(self.endpoint, data=data, method="POST")
        request.add_header("content-type", "application/json")
        request.add_header("x-ingest-key", self._key)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, f"status {response.status}"
        except urllib.error.HTTPError as exc:
            return exc.code, f"status {exc.code}"
        except (OSError, ValueError) as exc:  # refused, reset, timed out, bad URL
            return 0, type(exc).__name__

    def _drop(self, body: dict[str, Any], why: str) -> None:
        self.dropped += 1
        user = hashlib.sha256(str(body.get("user", "")).encode()).hexdigest()[:24]
        logging.getLogger("recall_forward").warning(
            "recall: conversation of user %s not forwarded (%s); dropped so far: %d",
            user,
            why,
            self.dropped,
        )


# --- Forwarder: end ---


def turn_ts(message: dict[str, Any], fallback: str) -> str:
    """A message's own time (Open WebUI keeps Unix seconds in "timestamp"), so that a re-post
    of the chat keeps each turn's date; the outlet's time where it has none."""
    stamp = message.get("timestamp")
    if isinstance(stamp, int | float) and not isinstance(stamp, bool) and stamp > 0:
        return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return fallback


def message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # text parts of a multimodal message
        parts = (p.get("text", "") for p in content if isinstance(p, dict))
        return "\n".join(p for p in parts if isinstance(p, str) and p)
    return ""


def chat_to_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Open WebUI's messages as POST /turns turns; a tool answer from recall marked recalled."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    turns = []
    for message in messages:
        role, text = message.get("role"), message_text(message.get("content"))
        if role not in ("user", "assistant", "system", "tool") or not text:
            continue
        turn: dict[str, Any] = {"role": role, "text": text, "ts": turn_ts(message, now)}
        if isinstance(message.get("id"), str) and message["id"]:
            turn["id"] = message["id"]
        if role == "tool" and message.get("name") == RECALL_TOOL:
            turn["recalled"] = True
        turns.append(turn)
    return turns


class Filter:
    class Valves(BaseModel):
        priority: int = Field(default=100, description="Run after other filters")
        recall_url: str = Field(default="http://recall-server:8000", description="Server URL")
        ingest_key: str = Field(
            default="",
            description="INGEST_KEY (empty: the RECALL_INGEST_KEY environment variable)",
            json_schema_extra={"input": {"type": "password"}},
        )
        user_field: str = Field(
            default="email",
            description="Which Open WebUI identity is the recall user: email or id. It must "
            "be what the agent's token names (AUTH_TOKENS_FILE's user, or the JWT claim).",
        )
        max_queue: int = Field(default=1000, description="Chats waiting to be sent, at most")

    def __init__(self) -> None:
        self.valves = self.Valves()
        self._forwarder: Forwarder | None = None
        self._settings: tuple[str, str, int] | None = None

    def forwarder(self) -> Forwarder | None:
        """One Forwarder for the current valves; a new one when they change."""
        key = self.valves.ingest_key or os.environ.get("RECALL_INGEST_KEY", "")
        if not key or not self.valves.recall_url:
            return None
        settings = (self.valves.recall_url, key, self.valves.max_queue)
        if self._forwarder is None or settings != self._settings:
            self._forwarder = Forwarder(self.valves.recall_url, key, self.valves.max_queue)
            self._settings = settings
        return self._forwarder

    async def inlet(self, body: dict, __user__: dict | None = None) -> dict:
        return body

    async def outlet(self, body: dict, __user__: dict | None = None) -> dict:
        """Queue the chat so far for recall-server and return the body untouched, at once."""
        try:
            self._forward(body, __user__ or {})
        except Exception as exc:  # the chat must never fail because of memory
            logging.getLogger("recall_forward").warning("recall: outlet skipped (%s)", exc)
        return body

    def _forward(self, body: dict, user: dict) -> None:
        recall_user = user.get(self.valves.user_field)
        chat_id = body.get("chat_id")
        forwarder = self.forwarder()
        if not (forwarder and recall_user and isinstance(chat_id, str) and chat_id):
            return
        turns = chat_to_turns(body.get("messages") or [])
        if turns:
            forwarder.submit({"user": recall_user, "conversation_id": chat_id, "turns": turns})
