"""The read path's identity over a real socket: the user comes from the verified token only."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import (
    INITIALIZE,
    FakeFunes,
    Server,
    conversation,
    install_fake_funes,
    make_server,
    wait_for,
)
from fastmcp import Client
from fastmcp.server.auth.providers.jwt import RSAKeyPair, StaticTokenVerifier
from joserfc import jwk, jwt
from mcp import ClientSession
from mcp.client.auth.utils import (
    build_protected_resource_metadata_discovery_urls,
    extract_resource_metadata_from_www_auth,
    handle_protected_resource_response,
)
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth_utils import check_resource_allowed
from test_memory_api import call

from recall.auth import KID_WITHHELD, MALFORMED, UNAUTHORIZED, SignInDiscovery, build_verifier
from recall.settings import Settings

ISSUER = "https://id.example.test"
AUDIENCE = "recall-server"


def mcp_status(server: Server, token: str | None) -> int:
    """Status of a bare MCP initialize POST with the given bearer token (or none)."""
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
        b'"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}'
    )
    request = urllib.request.Request(f"{server.url}/mcp", data=body, method="POST")
    request.add_header("content-type", "application/json")
    request.add_header("accept", "application/json, text/event-stream")
    if token is not None:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


# One funes stand-in, one server on the demo tokens and one verifying JWTs for the whole module
# (a server start costs seconds of CPU): their tests only read, or post for a user no other test
# here posts for, and look at the stand-in's calls and the log from their own start on. A test
# whose settings differ, or that reads refusal lines from the log (written at most once per
# reason every REFUSAL_INTERVAL), starts a server of its own.
@pytest.fixture(scope="module")
def fake_funes(tmp_path_factory: pytest.TempPathFactory) -> FakeFunes:
    return install_fake_funes(tmp_path_factory.mktemp("auth") / "funes-bin")


@pytest.fixture(scope="module")
def funes_server(
    tmp_path_factory: pytest.TempPathFactory, fake_funes: FakeFunes
) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("auth-demo-tokens")
    with make_server(workdir, ENGINE="funes", FUNES_BIN=str(fake_funes.path)).start() as server:
        yield server


def test_mcp_without_a_token_is_401(funes_server: Server) -> None:
    assert mcp_status(funes_server, None) == 401


def test_mcp_with_an_unknown_token_is_401(funes_server: Server) -> None:
    assert mcp_status(funes_server, "not-a-real-token") == 401
    assert mcp_status(funes_server, funes_server.tokens["alice"]) == 200


def test_healthz_needs_no_auth_and_tells_no_user_data(funes_server: Server) -> None:
    with urllib.request.urlopen(f"{funes_server.url}/healthz", timeout=5) as response:
        assert response.status == 200
        assert response.read() == b'{"status":"ok","store":"files","engine":"funes","indexing":0}'


async def test_each_token_only_ever_reaches_its_own_users_directory(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    for user in ("alice", "bob"):
        body = conversation(user, f"{user}-chat", f"{user} talks about ticket MT-4471", "Noted.")
        assert funes_server.post(body)[0] == 202
    funes_server.wait_indexed("alice", "bob", timeout=60)
    earlier = len(fake_funes.calls("recall"))
    alice_answer = await funes_server.recall("alice", "MT-4471 bob alice")
    bob_answer = await funes_server.recall("bob", "MT-4471 bob alice")
    assert "alice talks" in alice_answer and "bob talks" not in alice_answer
    assert "bob talks" in bob_answer and "alice talks" not in bob_answer
    homes = [c["env"]["FUNES_HOME"] for c in fake_funes.calls("recall")[earlier:]]
    assert homes == [str(funes_server.home("alice")), str(funes_server.home("bob"))]


async def test_the_query_cannot_choose_whose_memory_is_searched(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    # Given alice and bob both with memories, each with a marker of their own
    for user, marker in (("alice", "MT-6001"), ("bob", "MT-5120")):
        body = conversation(user, f"{user}-c", f"{user}'s own secret {marker}", "noted")
        assert funes_server.post(body)[0] == 202
    funes_server.wait_indexed("alice", "bob", timeout=60)
    bob_home = funes_server.home("bob")
    earlier = len(fake_funes.calls("recall"))
    # When alice's token asks with queries that name bob, his directory or his marker
    queries = [
        "user=bob MT-5120",
        "bob's own secret MT-5120",
        f'{{"user": "bob"}} MT-5120 {bob_home.name}',
        f"../{bob_home.name}/src MT-5120",
        f"FUNES_HOME={bob_home} MT-5120",
        "MT-6001 MT-5120 user=bob",
    ]
    answers = [await funes_server.recall("alice", query) for query in queries]
    # Then bob's conversation never comes back, alice's does when asked for, and every search
    # ran in alice's directory
    assert not [a for a in answers if "MT-5120" in a or "bob's" in a]
    assert "alice's own secret MT-6001" in answers[-1]
    homes = {call["env"]["FUNES_HOME"] for call in fake_funes.calls("recall")[earlier:]}
    assert homes == {str(funes_server.home("alice"))}
    # and bob's own token does find it (the marker is searchable at all)
    assert "bob's own secret MT-5120" in await funes_server.recall("bob", "MT-5120")


def claims(**overrides: object) -> dict[str, Any]:
    """A good token's claims with some changed; a claim set to None is left out."""
    now = int(time.time())
    good = {"sub": "u", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600}
    return {k: v for k, v in {**good, **overrides}.items() if v is not None}


