"""Forward finished conversations to recall-server's POST /turns without ever holding up a chat.

Standard library only, so that a gateway can load it beside its own code. A gateway hook calls
`Forwarder.submit(body)`, which only puts the body on a bounded queue and returns; one daemon
thread posts it, retrying a failure a bounded number of times with backoff, and drops it with a
counted log line after them (or at once when the queue is full, or when the server refuses the
body with a 4xx). Log lines carry counts, statuses and a hash of the user: never the key, a user
id or conversation text. Open WebUI's filter carries a byte-for-byte copy of the class below
(tests/test_gateway_forwarder.py keeps the two the same).
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from typing import Any


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


def rfc3339(seconds: float) -> str:
    """A Unix time as POST /turns takes it (UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class TurnClock:
    """When each turn was first seen, so that a re-post of a conversation (the whole
    conversation so far, after every answer) keeps each earlier turn's date: a gateway whose
    messages carry no time. Bounded: the oldest entries go first; after a restart, turns seen
    before it take the time of their next post."""

    def __init__(self, max_turns: int = 100_000) -> None:
        self.max_turns = max_turns
        self._seen: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def stamp(self, conversation_id: str, position: int, role: str, text: str, now: str) -> str:
        digest = hashlib.sha256(f"{conversation_id}\0{position}\0{role}\0{text}".encode())
        key = digest.hexdigest()
        with self._lock:
            ts = self._seen.setdefault(key, now)
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_turns:
                self._seen.popitem(last=False)
        return ts


RECALL_TOOL = "recall_my_conversations"


def message_text(content: Any) -> str:
    """An OpenAI-style message's content as text: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p.get("text", "") for p in content if isinstance(p, dict))
        return "\n".join(p for p in parts if isinstance(p, str) and p)
    return ""


def recall_call_ids(messages: list[dict[str, Any]]) -> set[str]:
    """The ids of the assistant's tool calls to recall_my_conversations in these messages."""
    found = set()
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            if function.get("name") == RECALL_TOOL and call.get("id"):
                found.add(call["id"])
    return found


def turns_from_messages(
    messages: list[dict[str, Any]], conversation_id: str, clock: TurnClock, now: str
) -> list[dict[str, Any]]:
    """OpenAI-style chat messages as POST /turns turns: a tool answer that came from recall is
    marked "recalled" so that it never becomes a memory; empty messages are left out."""
    recalled_ids = recall_call_ids(messages)
    turns = []
    for message in messages:
        role = message.get("role")
        text = message_text(message.get("content"))
        if role not in ("user", "assistant", "system", "tool") or not text:
            continue
        ts = clock.stamp(conversation_id, len(turns), role, text, now)
        turn: dict[str, Any] = {"role": role, "text": text, "ts": ts}
        from_recall = message.get("name") == RECALL_TOOL
        if role == "tool" and (from_recall or message.get("tool_call_id") in recalled_ids):
            turn["recalled"] = True
        turns.append(turn)
    return turns
