"""Redaction at ingest: credentials never reach disk, identifiers stay, the cost stays linear.

Every secret-shaped value is generated here at run time; none is committed.
"""

from __future__ import annotations

import base64
import json
import secrets
import string
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from math import inf
from pathlib import Path

import pytest
from conftest import ROOT, Server, conversation, install_fake_funes, make_server

from recall.redaction import Redactor

UPPER_DIGITS = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits


def pick(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def jwt() -> str:
    header = b64url(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": pick(ALNUM, 12), "exp": 1900000000}).encode())
    return f"{header}.{payload}.{b64url(secrets.token_bytes(64))}"


def private_key() -> str:
    body = base64.b64encode(secrets.token_bytes(300)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN RSA PRIVATE KEY-----\n{lines}\n-----END RSA PRIVATE KEY-----"


# (kind, a text around a generated secret, the secret itself)
def secret_cases() -> list[tuple[str, str, str]]:
    aws_id = "AKIA" + pick(UPPER_DIGITS, 16)
    aws_secret = pick(ALNUM + "/+", 40)
    token = secrets.token_urlsafe(32) + "7"
    key = private_key()
    password = secrets.token_urlsafe(12)
    cases = [
        ("aws_access_key", f"the key id is {aws_id}, region eu-west-1", aws_id),
        ("aws_secret_key", f"aws_secret_access_key = {aws_secret}\n", aws_secret),
        ("aws_secret_key", f'"AWS_SECRET_ACCESS_KEY": "{aws_secret}"', aws_secret),
        ("google_api_key", f"maps key AIza{pick(ALNUM + '-_', 35)} ok", None),
        ("azure_key", f"AccountName=x;AccountKey={pick(ALNUM + '+/', 86)}==;", None),
        ("azure_client_secret", f"secret {pick(ALNUM, 3)}8Q~{pick(ALNUM + '_~.-', 34)} x", None),
        ("bearer_token", f"curl -H 'Authorization: Bearer {token}' https://api", token),
        ("jwt", f"my token: {jwt()} expires soon", None),
        ("private_key", f"here it is:\n{key}\nthanks", key),
        ("private_key", "pasted half: -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0", None),
        ("url_password", f"postgres://app:{password}@db.internal:5432/orders", password),
        ("url_password", f"redis://:{password}@cache:6379", password),
        ("github_token", f"GH_TOKEN=ghp_{pick(ALNUM, 36)}", None),
        ("github_token", f"github_pat_{pick(ALNUM, 22)}_{pick(ALNUM, 59)}", None),
        ("slack_token", f"bot xoxb-{pick(string.digits, 12)}-{pick(ALNUM, 24)}", None),
        ("stripe_key", f"STRIPE=sk_live_{pick(ALNUM, 24)}", None),
        ("stripe_key", f"rk_live_{pick(ALNUM, 24)}", None),
        ("openai_key", f"OPENAI_API_KEY=sk-proj-{pick(ALNUM, 40)}7", None),
        ("openai_key", f"use sk-{pick(ALNUM, 44)}1 for it", None),
        ("basic_auth", f"Authorization: Basic {b64(b'user:' + secrets.token_bytes(9))}", None),
        ("basic_auth", "Authorization: Basic " + b64url(b"user:" + bytes([0xFB, 0xFF]) * 6), None),
    ]
    return [(kind, text, secret or _value_in(text, kind)) for kind, text, secret in cases]


def _value_in(text: str, kind: str) -> str:
    """The longest whitespace-free run of the text: the secret in these one-secret cases."""
    run = max(text.replace("'", " ").split(), key=len)
    return run.split("=", 1)[-1] if kind in ("stripe_key", "github_token", "openai_key") else run


# Look-alikes that are not secrets and must come back byte for byte.
LOOK_ALIKES = [
    "Ticket MT-4471 for the K-2 machine, upgrade N-11 on 2026-10-08.",
    "Order #A-20391-77 shipped; invoice INV-2026-0042; PO 4500012345.",
    "Request id 3f2b9c1e-8a4d-4f6b-9c2e-1a7d5e3b9f01 (a UUID) failed at 14:05 UTC.",
    "Fixed in commit 9fceb02d0ae598e95dc970b74767f19372d61af8 (git SHA), short 9fceb02.",
    "sha256 of the file: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "Version 1.8.2, build 2026.10.08-rc1, python 3.11.7, colour #ff8800, 0xDEADBEEF.",
    "Write to dana.smith@example.com or see https://docs.example.com:8443/a/b?x=1#top.",
    "ssh git@github.com:org/repo.git and http://localhost:8000/mcp work.",
    "The bearer of bad news; basic authentication is configured; an AKIA prefix alone.",
    "sk-learn-compatible estimators; task-1234567890-abcdefghij; desk-2024-a.",
    "Dates: 08/10/2026, 2026-10-08T09:00:00Z, Oct 8 2026. Phone +44 20 7946 0958.",
    "Serial AB12CD34EF56GH78IJ90 is twenty characters of upper case and digits.",
    "base64 of hello: aGVsbG8gd29ybGQ= and a header eyJ without a body.",
    "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----",
]


@pytest.mark.parametrize(
    "case", secret_cases(), ids=lambda case: case[0] if isinstance(case, tuple) else None
)
def test_each_kind_of_credential_becomes_a_redaction_marker(case: tuple[str, str, str]) -> None:
    # Given a turn holding a generated credential of one kind
    kind, text, secret = case
    # When it is redacted
    redacted, counts = Redactor().redact(text)
    # Then the value is gone, the marker names its kind, and the kind is counted once
    assert secret not in redacted
    assert f"[REDACTED:{kind}]" in redacted
    assert counts == {kind: 1}
    # and no piece of it is left behind the marker (a half-matched value would leave its tail)
    assert secret[-6:] not in redacted


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_identifiers_hashes_dates_and_plain_urls_are_left_alone(text: str) -> None:
    # Given ordinary text full of ids, UUIDs, SHAs, dates, versions, emails and URLs
    # When it is redacted
    redacted, counts = Redactor().redact(text)
    # Then nothing changed
    assert (redacted, dict(counts)) == (text, {})


def test_only_the_password_of_a_url_is_redacted() -> None:
    redacted, _ = Redactor().redact("postgres://app:s3cret-pw@db.internal:5432/orders")
    assert redacted == "postgres://app:[REDACTED:url_password]@db.internal:5432/orders"


@pytest.mark.parametrize(
    "case", secret_cases(), ids=lambda case: case[0] if isinstance(case, tuple) else None
)
def test_redacting_redacted_text_changes_and_counts_nothing(case: tuple[str, str, str]) -> None:
    # Given a turn redacted once (the gateway re-posts the whole conversation after every turn)
    once, _ = Redactor().redact(case[1])
    # When it is redacted again
    twice, counts = Redactor().redact(once)
    # Then it is the same text, and nothing is counted (nor logged) a second time
    assert (twice, dict(counts)) == (once, {})


# Inputs that make a backtracking pattern re-scan a long run from every position.
ADVERSARIAL: dict[str, Callable[[int], str]] = {
    "eyJ runs": lambda n: ("eyJabcdefgh." * n)[:n],
    "key-ish run": lambda n: ("sk-" + "a" * n)[:n],
    "AKIA run": lambda n: ("AKIA" * n)[:n],
    "private key without end": lambda n: ("-----BEGIN PRIVATE KEY-----" + "A-" * n)[:n],
    "begin headers": lambda n: ("-----BEGIN PRIVATE KEY-----" * n)[:n],
    "url without at": lambda n: ("a://" + "u:" * n)[:n],
    "bearer runs": lambda n: ("bearer " + "a" * n)[:n],
    "azure-ish": lambda n: ("abc8Q~" * n)[:n],
    "hex": lambda n: ("3f9a0c7be14d2285" * n)[:n],
}


@pytest.mark.parametrize("blob", ADVERSARIAL.values(), ids=list(ADVERSARIAL))
def test_redaction_cost_grows_linearly_with_an_adversarial_input(
    blob: Callable[[int], str],
) -> None:
    # Given an adversarial text, and one 8 times longer
    redactor = Redactor()
    short, long = blob(20_000), blob(160_000)

    def cost(text: str, calls: int) -> float:
        # The fastest of a few runs, in this thread's CPU time: other load only adds to the rest.
        best = inf
        for _ in range(3):
            start = time.thread_time()
            for _ in range(calls):
                redactor.redact(text)
            best = min(best, (time.thread_time() - start) / calls)
        return best

    # When both are redacted
    ratio = cost(long, 1) / cost(short, 8)
    # Then 8 times the text costs about 8 times as much (quadratic work would cost 64 times)
    assert ratio < 20, f"8x the text cost {ratio:.0f}x the time"


# --- through the route and the backfill -------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("redaction")
    funes = install_fake_funes(tmp / "funes-bin")
    patterns = tmp / "patterns.tsv"
    patterns.write_text("# ours\nemployee_pin\tPIN[ :]+(?P<secret>\\d{6})\n")
    server = make_server(
        tmp,
        ENGINE="funes",
        FUNES_BIN=str(funes.path),
        REDACT_PATTERNS_FILE=str(patterns),
        INDEX_DEBOUNCE="5",
    ).start()
    yield server
    server.stop()


def test_a_posted_credential_never_reaches_disk_and_only_its_kind_is_logged(
    server: Server,
) -> None:
    # Given a conversation with an AWS key id, a JWT and a password in a URL
    aws_id, token, password = "AKIA" + pick(UPPER_DIGITS, 16), jwt(), secrets.token_urlsafe(12)
    body = conversation(
        "alice",
        "leaky",
        f"Deploy with {aws_id} and the token {token} for ticket MT-4471.",
        f"Connect to postgres://app:{password}@db:5432/orders, order N-11 on 2026-10-08.",
    )
    # When the gateway posts it
    status, _ = server.post(body)
    # Then it is stored with markers in place of the values, the identifiers intact
    assert status == 202
    stored = (server.home("alice") / "src" / "leaky.funes.jsonl").read_text()
    for value in (aws_id, token, password):
        assert value not in stored
        assert value not in server.log()
    for marker in ("[REDACTED:aws_access_key]", "[REDACTED:jwt]", "[REDACTED:url_password]"):
        assert marker in stored
    assert "MT-4471" in stored and "N-11" in stored and "2026-10-08" in stored
    # And the log counts the kinds, never the values
    assert "redacted aws_access_key=1, jwt=1, url_password=1" in server.log()


def test_a_pattern_from_redact_patterns_file_is_applied(server: Server) -> None:
    # Given the operator's pattern for employee PINs (its `secret` group only)
    pin = pick(string.digits, 6)
    # When a turn holding one is posted
    status, _ = server.post(conversation("bob", "pin", f"My PIN: {pin}, badge B-12.", "Ok."))
    # Then the PIN is redacted under the operator's kind, the rest kept
    assert status == 202
    stored = (server.home("bob") / "src" / "pin.funes.jsonl").read_text()
    assert pin not in stored and "My PIN: [REDACTED:employee_pin], badge B-12." in stored


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("no tab here\n", "line 1: expected kind<TAB>regex"),
        ("# fine\nBad Kind\tx+\n", "line 2: kind must match"),
        ("pin\t(unclosed\n", "line 1: regex does not compile"),
        ("pin\ta*\n", "line 1: regex matches the empty string"),
    ],
)
def test_an_unusable_patterns_file_refuses_to_start_naming_the_line(
    tmp_path: Path, content: str, why: str
) -> None:
    # Given a patterns file with a bad line
    patterns = tmp_path / "patterns.tsv"
    patterns.write_text(content)
    env = make_server(tmp_path, ENGINE="embedded", REDACT_PATTERNS_FILE=str(patterns)).env
    # When the server starts
    done = subprocess.run(
        [sys.executable, str(ROOT / "recall_server.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Then it exits at once, saying which line is wrong and why
    assert done.returncode != 0
    assert "REDACT_PATTERNS_FILE" in done.stderr and why in done.stderr


def test_the_backfill_redacts_like_the_route(tmp_path: Path) -> None:
    # Given a history whose one body holds a GitHub token
    token = "ghp_" + pick(ALNUM, 36)
    source = tmp_path / "history.jsonl"
    body = conversation("alice", "old", f"Use {token} for MT-4471.", "Done.")
    source.write_text(json.dumps(body) + "\n")
    funes = install_fake_funes(tmp_path / "funes-bin")
    env = make_server(tmp_path, ENGINE="funes", FUNES_BIN=str(funes.path)).env
    # When the operator backfills it
    done = subprocess.run(
        [sys.executable, str(ROOT / "recall_server.py"), "backfill", str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Then the stored text has the marker, and the report names the kind, not the value
    assert done.returncode == 0, done.stderr
    stored = next((tmp_path / "data").rglob("old.funes.jsonl")).read_text()
    assert token not in stored and "Use [REDACTED:github_token] for MT-4471." in stored
    assert "redacted github_token=1" in done.stderr and token not in done.stderr