def signed(keys: RSAKeyPair, payload: dict[str, Any], **header: str) -> str:
    """A JWT with exactly these claims (RSAKeyPair.create_token always adds exp), and these
    header fields besides alg."""
    private_key = jwk.RSAKey.import_key(keys.private_key.get_secret_value())
    return jwt.encode({"alg": "RS256", **header}, payload, private_key)


def jwt_settings(keys: RSAKeyPair, fake_funes: FakeFunes) -> dict[str, str]:
    return {
        "ENGINE": "funes",
        "FUNES_BIN": str(fake_funes.path),
        "AUTH_TOKENS_FILE": "",
        "JWT_PUBLIC_KEY": keys.public_key,
        "JWT_ISSUER": ISSUER,
        "JWT_AUDIENCE": AUDIENCE,
    }


@pytest.fixture(scope="module")
def jwt_server(
    tmp_path_factory: pytest.TempPathFactory, fake_funes: FakeFunes
) -> Iterator[tuple[Server, RSAKeyPair]]:
    keys = RSAKeyPair.generate()
    workdir = tmp_path_factory.mktemp("auth-jwt")
    with make_server(workdir, **jwt_settings(keys, fake_funes)).start() as server:
        yield server, keys


async def test_a_jwt_signed_by_the_trusted_key_is_accepted_and_names_the_user(
    jwt_server: tuple[Server, RSAKeyPair], fake_funes: FakeFunes
) -> None:
    server, keys = jwt_server
    assert server.post(conversation("user-123", "c", "ticket MT-4471 is open", "ok"))[0] == 202
    wait_for(lambda: (server.home("user-123") / "memory").exists())
    # client_id differs from sub: the user must come from sub (JWT_USER_CLAIM), not client_id
    token = keys.create_token(
        subject="user-123", issuer=ISSUER, audience=AUDIENCE,
        additional_claims={"client_id": "chat-app"},
    )  # fmt: skip
    async with Client(f"{server.url}/mcp", auth=token) as client:
        result = await client.call_tool("recall_my_conversations", {"query": "MT-4471"})
    assert "MT-4471 is open" in result.content[0].text
    assert fake_funes.calls("recall")[-1]["env"]["FUNES_HOME"] == str(server.home("user-123"))


def test_a_jwt_for_another_audience_or_issuer_or_key_or_without_a_live_exp_is_refused(
    jwt_server: tuple[Server, RSAKeyPair],
) -> None:
    # given a server that trusts one key, for one issuer and one audience
    server, keys = jwt_server
    now = int(time.time())
    refused = {
        "wrong audience": signed(keys, claims(aud="other-api")),
        "wrong issuer": signed(keys, claims(iss="https://evil.test")),
        "other key": signed(RSAKeyPair.generate(), claims()),
        "expired": signed(keys, claims(exp=now - 60)),
        "no exp": signed(keys, claims(exp=None)),
    }
    right = signed(keys, claims())
    # when each is presented, then only the right one gets in
    statuses = {why: mcp_status(server, token) for why, token in refused.items()}
    assert statuses == {why: 401 for why in refused}
    assert mcp_status(server, right) == 200


