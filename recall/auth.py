"""Who is calling: FastMCP's own token verifiers, and the user a verified token names."""

from __future__ import annotations

import json
import logging

from fastmcp.server.auth import AccessToken, TokenVerifier
from fastmcp.server.auth.providers.jwt import JWTVerifier, StaticTokenVerifier
from fastmcp.utilities.auth import decode_jwt_header
from joserfc import jwk
from joserfc.errors import JoseError

from recall.logs import vetted
from recall.settings import PUBLIC_KEY_ALGORITHMS, ConfigError, Settings

log = logging.getLogger(__name__)

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
KID_WITHHELD = "bearer token refused: no usable JWKS key for its key ID (kid withheld)"
# Any exception while verifying: a malformed token (a header nested too deep, "exp": Infinity).
MALFORMED = "bearer token refused: malformed token (details withheld)"


class CallerNamesWithheld(logging.Filter):
    """Rewrites FastMCP's verifier lines to a fixed text, so no claim or header value reaches
    the log; what passes is vetted, so it is written at DEBUG too (recall/logs.py).

    Lines about the key set (JWKS) pass as they are: they quote the identity provider's keys,
    not a caller, and an operator needs them to fix a key setup. Those that quote the token's
    key ID do not.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        vetted(record)
        template = str(record.msg)
        if "JWKS" in template:
            if QUOTED_KID not in record.getMessage().lower():
                return True
            record.msg = KID_WITHHELD
        else:
            reason = next((text for mark, text in REFUSAL_REASONS if mark in template), None)
            record.msg = f"bearer token refused: {reason or 'invalid token (details withheld)'}"
        record.args = ()
        record.exc_info = record.exc_text = None
        return True


CALLER_NAMES_WITHHELD = CallerNamesWithheld()  # one instance: installing it twice is a no-op


class ExpiringJWTVerifier(JWTVerifier):
    """FastMCP's JWTVerifier, but a token without `exp` is refused: it would be valid forever."""

    async def load_access_token(self, token: str) -> AccessToken | None:
        access = await super().load_access_token(token)
        if access is not None and access.expires_at is None:
            log.info("bearer token refused: no exp claim")
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
            log.info("bearer token refused: signature or format invalid")
            return None
        algorithm = header.get("alg") if isinstance(header, dict) else None
        verifier = self._verifiers.get(algorithm) if isinstance(algorithm, str) else None
        if verifier is None:
            shown = algorithm if algorithm in KNOWN_ALGORITHMS else "an unknown algorithm"
            log.info("bearer token refused: signed with %s, not in JWT_ALGORITHMS", shown)
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
        try:
            return await self._verifier.verify_token(token)
        except Exception:  # one fixed line: the exception would quote the token or its claims
            log.info(MALFORMED)
            return None


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


def build_verifier(settings: Settings) -> TokenVerifier:
    logging.getLogger(FASTMCP_VERIFIER_LOGGER).addFilter(CALLER_NAMES_WITHHELD)
    return RefusedOnError(_verifier(settings))


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
