"""The demo data tells one consistent story, and the seeder posts it the way the gateway does."""

from __future__ import annotations

import itertools
import json
import math
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from recall.domain.conversation import parse_conversation

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "seeds"
SEEDER = SEEDS / "seed.py"
FIRST_DAY, LAST_DAY = date(2026, 9, 21), date(2026, 10, 16)  # late September to mid October
DECISION_DAY = date(2026, 10, 8)  # the capacity check that makes MT-4471 the N-11 blocker


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def conversations(user: str | None = None) -> list[dict[str, Any]]:
    bodies = [load(p) for p in sorted(SEEDS.glob("*.json"))]
    return [b for b in bodies if user is None or b["user"] == user]


def day(turn: dict[str, Any]) -> date:
    return datetime.fromisoformat(turn["ts"].replace("Z", "+00:00")).date()


def text_of(user: str) -> str:
    return "\n".join(t["text"] for b in conversations(user) for t in b["turns"])


def grouped(value: float, decimals: int) -> str:
    """A number as the chats write it: thousands separated by commas."""
    return f"{value:,.{decimals}f}"


# --- the files -------------------------------------------------------------------------------


def test_every_seed_file_is_a_body_the_server_accepts() -> None:
    files = sorted(SEEDS.glob("*.json"))
    assert files
    for path in files:
        body = load(path)
        conversation = parse_conversation(body)
        assert conversation.conversation_id == path.stem  # one file per conversation, named so
        assert len(conversation.lines) == len(body["turns"])


def test_alice_has_six_conversations_and_bob_one() -> None:
    assert len(conversations("alice")) == 6
    assert len(conversations("bob")) == 1
    assert {b["user"] for b in conversations()} == {"alice", "bob"}


def test_each_conversation_is_a_realistic_exchange_of_6_to_14_turns() -> None:
    for body in conversations():
        roles = [t["role"] for t in body["turns"]]
        assert 6 <= len(roles) <= 14, body["conversation_id"]
        assert roles[0] == "user"
        # A chat alternates: the user asks, the assistant answers.
        assert all(a != b for a, b in itertools.pairwise(roles)), body["conversation_id"]


def test_timestamps_lie_in_the_two_weeks_and_move_forward() -> None:
    for body in conversations():
        stamps = [t["ts"] for t in body["turns"]]
        assert stamps == sorted(stamps), body["conversation_id"]
        for turn in body["turns"]:
            assert FIRST_DAY <= day(turn) <= LAST_DAY, turn["ts"]


# --- the numbers -----------------------------------------------------------------------------

Q0, DI, B = 1500.0, 0.25, 0.6  # units/d, nominal decline per year, Arps exponent
YEAR_DAYS = 365.25  # the convention the forecast chat states for per-year cumulatives
T = 18 / 12  # years


def test_forecast_figures_match_the_arps_hyperbolic_formulas() -> None:
    rate = Q0 / (1 + B * DI * T) ** (1 / B)
    cumulative = Q0 * YEAR_DAYS / ((1 - B) * DI) * (1 - (rate / Q0) ** (1 - B))
    text = text_of("alice")
    assert f"{grouped(rate, 1)} units/d" in text  # 1,069.5
    assert f"{cumulative / 1000:.1f} k units" in text  # 693.3
    assert (grouped(rate, 1), f"{cumulative / 1000:.1f}") == ("1,069.5", "693.3")


def test_forecast_comparison_matches_the_exponential_formulas() -> None:
    rate = Q0 * math.exp(-DI * T)
    cumulative = (Q0 - rate) / DI * YEAR_DAYS
    text = text_of("alice")
    assert f"{grouped(rate, 1)} units/d" in text
    assert f"{cumulative / 1000:.1f} k units" in text


def test_forecast_phasing_table_matches_the_formulas_at_6_and_12_months() -> None:
    text = text_of("alice")
    for months in (6, 12):
        t = months / 12
        hyp = Q0 / (1 + B * DI * t) ** (1 / B)
        hyp_cum = Q0 * YEAR_DAYS / ((1 - B) * DI) * (1 - (hyp / Q0) ** (1 - B))
        exp = Q0 * math.exp(-DI * t)
        exp_cum = (Q0 - exp) / DI * YEAR_DAYS
        row = (
            f"| {months} | {grouped(hyp, 1)} units/d | {hyp_cum / 1000:.1f} k units "
            f"| {grouped(exp, 1)} units/d | {exp_cum / 1000:.1f} k units |"
        )
        assert row in text


def test_base_case_is_picked_without_a_recorded_reason() -> None:
    (forecast,) = [b for b in conversations("alice") if "forecast" in b["conversation_id"]]
    picks = [t for t in forecast["turns"] if "base case" in t["text"].lower()]
    assert picks, "the forecast chat must record the base-case choice"
    for turn in picks:
        assert not re.search(r"\b(because|since|reason|as it)\b", turn["text"], re.I), turn["id"]


def test_capacity_load_is_91_percent_of_2400() -> None:
    load_units, capacity = 1940 + 245, 2400
    assert load_units == 2185
    text = text_of("alice")
    assert f"{load_units:,} / {capacity:,} = {round(100 * load_units / capacity)}%" in text
    assert "acceptable but tight" in text


def test_the_capped_line_is_the_same_2000_units_in_every_chat_that_mentions_it() -> None:
    cap = re.compile(r"\b(?:capped at|caps? [^.\n]{0,25}? at|limited to)\D{0,10}([\d,]{5}) units")
    found = [
        (b["conversation_id"], m.group(1))
        for b in conversations("alice")
        for t in b["turns"]
        for m in cap.finditer(t["text"])
    ]
    assert len({cid for cid, _ in found}) >= 2  # handover and capacity check both state it
    assert {value for _, value in found} == {"2,000"}, found