@pytest.mark.parametrize(
    ("unset", "named"),
    [
        ({"JWT_ISSUER": ""}, ["JWT_ISSUER"]),
        ({"JWT_AUDIENCE": ""}, ["JWT_AUDIENCE"]),
        ({"JWT_ISSUER": "", "JWT_AUDIENCE": ""}, ["JWT_ISSUER", "JWT_AUDIENCE"]),
    ],
)
def test_jwt_mode_refuses_to_start_without_an_issuer_and_an_audience(
    tmp_path: Path, fake_funes: FakeFunes, unset: dict[str, str], named: list[str]
) -> None:
    # given a trusted key but no expected issuer or audience
    keys = RSAKeyPair.generate()
    server = make_server(tmp_path, **{**jwt_settings(keys, fake_funes), **unset})
    # when it starts, then it exits with a message naming what is missing
    with pytest.raises(RuntimeError, match="exited early"):
        server.start(timeout=30)
    assert server.process is not None and server.process.returncode != 0
    assert "JWT mode requires" in server.log()
    assert all(name in server.log() for name in named)


def test_refused_tokens_leave_no_user_id_in_the_log_at_any_level(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # given a server logging everything, ours and FastMCP's
    keys = RSAKeyPair.generate()
    settings = jwt_settings(keys, fake_funes)
    server = make_server(tmp_path, **settings, LOG_LEVEL="DEBUG", FASTMCP_LOG_LEVEL="DEBUG")
    marker = f"who-{secrets.token_hex(6)}"  # short: the log's console must not wrap it
    tokens = [
        # the verifier names the caller by client_id, else azp, else sub: try each
        signed(keys, claims(sub=marker, exp=int(time.time()) - 60)),
        signed(keys, claims(sub=marker, azp=marker, aud="other-api")),
        signed(keys, claims(sub=marker, client_id=marker, iss="https://evil.test")),
        signed(keys, claims(sub=marker, exp=None)),
    ]
    with server.start():
        # when each is refused
        assert [mcp_status(server, token) for token in tokens] == [401] * len(tokens)
    # then the refusals are logged, and the user id is in no line of the log
    log = server.log()
    assert "token expired" in log and "audience mismatch" in log and "issuer mismatch" in log
    assert [line for line in log.splitlines() if marker in line] == []


# --- JWT_ALGORITHMS and JWT_PUBLIC_KEY_FILE ---------------------------------------------------


def signed_with(private_pem: str, algorithm: str, payload: dict[str, Any]) -> str:
    key = jwk.import_key(private_pem, "EC" if algorithm.startswith("ES") else "RSA")
    return jwt.encode({"alg": algorithm}, payload, key, algorithms=[algorithm])


@pytest.fixture(scope="module")
def key_file_server(
    tmp_path_factory: pytest.TempPathFactory, fake_funes: FakeFunes
) -> Iterator[tuple[Server, RSAKeyPair]]:
    """A JWT server whose key is in a file (JWT_PUBLIC_KEY_FILE), accepting RS256 and PS256:
    the settings of the next two tests, which need no server each (a start costs seconds)."""
    keys = RSAKeyPair.generate()
    workdir = tmp_path_factory.mktemp("auth-key-file")
    key_file = workdir / "idp-public.pem"
    key_file.write_text(keys.public_key)
    settings = {**jwt_settings(keys, fake_funes), "JWT_PUBLIC_KEY": ""}
    settings |= {"JWT_PUBLIC_KEY_FILE": str(key_file), "JWT_ALGORITHMS": "RS256, PS256"}
    with make_server(workdir, **settings).start() as server:
        yield server, keys


def test_a_public_key_file_is_trusted_like_a_public_key_in_the_environment(
    key_file_server: tuple[Server, RSAKeyPair],
) -> None:
    # given the identity provider's public key in a file, not in the environment
    server, keys = key_file_server
    assert server.env["JWT_PUBLIC_KEY"] == "" and server.env["JWT_PUBLIC_KEY_FILE"]
    # when tokens are presented, then the key in the file decides
    assert mcp_status(server, signed(keys, claims())) == 200
    assert mcp_status(server, signed(RSAKeyPair.generate(), claims())) == 401


def test_jwt_algorithms_accepts_each_listed_algorithm_and_names_an_unlisted_one_in_the_log(
    key_file_server: tuple[Server, RSAKeyPair],
) -> None:
    # given a server accepting RS256 and PS256 from one RSA key
    server, keys = key_file_server
    private = keys.private_key.get_secret_value()
    # when tokens signed each way arrive, then the listed ones get in and RS384 does not
    statuses = {
        algorithm: mcp_status(server, signed_with(private, algorithm, claims()))
        for algorithm in ("RS256", "PS256", "RS384")
    }
    assert statuses == {"RS256": 200, "PS256": 200, "RS384": 401}
    assert "bearer token refused: signed with RS384, not in JWT_ALGORITHMS" in server.log()


def test_an_ec_key_verifies_es256_tokens_when_jwt_algorithms_says_es256(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # given an identity provider that signs with an EC P-256 key
    ec_key = jwk.ECKey.generate_key("P-256")
    public = ec_key.as_pem(private=False).decode()
    settings = {**jwt_settings(RSAKeyPair.generate(), fake_funes), "JWT_PUBLIC_KEY": public}
    with make_server(tmp_path, **settings, JWT_ALGORITHMS="ES256").start() as server:
        # when its token arrives, then it gets in
        token = signed_with(ec_key.as_pem(private=True).decode(), "ES256", claims())
        assert mcp_status(server, token) == 200


def refusal_to_start(tmp_path: Path, settings: dict[str, str]) -> str:
    """The log of a server that must exit at start with these settings."""
    server = make_server(tmp_path, **settings)
    try:
        with pytest.raises(RuntimeError, match="exited early"):
            server.start(timeout=30)
    finally:
        server.stop()
    return server.log()


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        ("hs256", "JWT_ALGORITHMS: HS256 not accepted"),
        ("missing file", "idp-public.pem: not readable"),
        ("key twice", "set only one of JWT_PUBLIC_KEY, JWT_PUBLIC_KEY_FILE"),
        ("private key", "holds a private key: give the server only the public half"),
        ("rsa key for es256", "not a PEM EC public key, which JWT_ALGORITHMS ES256 needs"),
    ],
)
def test_a_jwt_key_setup_that_cannot_verify_refuses_to_start_and_says_why(
    tmp_path: Path, fake_funes: FakeFunes, problem: str, message: str
) -> None:
    # given a key setup with one mistake
    keys = RSAKeyPair.generate()
    key_file = tmp_path / "idp-public.pem"
    public_in_file = {"JWT_PUBLIC_KEY": "", "JWT_PUBLIC_KEY_FILE": str(key_file)}
    mistakes = {
        "hs256": {"JWT_ALGORITHMS": "RS256,HS256"},
        "missing file": public_in_file,
        "key twice": {"JWT_PUBLIC_KEY_FILE": str(key_file)},
        "private key": public_in_file,
        "rsa key for es256": {"JWT_ALGORITHMS": "ES256"},
    }
    if problem in ("key twice", "private key"):
        key_file.write_text(keys.private_key.get_secret_value())
    # when the server starts, then it exits with a line that names the mistake
    log = refusal_to_start(tmp_path, {**jwt_settings(keys, fake_funes), **mistakes[problem]})
    assert message in log
    assert "Traceback" not in log


