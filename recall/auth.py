"""Who is calling: FastMCP's own token verifiers, and the user a verified token names; how a
refused token is answered at /mcp, and where a client signs in (RFC 9728)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from contextvars import ContextVar
from urllib.parse import urlsplit

from fastmcp.server.auth import AccessToken, AuthProvider, RemoteAuthProvider, TokenVerifier
from fastmcp.server.auth.providers.jwt import JWTVerifier, StaticTokenVerifier
from fastmcp.utilities.auth import decode_jwt_header
from joserfc import jwk
from joserfc.errors import JoseError
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from pydantic import AnyHttpUrl
from starlette.authentication import BaseUser
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from recall.logs import Refusals, vetted
from recall.settings import PUBLIC_KEY_ALGORITHMS, ConfigError, Settings

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
MEMORY_API = "/api/me"  # with /mcp, what a bearer token opens: a refusal there is logged
REFUSED = "bearer token refused: "  # every refusal line starts so; the reason follows
# Why the token being verified was refused, for this request's 401 and its log line: set by the
# verifiers below (and from FastMCP's verifier lines) in the request's own context.
REFUSAL: ContextVar[str | None] = ContextVar("recall_token_refusal", default=None)
NO_TOKEN = "no bearer token (send Authorization: Bearer <token>)"
# A JSON-RPC error code for "not signed in" (JSON-RPC leaves -32000 to -32099 to servers).
UNAUTHORIZED = -32001
WELL_KNOWN = "/.well-known/oauth-protected-resource"
# A Host header that is a name or an address and a port, nothing else (no user info, no path).
HOST_HEADER = re.compile(r"(?P<name>\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?")


def refuse(reason: str) -> None:
    """Records why the token being verified is refused (a fixed text, never a claim's value);
    the first reason stands (FastMCP's verifier follows a JWKS line with a vaguer one)."""
    if REFUSAL.get() is None:
        REFUSAL.set(reason)


# FastMCP's verifiers log here, and name the caller (client_id, azp or sub: often the user).
FASTMCP_VERIFIER_LOGGER = "fastmcp.server.auth.providers.jwt"
# What a refusal line from that logger becomes: its template's reason, never its arguments.
REFUSAL_REASONS = (
    ("expired", "token expired"),
    ("not yet valid", "token not yet valid"),
    ("issuer mismatch", "issuer mismatch"),
    ("audience mismatch", "audience mismatch"),
    ("scopes", "missing required scopes"),
    ("signature/format", "signature or format invalid"),
)
# Algorithms a refusal may name; anything else in a token's header is the caller's free text.
KNOWN_ALGORITHMS = frozenset({*PUBLIC_KEY_ALGORITHMS, "HS256", "HS384", "HS512", "none"})
# How FastMCP quotes the token's `kid` ("key ID '%s' not found", "Key ID '...' not found in
# JWKS"); "no key ID (kid) in token" quotes none.
QUOTED_KID = "key id '"
# What a line quoting the token's kid becomes: the kid is the caller's unverified text.
KID_WITHHELD = REFUSED + "no usable JWKS key for its key ID (kid withheld)"
# Any exception while verifying: a malformed token (a header nested too deep, "exp": Infinity).
MALFORMED = REFUSED + "malformed token (details withheld)"


class CallerNamesWithheld(logging.Filter):
    """Takes FastMCP's verifier lines as refusal reasons (a fixed text each, so no claim or
    header value reaches the log or the 401) and drops them: the refusal is logged once, by
    whoever refuses the request (`TokenFirst`).

    Lines about the key set (JWKS) pass as they are, at LOG_LEVEL, vetted so DEBUG keeps them
    (recall/logs.py): they quote the identity provider's keys, not a caller, and an operator
    needs them to fix a key setup. Those that quote the token's key ID are a refusal.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        template = str(record.msg)
        if "JWKS" in template and QUOTED_KID not in record.getMessage().lower():
            vetted(record)
            return record.levelno >= logging.getLogger().getEffectiveLevel()
        if "JWKS" in template:
            refuse(KID_WITHHELD.removeprefix(REFUSED))
        else:
            reason = next((text for mark, text in REFUSAL_REASONS if mark in template), None)
            refuse(reason or "invalid token (details withheld)")
        return False


CALLER_NAMES_WITHHELD = CallerNamesWithheld()  # one instance: installing it twice is a no-op


class ExpiringJWTVerifier(JWTVerifier):
    """FastMCP's JWTVerifier, but a token without `exp` is refused: it would be valid forever."""

    async def load_access_token(self, token: str) -> AccessToken | None:
        access = await super().load_access_token(token)
        if access is not None and access.expires_at is None:
            refuse("no exp claim")
            return None
        return access


class VerifierPerAlgorithm(TokenVerifier):
    """One JWT verifier per accepted algorithm (FastMCP's takes one, and filters a JWKS by its
    key type); a token goes to the one its header's `alg` names, and any other is refused."""

    def __init__(self, verifiers: dict[str, TokenVerifier]) -> None:
        super().__init__()
        self._verifiers = verifiers

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            header = decode_jwt_header(token)
        except ValueError:  # not three parts, or not base64 JSON
            refuse("signature or format invalid")
            return None
        algorithm = header.get("alg") if isinstance(header, dict) else None
        verifier = self._verifiers.get(algorithm) if isinstance(algorithm, str) else None
        if verifier is None:
            shown = algorithm if algorithm in KNOWN_ALGORITHMS else "an unknown algorithm"
            refuse(f"signed with {shown}, not in JWT_ALGORITHMS")
            return None
        return await verifier.verify_token(token)


class RefusedOnError(TokenVerifier):
    """A verifier that never raises: any exception while verifying refuses the token.

    FastMCP's middleware verifies any bearer token on every route, /healthz too, so an
    exception there (RecursionError from a deeply nested header, OverflowError from
    `"exp": Infinity`) would answer 500 with a traceback everywhere instead of 401.
    """

    def __init__(self, verifier: TokenVerifier) -> None:
        super().__init__(required_scopes=verifier.required_scopes)
        self._verifier = verifier

    async def verify_token(self, token: str) -> AccessToken | None:
        REFUSAL.set(None)
        try:
            access = await self._verifier.verify_token(token)
        except Exception:  # a fixed reason: the exception would quote the token or its claims
            refuse(MALFORMED.removeprefix(REFUSED))
            return None
        if access is None and REFUSAL.get() is None:  # a demo token not in AUTH_TOKENS_FILE
            refuse("unknown token")
        return access


def key_type(algorithm: str) -> str:
    """The JWK key type a public-key algorithm verifies with."""
    return {"RS": "RSA", "PS": "RSA", "ES": "EC"}.get(algorithm[:2], "OKP")


def public_key_pem(settings: Settings) -> str | None:
    """JWT_PUBLIC_KEY, or the file JWT_PUBLIC_KEY_FILE names; checked against JWT_ALGORITHMS so a
    wrong key stops the start instead of refusing every token."""
    pem, source = settings.jwt_public_key, "JWT_PUBLIC_KEY"
    if settings.jwt_public_key_file:
        source = f"JWT_PUBLIC_KEY_FILE {settings.jwt_public_key_file}"
        try:
            pem = settings.jwt_public_key_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{source}: not readable ({exc})") from exc
    if pem is None:
        return None
    if "PRIVATE KEY" in pem:
        raise ConfigError(
            f"{source} holds a private key: give the server only the public half "
            "(e.g. openssl pkey -in private.pem -pubout)"
        )
    for algorithm in settings.jwt_algorithm_list():
        try:
            jwk.import_key(pem, key_type(algorithm))  # type: ignore[call-overload]
        except (JoseError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"{source}: not a PEM {key_type(algorithm)} public key, which JWT_ALGORITHMS "
                f"{algorithm} needs"
            ) from exc
    return pem


def build_verifier(settings: Settings) -> AuthProvider:
    """The token verifier /mcp and /api/me use; in JWT mode wrapped in FastMCP's provider that
    serves where to sign in (RFC 9728), when JWT_ISSUER is a URL an MCP client can go to."""
    verifier_log = logging.getLogger(FASTMCP_VERIFIER_LOGGER)
    verifier_log.addFilter(CALLER_NAMES_WITHHELD)
    # Every line is made, whatever LOG_LEVEL: each one is a refusal's reason for the 401.
    verifier_log.setLevel(logging.DEBUG)
    verifier = RefusedOnError(_verifier(settings))
    issuer, origin = settings.jwt_issuer, settings.resource_origin()
    if settings.auth_tokens_file or issuer is None:  # demo: no IdP to name
        return verifier
    if origin is None:  # behind a proxy the server cannot see the name clients use
        log.warning("PUBLIC_URL is not set: no sign-in discovery at %s", WELL_KNOWN)
        return verifier
    parts = urlsplit(issuer)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        log.warning("JWT_ISSUER is not an http(s) URL: no sign-in discovery at %s", WELL_KNOWN)
        return verifier
    # On loopback without PUBLIC_URL, a client may reach the server by any name it serves
    # (localhost or 127.0.0.1): the document names the one the request came by, else the MCP
    # SDK refuses a resource whose origin is not the one it connected to.
    vouched = [] if settings.public_url else [h for h in settings.host_allowlist() if "*" not in h]
    return SignInDiscovery(verifier, issuer, origin, vouched)


class SignInDiscovery(RemoteAuthProvider):
    """FastMCP's resource-server provider: tokens checked by ``verifier``, and the Protected
    Resource Metadata (RFC 9728) naming this server's /mcp and JWT_ISSUER as where to sign in,
    at the path RFC 9728 gives for /mcp and at the bare well-known path that clients try too.
    The document carries JWT_ISSUER exactly as set (pydantic's URL type would add a "/", and
    an issuer is compared exactly).

    The resource's origin is ``origin`` (PUBLIC_URL, or http://HOST:PORT on loopback), or the
    one a request came by when its Host header names one of ``vouched`` (the names served on
    loopback without PUBLIC_URL): never any other Host's."""

    def __init__(
        self, verifier: TokenVerifier, issuer: str, origin: str, vouched: Iterable[str] = ()
    ) -> None:
        super().__init__(
            verifier, [AnyHttpUrl(issuer)], base_url=origin, resource_name="recall-server"
        )
        self.issuer = issuer
        self.origin = origin
        self.vouched = {name.lower() for name in vouched}

    def origin_for(self, host: str | None) -> str:
        """The origin to name for a request with this Host header."""
        found = HOST_HEADER.fullmatch((host or "").lower())
        if not found or found["name"] not in self.vouched:
            return self.origin
        port = found["port"]
        if port is not None and not 0 < int(port) < 65536:
            return self.origin
        return f"http://{found['name']}" + (f":{int(port)}" if port else "")

    def resource(self, host: str | None) -> str:
        """The protected resource (/mcp) as a request with this Host header reaches it."""
        return str(AnyHttpUrl(self.origin_for(host) + MCP_PATH))

    def get_routes(self, mcp_path: str | None = None) -> list[Route]:
        super().get_routes(mcp_path)  # FastMCP's hook: the provider learns the resource URL
        resource = self._get_resource_url(mcp_path)
        assert resource is not None  # base_url is always set here
        document: dict[str, object] = {
            "resource": str(resource),
            "authorization_servers": [self.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": self.resource_name,
        }
        if self.scopes_supported:
            document["scopes_supported"] = self.scopes_supported

        async def metadata(request: Request) -> JSONResponse:
            named = {**document, "resource": self.resource(request.headers.get("host"))}
            return JSONResponse(named, headers={"Cache-Control": "public, max-age=3600"})

        endpoint = cors_middleware(metadata, ["GET", "OPTIONS"])  # browser clients read it too
        paths = {urlsplit(str(build_resource_metadata_url(resource))).path, WELL_KNOWN}
        return [Route(path, endpoint, methods=["GET", "OPTIONS"]) for path in sorted(paths)]

    def metadata_url(self, host: str | None = None) -> str:
        """Where the 401's WWW-Authenticate points (RFC 9728's path for /mcp), for a request
        with this Host header."""
        return str(build_resource_metadata_url(AnyHttpUrl(self.resource(host))))


class TokenFirst:
    """ASGI middleware behind FastMCP's authentication: a request to /mcp without a token the
    verifier accepted is answered 401 whatever its method (the route answered GET with 405
    before it looked at the token), with RFC 6750's WWW-Authenticate (naming the sign-in
    document in JWT mode) and a JSON-RPC error body that MCP clients show. A refusal at /mcp
    or /api/me (which answers its own 401) is logged with its reason, rate-limited."""

    def __init__(self, app: ASGIApp, auth: AuthProvider, refusals: Refusals) -> None:
        self.app = app
        self.discovery = auth if isinstance(auth, SignInDiscovery) else None
        self.refusals = refusals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        user = scope.get("user")
        if scope["type"] != "http" or (isinstance(user, BaseUser) and user.is_authenticated):
            await self.app(scope, receive, send)
            return
        mcp = path.rstrip("/") == MCP_PATH
        if not (mcp or path == MEMORY_API or path.startswith(f"{MEMORY_API}/")):
            await self.app(scope, receive, send)
            return
        offered = any(
            name == b"authorization" and value[:7].lower() == b"bearer "
            for name, value in scope.get("headers", [])
        )
        reason = (REFUSAL.get() or "invalid token") if offered else NO_TOKEN
        self.refusals.note(REFUSED + reason)
        if not mcp:
            await self.app(scope, receive, send)
            return
        metadata = None
        if self.discovery is not None:
            host = next((v for k, v in scope.get("headers", []) if k == b"host"), b"")
            metadata = self.discovery.metadata_url(host.decode("latin-1"))
        await self.challenge(offered, reason, metadata)(scope, receive, send)

    def challenge(self, offered: bool, reason: str, metadata: str | None) -> JSONResponse:
        # RFC 6750 3.1: no error attribute when no token came; invalid_token when one was refused.
        parts = [f'error="invalid_token", error_description="{reason}"'] if offered else []
        if metadata:
            parts.append(f'resource_metadata="{metadata}"')
        message = f"Unauthorized: {REFUSED if offered else ''}{reason}"
        if metadata:
            message += f"; where to sign in: {metadata}"
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": UNAUTHORIZED, "message": message}}
        challenge = "Bearer" + (" " + ", ".join(parts) if parts else "")
        return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": challenge})


def _verifier(settings: Settings) -> TokenVerifier:
    if settings.jwt_jwks_uri or settings.jwt_public_key or settings.jwt_public_key_file:
        # Settings.problems() has made sure issuer and audience are set, one key source, and
        # public-key algorithms only.
        public_key = public_key_pem(settings)
        return VerifierPerAlgorithm(
            {
                algorithm: ExpiringJWTVerifier(
                    public_key=public_key,
                    jwks_uri=settings.jwt_jwks_uri,
                    issuer=settings.jwt_issuer,
                    audience=settings.jwt_audience,
                    algorithm=algorithm,
                )
                for algorithm in settings.jwt_algorithm_list()
            }
        )
    if settings.auth_tokens_file:
        return StaticTokenVerifier(tokens=_static_tokens(settings))
    raise ConfigError("no way to verify tokens")


def _static_tokens(settings: Settings) -> dict[str, dict[str, object]]:
    path = settings.auth_tokens_file
    assert path is not None
    try:
        mapping = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"AUTH_TOKENS_FILE {path}: not a readable JSON object ({exc})") from exc
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in mapping.items()
    ):
        raise ConfigError(f"AUTH_TOKENS_FILE {path}: must map token strings to user id strings")
    # StaticTokenVerifier needs client_id; the user also goes under the configured claim so
    # one code path (user_from_token) serves demo tokens and JWTs alike.
    return {
        token: {"client_id": user, "sub": user, settings.jwt_user_claim: user, "scopes": []}
        for token, user in mapping.items()
    }


def user_from_token(token: AccessToken | None, claim: str) -> str | None:
    """The user id a verified token names, or None.

    Never client_id: for a JWT that is the calling app, not the user.
    """
    if token is None:
        return None
    value = (token.claims or {}).get(claim)
    return value if isinstance(value, str) and value else None


def client_of(token: AccessToken | None, user: str) -> str | None:
    """The calling app a token names, for the audit: its own `client_id` or `azp` claim, never
    the user's id.

    Not AccessToken.client_id: FastMCP fills that from `sub` when neither claim is there, and
    demo tokens carry the user as client_id; a value equal to the user or `sub` is no client.
    """
    claims = token.claims if token is not None else None
    if not claims:
        return None
    people = (user, claims.get("sub"))  # a tuple: a claim may be any JSON value, even a list
    return next(
        (
            value
            for value in (claims.get("client_id"), claims.get("azp"))
            if isinstance(value, str) and value and value not in people
        ),
        None,
    )
