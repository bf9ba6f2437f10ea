"""Who is calling: FastMCP's own token verifiers, and the user a verified token names."""

from __future__ import annotations

import json
import logging

from fastmcp.server.auth import AccessToken, TokenVerifier
from fastmcp.server.auth.providers.jwt import JWTVerifier, StaticTokenVerifier

from recall.settings import ConfigError, Settings

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


class CallerNamesWithheld(logging.Filter):
    """Rewrites FastMCP's verifier lines to a fixed text, so no claim value reaches the log.

    Lines about the key set (JWKS) pass as they are: they quote the identity provider's keys,
    not a caller, and an operator needs them to fix a key setup.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        template = str(record.msg)
        if "JWKS" in template:
            return True
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


def build_verifier(settings: Settings) -> TokenVerifier:
    logging.getLogger(FASTMCP_VERIFIER_LOGGER).addFilter(CALLER_NAMES_WITHHELD)
    if settings.jwt_jwks_uri or settings.jwt_public_key:
        # Settings.problems() has made sure issuer and audience are set.
        return ExpiringJWTVerifier(
            public_key=settings.jwt_public_key,
            jwks_uri=settings.jwt_jwks_uri,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
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