# --- malformed tokens, the audit's client, the JWKS log lines ---------------------------------


def mode_settings(mode: str, keys: RSAKeyPair, fake_funes: FakeFunes) -> dict[str, str]:
    """Settings for JWTs signed by ``keys`` ("jwt"), or for the generated demo tokens."""
    if mode == "jwt":
        return jwt_settings(keys, fake_funes)
    return {"ENGINE": "funes", "FUNES_BIN": str(fake_funes.path)}


def nested_header_token(depth: int = 1500) -> str:
    """An unsigned JWT whose header is JSON arrays nested ``depth`` deep: too deep to parse."""

    def part(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return f"{part(b'[' * depth + b']' * depth)}.{part(b'{}')}.{part(b'sig')}"


@pytest.mark.parametrize("mode", ["jwt", "demo tokens"])
def test_a_malformed_bearer_token_is_401_at_mcp_and_api_me_and_breaks_no_other_route(
    tmp_path: Path, fake_funes: FakeFunes, mode: str, request: pytest.FixtureRequest
) -> None:
    # given a server verifying JWTs (or demo tokens), and tokens it cannot parse: a header
    # nested too deep for JSON, and one correctly signed but with "exp": Infinity
    keys = RSAKeyPair.generate()
    malformed = {
        "nested header": nested_header_token(),
        "infinite exp": signed(keys, claims(exp=float("inf"))),  # joserfc writes Infinity
    }
    # (JWTs: a server of its own, whose log shows the rate-limited refusal line; demo tokens:
    # the module's, its log read from here on)
    if mode == "jwt":
        running = make_server(tmp_path, **mode_settings(mode, keys, fake_funes)).start()
        logged = 0
    else:
        shared: Server = request.getfixturevalue("funes_server")
        running, logged = contextlib.nullcontext(shared), len(shared.log())
    with running as server:
        # when each is sent on every kind of route
        statuses = {
            why: {
                "/healthz": call(server, "GET", "/healthz", token=token)[0],
                "/mcp": mcp_status(server, token),
                "/api/me": call(server, "GET", "/api/me", token=token)[0],
                "/turns": call(
                    server,
                    "POST",
                    "/turns",
                    conversation("alice", f"c-{index}", "hello", "hi"),
                    token=token,
                    headers={"x-ingest-key": server.ingest_key},
                )[0],
            }
            for index, (why, token) in enumerate(malformed.items())
        }
    # then the token routes refuse it, the others answer as without it, and nothing crashed
    expected = {"/healthz": 200, "/mcp": 401, "/api/me": 401, "/turns": 202}
    assert statuses == {why: expected for why in malformed}
    log = server.log()[logged:]
    assert "Traceback" not in log and "Exception in ASGI application" not in log
    if mode == "jwt":  # a fixed line when the verifier raised, quoting nothing (rate-limited)
        assert MALFORMED in log


def audit_of(server: Server, user: str) -> list[dict[str, Any]]:
    status, answer = server.post({"user": user}, route="/audit")
    assert status == 200, answer
    return answer["entries"]


@pytest.mark.parametrize(
    ("mode", "client_claims", "recorded"),
    [
        ("demo tokens", {}, None),  # FastMCP's client_id is the user here
        ("jwt", {}, None),  # and here it falls back to sub
        ("jwt", {"azp": "chat-app"}, "chat-app"),
        ("jwt", {"client_id": "chat-app", "azp": "other-app"}, "chat-app"),
        ("jwt", {"client_id": "{user}", "azp": "chat-app"}, "chat-app"),
    ],
)
async def test_the_audit_records_the_calling_app_and_the_user_id_is_in_no_file_on_disk(
    tmp_path: Path,
    fake_funes: FakeFunes,
    request: pytest.FixtureRequest,
    mode: str,
    client_claims: dict[str, str],
    recorded: str | None,
) -> None:
    # given a user whose id is a unique marker, and their token: a JWT with these claims
    # besides sub (the module's JWT server: the marker is this test's alone), or a demo token
    # (a server of its own, whose token file names the marker; its files are read once it has
    # stopped, so what a server writes as it stops is looked at too)
    user = f"user-{secrets.token_hex(8)}"
    extra = {name: value.format(user=user) for name, value in client_claims.items()}
    if mode == "jwt":
        server, keys = request.getfixturevalue("jwt_server")
        token = signed(keys, claims(sub=user, **extra))
        running = contextlib.nullcontext(server)
    else:
        settings = mode_settings(mode, RSAKeyPair.generate(), fake_funes)
        server = make_server(tmp_path, **settings, users=(user,))  # type: ignore[arg-type]
        token = server.tokens[user]
        running = server.start()
    with running:
        assert server.post(conversation(user, "c", "ticket MT-4471 is open", "ok"))[0] == 202
        server.wait_indexed(user)
        # when their agent searches and they visit their memory page
        async with Client(f"{server.url}/mcp", auth=token) as client:
            result = await client.call_tool("recall_my_conversations", {"query": "MT-4471"})
        assert "MT-4471 is open" in result.content[0].text  # type: ignore[union-attr]
        for path in ("/api/me", "/api/me/conversations", "/api/me/audit"):
            assert call(server, "GET", path, token=token)[0] == 200
        entries = audit_of(server, user)
    # then the user's own files are there, and the user id is in no file under DATA_DIR
    assert [path for path in server.home(user).rglob("*") if path.is_file()]
    files = [path for path in server.data_dir.rglob("*") if path.is_file()]
    assert [path for path in files if user.encode() in path.read_bytes()] == []
    # and the audit names the calling app only when the token does
    assert [entry["client"] for entry in entries] == [recorded]


@contextmanager
def jwks_served(*keys: dict[str, Any]) -> Iterator[str]:
    """An identity provider's key set on a loopback port; its URL."""
    body = json.dumps({"keys": list(keys)}).encode()

    class KeySet(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:  # quiet test output
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), KeySet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}/jwks"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_token_kid_cannot_forge_a_log_line_and_key_set_lines_stay_for_the_operator(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # given a server in JWKS mode logging everything, whose key set holds its RSA key and an
    # EC key that RS256 cannot use
    keys = RSAKeyPair.generate()
    rsa = {**jwk.RSAKey.import_key(keys.public_key).as_dict(private=False), "kid": "rsa-1"}
    ec = {**jwk.ECKey.generate_key("P-256").as_dict(private=False), "kid": "ec-1"}
    forged = "2026-01-01 INFO recall forged line: user alice"
    with jwks_served(rsa, ec) as jwks_uri:
        settings = {**jwt_settings(keys, fake_funes), "JWT_PUBLIC_KEY": ""}
        server = make_server(tmp_path, **settings, JWT_JWKS_URI=jwks_uri, LOG_LEVEL="DEBUG")
        with server.start():
            # when a token whose kid carries a newline and a log line arrives, then a good one
            statuses = [
                mcp_status(server, signed(keys, claims(), kid=f"x\n{forged}")),
                mcp_status(server, signed(keys, claims(), kid="rsa-1")),
            ]
    # then the first is refused and the second accepted (the key set is served)
    assert statuses == [401, 200]
    # and no line starts with the forged text, which is nowhere in the log: the kid is withheld
    log = server.log()
    assert [line for line in log.splitlines() if line.startswith(forged)] == []
    assert "forged line" not in log
    assert KID_WITHHELD in log
    # and the key set's own lines, which an operator needs, are still written at DEBUG
    assert "Skipping JWKS key 'ec-1': key type 'EC' is incompatible with algorithm RS256" in log


