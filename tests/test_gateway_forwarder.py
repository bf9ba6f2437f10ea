"""The gateways' forwarder: the chat never waits for recall-server; a failure is retried a
bounded number of times and then dropped with a counted log line; the key, the user id and the
text never reach a log. Run on both copies: recall_forward's and the pasteable Open WebUI
filter's."""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import (
    OPEN_WEBUI_FILTER,
    CountingServer,
    closed_port_url,
    load_forward,
    load_open_webui_filter,
    stalled_server,
)

FORWARD = load_forward()
COPIES = {"recall_forward": FORWARD.Forwarder, "open_webui": load_open_webui_filter().Forwarder}
SECRET_TEXT = "the vault combination is 31-07-1977"


def body(user: str = "carol@example.test") -> dict[str, Any]:
    turn = {"role": "user", "text": SECRET_TEXT, "ts": "2026-11-02T10:00:00Z"}
    return {"user": user, "conversation_id": "c1", "turns": [turn]}


@pytest.fixture(params=sorted(COPIES))
def forwarder_class(request: pytest.FixtureRequest) -> Any:
    return COPIES[request.param]


def test_the_pasteable_filter_carries_the_same_forwarder_byte_for_byte() -> None:
    source = Path(FORWARD.__file__).read_text(encoding="utf-8")
    begin, end = "# --- Forwarder: begin", "# --- Forwarder: end ---"
    shared = source[source.index(begin) : source.index(end)]
    pasted = OPEN_WEBUI_FILTER.read_text(encoding="utf-8")
    assert shared in pasted


def test_submit_returns_at_once_while_the_server_is_stalled(forwarder_class: Any) -> None:
    with stalled_server() as url:
        forwarder = forwarder_class(url, secrets.token_hex(8), max_queue=100, timeout=10)
        started = time.perf_counter()
        accepted = [forwarder.submit(body()) for _ in range(50)]
        elapsed = time.perf_counter() - started
    assert all(accepted)
    # 50 submissions to a server that never answers: microseconds each, well under 50 ms in all
    assert elapsed < 0.05, f"{elapsed * 1000:.1f} ms"


def test_a_full_queue_drops_and_counts_without_waiting(
    forwarder_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "recall_forward")
    with stalled_server() as url:
        forwarder = forwarder_class(url, secrets.token_hex(8), max_queue=3, timeout=10)
        started = time.perf_counter()
        accepted = sum(forwarder.submit(body()) for _ in range(20))
        elapsed = time.perf_counter() - started
    assert elapsed < 0.05, f"a full queue made submit wait: {elapsed * 1000:.1f} ms"
    # at most the queue's 3 plus the one the thread took; every other one dropped and counted
    assert 3 <= accepted <= 4
    assert forwarder.dropped == 20 - accepted
    assert f"dropped so far: {forwarder.dropped}" in caplog.text
    assert "queue full" in caplog.text


def test_a_server_error_is_retried_a_bounded_number_of_times_then_dropped(
    forwarder_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "recall_forward")
    with CountingServer(503) as server:
        forwarder = forwarder_class(server.url, secrets.token_hex(8), attempts=3, backoff=0.01)
        forwarder.submit(body())
        assert forwarder.drain(10)
    assert server.requests == 3
    assert (forwarder.sent, forwarder.dropped) == (0, 1)
    assert "status 503" in caplog.text and "dropped so far: 1" in caplog.text


def test_a_refused_body_is_not_retried(forwarder_class: Any) -> None:
    with CountingServer(400) as server:
        forwarder = forwarder_class(server.url, secrets.token_hex(8), attempts=4, backoff=0.01)
        forwarder.submit(body())
        assert forwarder.drain(10)
    assert (server.requests, forwarder.dropped) == (1, 1)


def test_a_server_that_is_down_costs_retries_then_a_drop(forwarder_class: Any) -> None:
    forwarder = forwarder_class(closed_port_url(), secrets.token_hex(8), attempts=2, backoff=0.01)
    forwarder.submit(body())
    assert forwarder.drain(10)
    assert (forwarder.sent, forwarder.dropped) == (0, 1)


def test_no_key_user_or_text_in_the_logs(
    forwarder_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key = secrets.token_hex(16)
    with CountingServer(401) as server:
        forwarder = forwarder_class(server.url, key, attempts=2, backoff=0.01)
        forwarder.submit(body("carol@example.test"))
        assert forwarder.drain(10)
    with stalled_server() as url:
        full = forwarder_class(url, key, max_queue=1, timeout=10)
        for _ in range(5):
            full.submit(body("carol@example.test"))
    assert caplog.records, "the drops were logged"
    for secret in (key, "carol@example.test", SECRET_TEXT, "31-07-1977"):
        assert secret not in caplog.text
