"""Who is calling: FastMCP's own token verifiers, and the user a verified token names."""

from __future__ import annotations

import json

from fastmcp.server.auth import AccessToken, TokenVerifier
from fastmcp.server.auth.providers.jwt import JWTVerifier, StaticTokenVerifier

from recall.settings import Settings


class ConfigError(Exception):
    """The server cannot start with this configuration."""


def build_verifier(settings: Settings) -> TokenVerifier:
    if settings.jwt_jwks_uri or settings.jwt_public_key:
        return JWTVerifier(
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