# --- the story -------------------------------------------------------------------------------


def test_alice_never_mentions_bobs_motor_or_ticket() -> None:
    text = text_of("alice")
    assert "P-7" not in text and "MT-5120" not in text
    assert "P-7" in text_of("bob") and "MT-5120" in text_of("bob")  # the negative control exists


def test_mt_4471_is_never_said_to_be_closed_after_the_decision() -> None:
    closed = re.compile(
        r"MT-4471[^.\n]{0,40}?\b(?:is|was|has been|got)\s+(?:now\s+)?(?:closed|resolved|fixed)"
    )
    conditional = re.compile(r"\b(?:once|until|after|before|when|that|whether|if)\b[^.\n]*$")
    later = [t for b in conversations("alice") for t in b["turns"] if day(t) >= DECISION_DAY]
    assert any("MT-4471" in t["text"] for t in later)  # the blocker is on record that day
    for turn in later:
        for match in closed.finditer(turn["text"]):
            # "once MT-4471 is closed" is the blocker, not news that it closed.
            before = turn["text"][max(0, match.start() - 40) : match.start()]
            assert conditional.search(before), match.group(0)
        if day(turn) > DECISION_DAY:
            assert "MT-4471" not in turn["text"]


def test_the_cross_chat_facts_are_where_the_article_finds_them() -> None:
    by_id = {
        b["conversation_id"]: "\n".join(t["text"] for t in b["turns"]) for b in conversations()
    }

    def chat(word: str) -> str:
        (found,) = [text for cid, text in by_id.items() if cid.startswith("alice") and word in cid]
        return found

    review, jobs = chat("output-review"), chat("nightly-jobs")
    assert "09-23 to 09-25" in review and "Tomas" in review and "F-204" not in review
    assert all(s in jobs for s in ("09-26", "09-30", "F-204", "Priya", "integrations lead"))
    handover = chat("handover")
    assert "MT-4471" in handover and "K-2" in handover and "North finishing line" in handover
    assert day(load_first_turn("alice-2026-10-03-shift-handover")) == date(2026, 10, 3)


def load_first_turn(conversation_id: str) -> dict[str, Any]:
    return load(SEEDS / f"{conversation_id}.json")["turns"][0]


FOLLOW_UP_DUE = re.compile(
    r"\bdue:? (?:\d{4}-\d{2}-\d{2}|monday|tuesday|wednesday|thursday|friday)", re.I
)


def test_follow_ups_with_owners_and_due_dates_span_five_chats() -> None:
    chats_with_follow_ups = [
        b["conversation_id"]
        for b in conversations("alice")
        if any(FOLLOW_UP_DUE.search(t["text"]) for t in b["turns"] if t["role"] == "assistant")
    ]
    assert len(chats_with_follow_ups) >= 5, chats_with_follow_ups
    text = text_of("alice")
    assert "Due: Thursday." in text  # one given only as a weekday
    # Two items are one underlying problem: the K-2 fan for MT-4471, and MT-4471 closing.
    assert "Kofi" in text and text.count("MT-4471") >= 4


# --- the seeder ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StubGateway(BaseHTTPRequestHandler):
    """Answers POST /turns like the server would; records what arrived."""

    status: ClassVar[int] = 202
    received: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length))
        type(self).received.append((self.headers.get("x-ingest-key", ""), body))
        reply = b'{"stored": "x"}' if self.status == 202 else b'{"error": "unauthorized"}'
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass


@pytest.fixture
def stub_server() -> Iterator[tuple[str, type[StubGateway]]]:
    handler = type("Handler", (StubGateway,), {"received": [], "status": 202})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def run_seeder(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SEEDER), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_seeder_posts_the_growing_conversation_after_every_turn(stub_server) -> None:
    url, handler = stub_server
    result = run_seeder("--url", url, "--key", "k" * 20, "--dir", str(SEEDS))
    assert result.returncode == 0, result.stderr
    total_turns = sum(len(b["turns"]) for b in conversations())
    assert len(handler.received) == total_turns
    assert {key for key, _ in handler.received} == {"k" * 20}
    first = conversations()[0]
    sent = [b for _, b in handler.received if b["conversation_id"] == first["conversation_id"]]
    assert [len(b["turns"]) for b in sent] == list(range(1, len(first["turns"]) + 1))
    assert sent[-1] == first


def test_seeder_takes_the_key_from_the_environment(stub_server) -> None:
    url, handler = stub_server
    env = {"INGEST_KEY": "from-env-key-123456", "PATH": "/usr/bin:/bin"}
    result = run_seeder("--url", url, env=env)
    assert result.returncode == 0, result.stderr
    assert {key for key, _ in handler.received} == {"from-env-key-123456"}


def test_seeder_stops_with_one_line_when_the_key_is_refused(stub_server) -> None:
    url, handler = stub_server
    handler.status = 401
    result = run_seeder("--url", url, "--key", "wrong-key-wrong-key")
    assert result.returncode != 0
    assert len(handler.received) == 1  # stops at the first refusal
    assert result.stderr.strip().count("\n") == 0
    assert "401" in result.stderr and "ingest key" in result.stderr


def test_seeder_stops_with_one_line_on_any_other_status(stub_server) -> None:
    url, handler = stub_server
    handler.status = 400
    result = run_seeder("--url", url, "--key", "k" * 20)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "400" in result.stderr


def test_seeder_against_a_closed_port_exits_non_zero_with_a_message() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # bound then released: nothing listens there
    result = run_seeder("--url", url, "--key", "k" * 20)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0
    assert "cannot reach" in result.stderr and url in result.stderr
    assert "Traceback" not in result.stderr
