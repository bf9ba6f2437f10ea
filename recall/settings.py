"""Every setting is an environment variable with the same name (README.md's settings table)."""

from __future__ import annotations

from ipaddress import ip_address
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from recall.conversations import Limits

# Words that mark a key copied from a sample rather than generated (compared lowercased).
PLACEHOLDER_MARKS = ("change-me", "changeme", "change_me", "example", "placeholder")


class ConfigError(Exception):
    """The server cannot start with this configuration."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    data_dir: Path = Path("recall-data")
    log_level: str = "INFO"

    # Write path. The key guards an internal route the chat gateway calls; 16+ chars, and no
    # placeholder, so a typo'd or copied sample value cannot start a server.
    ingest_key: str = ""
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_turns: int = Field(5_000, ge=1)
    max_text_chars: int = Field(200_000, ge=1)

    # Read path identity: a demo token map, or JWTs from the company's identity provider. JWT mode
    # requires an issuer and an audience: the key alone would accept any token it ever signed.
    auth_tokens_file: Path | None = None
    jwt_jwks_uri: str | None = None
    jwt_public_key: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_user_claim: str = "sub"

    # Engines.
    engine: Literal["auto", "funes", "embedded"] = "auto"
    funes_bin: str | None = None
    hf_home: Path | None = None  # funes reads its baked models from here
    embed_model_dir: Path | None = None  # any local ONNX model + tokenizer.json
    embed_pooling: Literal["mean", "cls"] = "mean"

    # Recall bounds: the brief's values (k 3 and a pool below 4 x k keep funes' reranker off).
    recall_k: int = Field(3, ge=1, le=50)
    recall_candidates: int = Field(8, ge=1, le=200)
    recall_timeout: float = Field(10.0, gt=0)
    recall_concurrency: int = Field(4, ge=1)
    recall_half_life_days: float = Field(0.0, ge=0)
    max_result_chars: int = Field(4000, ge=200)
    # The embedded engine's cache of users' vector matrices (1.5 KB a passage): 256 MB holds
    # about 170k passages, several heavy users, on a small instance. 0: no cache.
    vector_cache_mb: int = Field(256, ge=0)

    # Indexing: a burst of posts gives one run; runs never block a request.
    index_debounce: float = Field(1.0, ge=0)
    index_timeout: float = Field(300.0, gt=0)
    # Index runs at once across users: each loads a model and keeps cores busy; 2 leaves the
    # request path room on a small machine.
    index_concurrency: int = Field(2, ge=1)

    # Transport bounds: no client holds a connection, a descriptor or a slot for long.
    # 200 open connections: far more than RECALL_CONCURRENCY lets work at once, far below the
    # common limit of 1024 open files.
    max_connections: int = Field(200, ge=1)
    # 5 s, uvicorn's own default: an idle connection, or a request head that does not finish,
    # is closed after it.
    keepalive_timeout: float = Field(5.0, gt=0)
    # 30 s: a whole 8 MiB /turns body even at 2 Mbit/s; a stalled upload gets 408.
    body_timeout: float = Field(30.0, gt=0)
    # DNS-rebinding protection: Host names (and browser origins) served, comma-separated. The
    # loopback names are always allowed; empty means loopback only, which refuses to start when
    # HOST is not loopback (the names clients use are unknowable here).
    allowed_hosts: str = ""
    allowed_origins: str = ""

    def host_allowlist(self) -> list[str]:
        """Host header names to serve; empty when HOST is not loopback and none are set."""
        configured = [name.strip() for name in self.allowed_hosts.split(",") if name.strip()]
        loopback = self.host == "localhost" or _is_loopback_address(self.host)
        return configured or (["127.0.0.1", "localhost", "[::1]"] if loopback else [])

    def origin_allowlist(self) -> list[str]:
        """Browser origins to serve besides the server's own and loopback ones."""
        return [name.strip() for name in self.allowed_origins.split(",") if name.strip()]

    @field_validator("jwt_jwks_uri", "jwt_public_key", "jwt_issuer", "jwt_audience", "funes_bin")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value or None

    @field_validator("auth_tokens_file", "hf_home", "embed_model_dir", mode="before")
    @classmethod
    def _blank_path_is_unset(cls, value: object) -> object:
        return value or None

    def limits(self) -> Limits:
        """What one posted conversation may hold (the route and the backfill apply the same)."""
        return Limits(max_turns=self.max_turns, max_text_chars=self.max_text_chars)

    def problems(self) -> list[str]:
        """Reasons this configuration must not serve; empty when it may."""
        found = []
        if len(self.ingest_key) < 16:
            found.append("INGEST_KEY must be set to at least 16 characters")
        elif is_placeholder_key(self.ingest_key):
            found.append(
                "INGEST_KEY looks like a placeholder, not a secret: generate one, e.g. "
                "python3 -c 'import secrets; print(secrets.token_hex(16))'"
            )
        if not (self.auth_tokens_file or self.jwt_jwks_uri or self.jwt_public_key):
            found.append("set AUTH_TOKENS_FILE or JWT_JWKS_URI/JWT_PUBLIC_KEY to verify tokens")
        if self.auth_tokens_file and (self.jwt_jwks_uri or self.jwt_public_key):
            found.append("set either AUTH_TOKENS_FILE or JWT_*, not both")
        if self.jwt_jwks_uri and self.jwt_public_key:
            found.append("set either JWT_JWKS_URI or JWT_PUBLIC_KEY, not both")
        if self.jwt_jwks_uri or self.jwt_public_key:
            expected = {"JWT_ISSUER": self.jwt_issuer, "JWT_AUDIENCE": self.jwt_audience}
            missing = [name for name, value in expected.items() if not value]
            if missing:
                found.append(
                    f"JWT mode requires {' and '.join(missing)}: without them a token the key "
                    "signed for another service or issuer would be accepted"
                )
        return found


def is_placeholder_key(key: str) -> bool:
    """A sample value (e.g. compose's old default) or one character repeated: not a secret."""
    lowered = key.lower()
    return len(set(key)) == 1 or any(mark in lowered for mark in PLACEHOLDER_MARKS)


def load_settings() -> Settings:
    """The settings from the environment; ConfigError naming the first bad one."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"bad setting {str(first['loc'][0]).upper()}: {first['msg']}") from exc


def _is_loopback_address(host: str) -> bool:
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
