"""Redaction at ingest: credentials never reach disk, identifiers stay, the cost stays linear.

Every secret-shaped value is generated here at run time; none is committed.
"""

from __future__ import annotations

import base64
import json
import re
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

from recall.redaction import BUILTIN, TRIGGERS, BadPatterns, Redactor, load_patterns

UPPER_DIGITS = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"
HEX = "0123456789abcdef"


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


def pgp_private_key(end: bool = True) -> str:
    """ASCII armour as gpg --export-secret-keys --armor writes it: a header, a blank line,
    base64 lines, a "=" checksum line, then the END line (left off when `end` is False)."""
    body = base64.b64encode(secrets.token_bytes(600)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    block = f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{lines}\n={b64(secrets.token_bytes(3))}"
    return block + ("\n-----END PGP PRIVATE KEY BLOCK-----" if end else "")


# (kind, a text around a generated secret, the secret itself)
def secret_cases() -> list[tuple[str, str, str]]:
    aws_id = "AKIA" + pick(UPPER_DIGITS, 16)
    aws_secret = pick(ALNUM + "/+", 40)
    token = secrets.token_urlsafe(32) + "7"
    key = private_key()
    pgp, pgp_cut = pgp_private_key(), pgp_private_key(end=False)
    gitlab_routable = f"glpat-{pick(B64URL, 27)}.01{pick(HEX, 7)}"
    npm = "npm_" + pick(ALNUM, 36)
    slack_app = f"xapp-1-A{pick(UPPER_DIGITS, 10)}-{pick(string.digits, 13)}-{pick(HEX, 64)}"
    slack_hook = f"T{pick(UPPER_DIGITS, 8)}/B{pick(UPPER_DIGITS, 10)}/{pick(ALNUM, 24)}"
    password = secrets.token_urlsafe(12)
    at_password = f"hunter@2{password}"  # a password may hold "@"
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
        ("private_key", f"my gpg key:\n{pgp}\nkeep it safe", pgp),
        ("private_key", f"cut off: {pgp_cut}", pgp_cut),
        ("url_password", f"postgres://app:{password}@db.internal:5432/orders", password),
        ("url_password", f"redis://:{password}@cache:6379", password),
        ("url_password", f"redis://:{at_password}@cache:6379/0", at_password),
        ("url_password", f"see https://ops:{at_password}@git.example.com/a?to=x@y.z", at_password),
        ("github_token", f"GH_TOKEN=ghp_{pick(ALNUM, 36)}", None),
        ("github_token", f"github_pat_{pick(ALNUM, 22)}_{pick(ALNUM, 59)}", None),
        ("slack_token", f"bot xoxb-{pick(string.digits, 12)}-{pick(ALNUM, 24)}", None),
        ("stripe_key", f"STRIPE=sk_live_{pick(ALNUM, 24)}", None),
        ("stripe_key", f"rk_live_{pick(ALNUM, 24)}", None),
        ("openai_key", f"OPENAI_API_KEY=sk-proj-{pick(ALNUM, 40)}7", None),
        ("openai_key", f"use sk-{pick(ALNUM, 44)}1 for it", None),
        ("openai_key", f"ANTHROPIC_API_KEY=sk-ant-api03-{pick(B64URL, 93)}AA", None),
        ("aws_access_key", f"id ABIA{pick(UPPER_DIGITS, 16)}.", None),
        ("stripe_key", f"key sk_prod_{pick(ALNUM, 24)}", None),
        ("gitlab_token", f"GITLAB_TOKEN=glpat-{pick(B64URL, 20)}", None),
        ("gitlab_token", f"token {gitlab_routable} works", gitlab_routable),
        ("gitlab_token", f"deploy with gldt-{pick(ALNUM, 20)}", None),
        ("gitlab_token", f"runner glrt-t1_{pick(B64URL, 27)}", None),
        ("slack_token", f"app {slack_app}", slack_app),
        ("slack_webhook", f"post to https://hooks.slack.com/services/{slack_hook} now", slack_hook),
        ("npm_token", f"//registry.npmjs.org/:_authToken={npm}", npm),
        ("pypi_token", f"password = pypi-AgEIcHlwaS5vcmc{pick(B64URL, 120)}", None),
        ("pypi_token", f"test.pypi: pypi-AgENdGVzdC5weXBpLm9yZw{pick(B64URL, 120)}", None),
        (
            "huggingface_token",
            f"huggingface-cli login --token hf_{pick(string.ascii_letters, 34)}",
            None,
        ),
        ("huggingface_token", f"org api_org_{pick(string.ascii_letters, 34)}.", None),
        ("sendgrid_key", f"SENDGRID_API_KEY='SG.{pick(B64URL, 22)}.{pick(B64URL, 43)}'", None),
        ("shopify_token", f"X-Shopify-Access-Token: shpat_{pick(HEX, 32)}", None),
        ("shopify_token", f"secret shpss_{pick(HEX, 32)}", None),
        ("digitalocean_token", f"doctl auth init -t dop_v1_{pick(HEX, 64)}", None),
        ("twilio_key", f"TWILIO_API_KEY=SK{pick(HEX, 32)}", None),
        ("vault_token", f"VAULT_TOKEN=hvs.{pick(B64URL, 91)}", None),
        ("databricks_token", f"DATABRICKS_TOKEN=dapi{pick(HEX, 32)}-2", None),
        ("age_secret_key", f"# key: AGE-SECRET-KEY-1{pick(UPPER_DIGITS, 58)}", None),
        ("basic_auth", f"Authorization: Basic {b64(b'user:' + secrets.token_bytes(9))}", None),
        ("basic_auth", "Authorization: Basic " + b64url(b"user:" + bytes([0xFB, 0xFF]) * 6), None),
    ]
    return [(kind, text, secret or _value_in(text)) for kind, text, secret in cases]