# --- where to sign in (RFC 9728), and a 401 that MCP clients show -----------------------------

MCP_HEADERS = {"accept": "application/json, text/event-stream"}


async def discover(server: Server, token: str | None = None) -> tuple[Any, dict[str, Any] | None]:
    """What the official MCP SDK's discovery finds: the 401 of /mcp, then the protected resource
    metadata at the URLs the SDK tries in its order (the header's first); the raw document."""
    headers = {**MCP_HEADERS, **({"authorization": f"Bearer {token}"} if token else {})}
    async with httpx2.AsyncClient() as http:
        refused = await http.post(f"{server.url}/mcp", json=INITIALIZE, headers=headers)
        named = extract_resource_metadata_from_www_auth(refused)
        for url in build_protected_resource_metadata_discovery_urls(named, f"{server.url}/mcp"):
            found = await http.get(url)
            if await handle_protected_resource_response(found) is not None:
                return refused, {"url": url, **found.json()}
    return refused, None


async def test_jwt_mode_tells_mcp_clients_where_to_sign_in_from_the_401_of_mcp(
    jwt_server: tuple[Server, RSAKeyPair],
) -> None:
    # given a server verifying JWTs of one issuer
    server, keys = jwt_server
    # when the MCP SDK's discovery meets /mcp without a token, and with an expired one
    for token in (None, signed(keys, claims(exp=int(time.time()) - 60))):
        refused, document = await discover(server, token)
        # then the 401 names the metadata document, which names /mcp and the issuer exactly
        assert refused.status_code == 401
        named = f"{server.url}/.well-known/oauth-protected-resource/mcp"
        assert f'resource_metadata="{named}"' in refused.headers["www-authenticate"]
        assert document == {
            "url": named,
            "resource": f"{server.url}/mcp",
            "authorization_servers": [ISSUER],
            "bearer_methods_supported": ["header"],
            "resource_name": "recall-server",
        }
        assert check_resource_allowed(f"{server.url}/mcp", document["resource"])
    # and the bare well-known path, which clients try last, serves the same document
    status, _, root = call(server, "GET", "/.well-known/oauth-protected-resource")
    assert status == 200 and root == {k: v for k, v in document.items() if k != "url"}