def _value_in(text: str) -> str:
    """The longest whitespace-free run of the text: the secret in these one-secret cases."""
    run = max(text.replace("'", " ").split(), key=len).rstrip(".")
    env = re.match(r"[A-Z_]+=", run)  # NAME=value: the value
    return run[env.end() :] if env else run


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
    "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGSV\n=8xQN\n-----END PGP PUBLIC KEY BLOCK-----",
    "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTAN\n-----END CERTIFICATE-----",
    "Never paste your private key; the PGP private key block stays on the laptop.",
    "postgres://app@db:5432/orders has no password; nor does https://example.com/@dana.",
    "https://example.com:8443/reset?email=dana@example.com and ftp://mirror.example.org/pub.",
    "Mail a+tag@example.co.uk, ops@[10.0.0.1] or x@y.z; user@host:path is scp syntax.",
    "npm_modules and npm_config_cache are folders; run npm install, then npm_lifecycle_event.",
    "hf_hub_download(repo_id='x') takes an hf_token argument; api_org_name is a field.",
    "Section SG.1 and msg.body; MSG.HEADER and SG.x are fields, not SendGrid keys.",
    "SKU-12345 and SKIP; SK-2041 is a ticket; ask the desk about the task risk.",
    "Pod fields come from the dapi (downward API); roads.shp and shpfile are shapefiles.",
    "glpat-xxxx is a placeholder; glab auth login; gldt- and glrt- prefixes alone.",
    "dop_v1_ alone, do_v1_migration() and the v1_ API; hvs. and hvb. are prefixes.",
    "AGE-SECRET-KEY-1 is where the key goes; age-keygen writes it.",
    "Docs: https://hooks.slack.com/services/ and https://api.slack.com/messaging/webhooks.",
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk",
    "Releases v1.2.3-rc.1 and 2.0.0+build.5; md5 d41d8cd98f00b204e9800998ecf8427e.",
    "Tokens look like ghp_... or sk_live_...; the API key goes in OPENAI_API_KEY.",
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


def test_every_built_in_kind_has_a_trigger_and_a_case_in_the_corpus() -> None:
    # Given the built-in patterns, their pre-check words and the corpus of generated secrets
    kinds = [kind for kind, _ in BUILTIN]
    # Then each pattern has trigger words (no pattern runs on every text) and at least one case
    assert list(TRIGGERS) == kinds and all(TRIGGERS.values())
    assert {kind for kind, _, _ in secret_cases()} == set(kinds)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "postgres://app:s3cret-pw@db.internal:5432/orders",
            "postgres://app:[REDACTED:url_password]@db.internal:5432/orders",
        ),
        # The password runs to the last "@" before the host: it may hold "@" itself.
        ("redis://:hunter@2SECRETPW@cache:6379", "redis://:[REDACTED:url_password]@cache:6379"),
        (
            "https://ops:p@ss@w0rd@git.example.com/a?to=x@y.z#@",
            "https://ops:[REDACTED:url_password]@git.example.com/a?to=x@y.z#@",
        ),
    ],
)
def test_only_the_password_of_a_url_is_redacted(text: str, expected: str) -> None:
    # Given a URL with a password, When it is redacted, Then the user and host stay readable
    assert Redactor().redact(text) == (expected, {"url_password": 1})


def test_a_pgp_private_key_block_is_redacted_whole() -> None:
    # Given a turn pasting a PGP private key between two sentences
    key = pgp_private_key()
    # When it is redacted
    redacted, counts = Redactor().redact(f"Here:\n{key}\nDone.")
    # Then the whole block, BEGIN to END line, is one marker and the prose around it stays
    assert (redacted, dict(counts)) == ("Here:\n[REDACTED:private_key]\nDone.", {"private_key": 1})


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
    "pgp key without end": lambda n: ("-----BEGIN PGP PRIVATE KEY BLOCK-----" + "A-" * n)[:n],
    "url with at signs": lambda n: ("a://u:" + "x@" * n)[:n],
    "urls with at signs": lambda n: ("a://u:p@x@" * n)[:n],
    "gitlab runs": lambda n: ("glpat-" + "a" * n)[:n],
    "SK and hex": lambda n: ("SK" + "0" * n)[:n],
    "SG. runs": lambda n: ("SG." * n)[:n],
    "hf runs": lambda n: ("hf_" * n)[:n],
    "slack webhook path": lambda n: ("hooks.slack.com/services/" + "a/" * n)[:n],
    "vault run": lambda n: ("hvs." + "a" * n)[:n],
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
        ("pin\ta*\n", "line 1: regex can match without consuming text"),
        # A lookahead alone matches nothing: it would insert the marker and keep the PIN.
        ("# ours\npin\t(?=PIN: \\d{6})\n", "line 2: regex can match without consuming text"),
        ("pin\tPIN: (?P<secret>(?=\\d))\n", "line 1: group `secret` can match without consuming"),
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


@pytest.mark.parametrize(
    "regex",
    [r"(?=PIN: \d{6})", r"(?<=PIN: )", r"\b", r"a*", r"(?:PIN)?", r"x|", r"PIN: (?P<secret>\d*)"],
)
def test_a_pattern_that_can_match_no_text_is_refused(tmp_path: Path, regex: str) -> None:
    # Given a patterns file whose one regex can match (or redact) zero characters
    patterns = tmp_path / "patterns.tsv"
    patterns.write_text(f"employee_pin\t{regex}\n")
    # When it is loaded, Then it is refused, naming the line
    with pytest.raises(BadPatterns, match=r"line 1: .*can match without consuming text"):
        load_patterns(patterns)


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