async def test_on_loopback_the_sign_in_document_names_the_origin_the_client_used(
    jwt_server: tuple[Server, RSAKeyPair],
) -> None:
    # given a server on loopback without PUBLIC_URL, which serves localhost and 127.0.0.1 alike
    server, _ = jwt_server
    port = server.env["PORT"]
    for origin in (f"http://localhost:{port}", f"http://127.0.0.1:{port}"):
        # when the MCP SDK's discovery reaches /mcp by that name
        async with httpx2.AsyncClient() as http:
            refused = await http.post(f"{origin}/mcp", json=INITIALIZE, headers=MCP_HEADERS)
            named = extract_resource_metadata_from_www_auth(refused)
            document = (await http.get(f"{origin}/.well-known/oauth-protected-resource")).json()
        # then the 401 and the document name that origin, which the SDK accepts for its /mcp
        assert refused.status_code == 401
        assert named == f"{origin}/.well-known/oauth-protected-resource/mcp"
        assert document["resource"] == f"{origin}/mcp"
        assert check_resource_allowed(f"{origin}/mcp", document["resource"])
    # and a Host the server does not serve is refused, never named
    async with httpx2.AsyncClient() as http:
        foreign = await http.get(
            f"{server.url}/.well-known/oauth-protected-resource",
            headers={"host": "evil.example.test"},
        )
    assert foreign.status_code == 421 and "evil" not in foreign.text


def test_the_sign_in_origin_is_the_requests_only_among_the_names_vouched_for() -> None:
    discovery = SignInDiscovery(
        StaticTokenVerifier(tokens={}), ISSUER, "http://127.0.0.1:8000", ["localhost", "[::1]"]
    )
    assert discovery.resource("LOCALHOST:8000") == "http://localhost:8000/mcp"
    assert discovery.resource("[::1]:8000") == "http://[::1]:8000/mcp"
    for host in (None, "", "evil.example.test:8000", "user@localhost:8000", "localhost:99999"):
        assert discovery.resource(host) == "http://127.0.0.1:8000/mcp"
    assert discovery.metadata_url("localhost:8000") == (
        "http://localhost:8000/.well-known/oauth-protected-resource/mcp"
    )


def test_behind_a_proxy_the_sign_in_document_names_the_public_url(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # given a server reached as https://recall.example.test through a proxy
    keys = RSAKeyPair.generate()
    settings = {**jwt_settings(keys, fake_funes), "PUBLIC_URL": "https://recall.example.test/"}
    with make_server(tmp_path, **settings).start() as server:
        # when a client is refused and reads the document
        refused = call(server, "POST", "/mcp", INITIALIZE, None, MCP_HEADERS)
        status, _, document = call(server, "GET", "/.well-known/oauth-protected-resource/mcp")
    # then both name the public URL, not the address the server listens on
    public = "https://recall.example.test"
    challenge = refused[1]["www-authenticate"]
    assert f'resource_metadata="{public}/.well-known/oauth-protected-resource/mcp"' in challenge
    assert status == 200 and document["resource"] == f"{public}/mcp"


def test_jwt_mode_off_loopback_serves_sign_in_discovery_once_public_url_names_the_origin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = RSAKeyPair.generate()
    settings = {
        "ingest_key": secrets.token_hex(16),
        "host": "0.0.0.0",
        "allowed_hosts": "recall.example.test",
        "jwt_public_key": keys.public_key,
        "jwt_issuer": ISSUER,
        "jwt_audience": AUDIENCE,
    }
    # without PUBLIC_URL the server starts (as before it existed), with no document, and says so
    unnamed = Settings(**settings)
    assert unnamed.problems() == []
    with caplog.at_level(logging.WARNING, logger="recall.auth"):
        assert not isinstance(build_verifier(unnamed), SignInDiscovery)
    assert "PUBLIC_URL is not set: no sign-in discovery" in caplog.text
    named = Settings(**settings, public_url="https://recall.example.test")
    assert named.problems() == [] and isinstance(build_verifier(named), SignInDiscovery)
    assert Settings(**settings, public_url="https://recall.example.test/x").problems() == [
        "PUBLIC_URL: an origin only (scheme://host[:port]), no path or query"
    ]


def test_demo_tokens_have_no_sign_in_document_and_the_401_names_none(funes_server: Server) -> None:
    # given demo tokens (no authorization server to name), then no document, and a bare challenge
    for path in (
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ):
        assert call(funes_server, "GET", path)[0] == 404
    refused = call(funes_server, "POST", "/mcp", INITIALIZE, None, MCP_HEADERS)
    assert refused[0] == 401 and refused[1]["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("mode", "reason"), [("jwt", "token expired"), ("demo tokens", "unknown token")]
)
def test_every_method_of_mcp_checks_the_token_first_and_the_401_says_why(
    request: pytest.FixtureRequest, mode: str, reason: str
) -> None:
    # given a server (the module's, verifying JWTs or the demo tokens), and a token it refuses
    if mode == "jwt":
        server, keys = request.getfixturevalue("jwt_server")
        refused = signed(keys, claims(exp=int(time.time()) - 60))
    else:
        server, refused = request.getfixturevalue("funes_server"), "not-a-token"
    # when each method comes without a token and with the refused one
    answers = {
        (method, offered): call(
            server,
            method,
            "/mcp",
            INITIALIZE if method in ("POST", "PUT") else None,
            refused if offered else None,
            MCP_HEADERS,
        )
        for method in ("GET", "POST", "DELETE", "PUT")
        for offered in (False, True)
    }
    # then each is 401 (GET was 405 before the token was looked at), with RFC 6750's header and
    # a JSON-RPC error that names the reason
    for (method, offered), (status, headers, body) in answers.items():
        assert status == 401, (method, offered)
        challenge = headers["www-authenticate"]
        assert challenge.startswith("Bearer")
        assert ('error="invalid_token"' in challenge) is offered
        assert body["jsonrpc"] == "2.0" and body["id"] is None
        assert body["error"]["code"] == UNAUTHORIZED
        expected = f"bearer token refused: {reason}" if offered else "no bearer token"
        assert expected in body["error"]["message"], (method, body)


def shown(exc: BaseException) -> str:
    """Every message an exception carries, through exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return " | ".join(shown(inner) for inner in exc.exceptions)
    return str(exc)


async def official_sdk_session(url: str, token: str) -> None:
    async with (
        httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()


async def fastmcp_session(url: str, token: str) -> None:
    async with Client(url, auth=token) as client:
        await client.list_tools()


@pytest.mark.parametrize("connect", [official_sdk_session, fastmcp_session])
async def test_mcp_clients_show_why_a_token_was_refused(
    jwt_server: tuple[Server, RSAKeyPair], connect: Any
) -> None:
    # given an expired token, and a token for another audience
    server, keys = jwt_server
    tokens = {
        "token expired": signed(keys, claims(exp=int(time.time()) - 60)),
        "audience mismatch": signed(keys, claims(aud="other-api")),
    }
    for reason, token in tokens.items():
        # when a real MCP client connects with it
        with pytest.raises(BaseException) as raised:  # each client raises its own type
            await connect(f"{server.url}/mcp", token)
        # then what it raises names the reason, not only "Server returned an error response"
        assert f"Unauthorized: bearer token refused: {reason}" in shown(raised.value)
