"""Every setting is an environment variable with the same name (docs/settings.md's table)."""

from __future__ import annotations

import re
import textwrap
from contextlib import suppress
from ipaddress import ip_address
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from recall.domain.conversation import Limits
from recall.redaction import BadPatterns, Redactor

# Words that mark a key copied from a sample rather than generated (compared lowercased).
PLACEHOLDER_MARKS = ("change-me", "changeme", "change_me", "example", "placeholder")
# The JWT signing algorithms FastMCP's verifier knows, less the symmetric HS* ones.
# LOG_LEVEL's values (any case): anything else stops the start with one line, not a traceback.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# How a missing, short or placeholder INGEST_KEY is answered: with a way to make a real one.
GENERATE_KEY = "generate one, e.g. python3 -c 'import secrets; print(secrets.token_hex(16))'"
PUBLIC_KEY_ALGORITHMS = (
    *("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"),
    *("EdDSA", "Ed25519", "Ed448"),
)


# RECALL_MIN_SIMILARITY's default per EMBED_MODEL, on each model's own cosine scale. MiniLM's 0.3
# was measured on the benchmarks (benchmark/README.md). multilingual-e5-small puts every pair of
# texts at 0.75 and above: its floor is where the same share of questions falls below it as below
# MiniLM's 0.3 (every question of two LoCoMo histories, answered or not: 0.812 and 0.822; no
# outcome was looked at), so the gate keeps its meaning (benchmark/README.md, "Other languages").
MODEL_MIN_SIMILARITY = {"minilm": 0.3, "multilingual-e5-small": 0.81}


def shown(default: str) -> dict[str, str]:
    """How a setting's default reads in --help and docs/settings.md, where its value says little."""
    return {"shown_default": default}  # in parentheses: it is a note, not a value


class ConfigError(Exception):
    """The server cannot start with this configuration."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore")

    host: str = Field(
        "127.0.0.1", description="interface to listen on (`0.0.0.0` in the container)"
    )
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")
    data_dir: Path = Field(Path("recall-data"), description="where user directories live")
    log_level: str = Field(
        "INFO",
        description="`DEBUG`, `INFO`, `WARNING` or `ERROR` for our lines, and from `INFO` up for "
        "FastMCP's and uvicorn's (their debug lines quote requests); logs never hold user ids, "
        "tokens, keys or conversation text",
    )
    # Text by default: what a person reads in a terminal; json for a log collector.
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`text` (`<time> <LEVEL> <logger> <message>`) or `json` (one object a line: "
        "`time`, `level`, `logger`, `event`, and `user` as its directory hash and `seconds` "
        "where a line has them)",
    )
    # Unset: /metrics holds counts and timings only (no user, token or text), like /healthz.
    metrics_token: str = Field(
        "",
        description="when set, `GET /metrics` requires `Authorization: Bearer <METRICS_TOKEN>` "
        "(else 401); unset, it is open",
        json_schema_extra=shown("(open)"),
    )

    # Write path. The key guards an internal route the chat gateway calls; 16+ chars, and no
    # placeholder, so a typo'd or copied sample value cannot start a server.
    ingest_key: str = Field(
        "",
        description="shared key the gateway sends in `x-ingest-key`; placeholders (`change-me`, "
        "`example`, one repeated character) are refused",
        json_schema_extra=shown("(required, 16+ chars)"),
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest `/turns` body")
    max_turns: int = Field(5_000, ge=1, description="turns per conversation")
    max_text_chars: int = Field(200_000, ge=1, description="characters per turn")
    import_max_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=1024,
        description="largest chat export `import-chats` and the memory page's upload take: the "
        "file or zip, and the chats read out of it ([import.md](import.md))",
    )
    # Unset: the built-in credential patterns cover the common providers; a deployment adds its own.
    redact_patterns_file: Path | None = Field(
        None,
        description="extra redaction patterns, one `kind<TAB>regex` a line (a group named "
        "`secret` redacts only that group); a bad file refuses to start",
    )

    # Read path identity: a demo token map, or JWTs from the company's identity provider. JWT mode
    # requires an issuer and an audience: the key alone would accept any token it ever signed.
    auth_tokens_file: Path | None = Field(None, description="JSON object token -> user id (demo)")
    jwt_jwks_uri: str | None = Field(
        None, description="verify JWTs by the keys the identity provider publishes at this URL"
    )
    jwt_public_key: str | None = Field(None, description="verify JWTs by this PEM public key")
    jwt_public_key_file: Path | None = Field(
        None, description="verify JWTs by the PEM public key in this file"
    )
    # RS256 is what identity providers sign with unless told otherwise. Public-key algorithms
    # only: a shared secret (HS*) would let whoever verifies tokens also mint them.
    jwt_algorithms: str = Field(
        "RS256",
        description="comma-separated signing algorithms accepted (`RS256`, `RS384`, `RS512`, "
        "`PS256`, `PS384`, `PS512`, `ES256`, `ES384`, `ES512`, `EdDSA`, `Ed25519`, `Ed448`); "
        "`HS*` shared secrets are refused",
    )
    jwt_issuer: str | None = Field(
        None,
        description="expected `iss`; the server refuses to start in JWT mode without it",
        json_schema_extra=shown("(required with JWTs)"),
    )
    jwt_audience: str | None = Field(
        None,
        description="expected `aud`; the server refuses to start in JWT mode without it",
        json_schema_extra=shown("(required with JWTs)"),
    )
    jwt_user_claim: str = Field("sub", description="the claim that names the user")
    # The resource an MCP client signs in for (RFC 9728): behind a proxy, the name clients use,
    # which the server cannot see for itself; on loopback, the address it listens on.
    public_url: str | None = Field(
        None,
        description="JWT mode: the origin clients reach this server at (`https://recall.example."
        "com`), named as the resource in `/.well-known/oauth-protected-resource`; unset with a "
        "`HOST` that is not loopback, no sign-in discovery is served",
        json_schema_extra=shown("(`http://HOST:PORT` on loopback)"),
    )

    # The store: one directory per user (files), or one PostgreSQL shared by replicas.
    store: Literal["files", "postgres"] = Field(
        "files",
        description="`files` (DATA_DIR, one server process) or `postgres` (DATABASE_URL, any "
        "number of replicas)",
    )
    database_url: str | None = Field(
        None,
        description="with STORE=postgres: `postgresql://recall_app:...@host/db`, a role that does "
        "not own the tables (`recall-server migrate` runs as the owner)",
        json_schema_extra=shown("(required with STORE=postgres)"),
    )
    database_pool: int = Field(
        10, ge=1, description="with STORE=postgres: connections each replica keeps at most"
    )
    # Renewed every third of it while a run goes on: a replica that dies mid-run holds its users
    # this long at most before another replica finishes their runs.
    index_lease: float = Field(
        30.0,
        gt=0,
        description="with STORE=postgres: seconds a replica's claim on a user's index run lasts "
        "unrenewed (a replica that dies mid-run is taken over after it)",
    )

    # Engines.
    engine: Literal["auto", "funes", "embedded"] = Field(
        "auto", description="`auto` (funes if found, else embedded), `funes`, `embedded`"
    )
    funes_bin: str | None = Field(
        None, description="the funes binary", json_schema_extra=shown("(`funes` on `PATH`)")
    )
    hf_home: Path | None = Field(None, description="funes' model directory (baked into the image)")
    embed_model: Literal["minilm", "multilingual-e5-small"] = Field(
        "minilm",
        description="the embedded engine's model: `minilm` (the packaged all-MiniLM-L6-v2, "
        "English) or `multilingual-e5-small` (100 languages, the `multilingual` extra: "
        'docs/settings.md, "Other languages"); switching rebuilds every index',
    )
    embed_model_dir: Path | None = Field(
        None,
        description="a local ONNX model + `tokenizer.json` for the embedded engine",
        json_schema_extra=shown("(packaged MiniLM)"),
    )
    embed_pooling: Literal["mean", "cls"] = Field(
        "mean", description="`mean` or `cls` pooling for that model"
    )
    embed_compute: Literal["float32", "int8"] = Field(
        "float32",
        description="`int8`: the model's matrix products in int8, from a graph derived once and "
        "cached under `XDG_CACHE_HOME` (a query's embedding 2.5 times faster, recall a few "
        "questions apart: benchmark/README.md); switching rebuilds every index",
    )

    # Recall bounds: the brief's values (k 3 and a pool below 4 x k keep funes' reranker off).
    recall_k: int = Field(
        3,
        ge=1,
        le=50,
        description="passages returned, best first; the first three are three places in the "
        "history (a turn next to one shows as its neighbour), past them a passage may be a turn "
        "shown beside an earlier one",
    )
    recall_candidates: int = Field(
        8,
        ge=1,
        le=200,
        description="funes' candidate pool (below 4 x k keeps its reranker off); the embedded "
        "engine fuses pools of fixed depth; a value beyond theirs only appends closer-by-meaning "
        "passages after them",
    )
    recall_timeout: float = Field(10.0, gt=0, description="seconds per recall")
    recall_concurrency: int = Field(
        4, ge=1, description="recalls at once (the embedded engine computes one per core at a time)"
    )
    recall_half_life_days: float = Field(
        0.0, ge=0, description="recency weighting for the embedded engine (0: off)"
    )
    # The cross-encoder reranker (recall/reranker.py): better first passages for more CPU.
    recall_rerank: bool = Field(
        False,
        description="embedded engine: re-order the fused passages with a cross-encoder (the "
        "`rerank` extra; English text; about half a second of one core a recall)",
    )
    # The embedded engine's "nothing relevant" floor: a query no passage comes this close to (and
    # that shares little with any) finds nothing. The cosine scale is the model's own.
    recall_min_similarity: float | None = Field(
        None,
        ge=0,
        le=1,
        description="embedded engine: below this best cosine (and little word overlap) recall "
        "finds nothing; 0: off",
        json_schema_extra=shown("(the model's: `0.3` MiniLM, `0.81` multilingual-e5-small)"),
    )
    max_result_chars: int = Field(
        4000, ge=200, description="cap on what enters the agent's context"
    )
    # The cache of users' vector matrices (1.5 KB a passage), the embedded engine's or, with
    # STORE=postgres, each replica's: 256 MB holds about 170k passages, several heavy users,
    # on a small instance. 0: no cache.
    vector_cache_mb: int = Field(
        256,
        ge=0,
        description="memory for cached vector matrices, the embedded engine's or each "
        "PostgreSQL replica's (least recently used users are dropped; 0: no cache)",
    )

    # Indexing: a burst of posts gives one run; runs never block a request.
    index_debounce: float = Field(
        1.0, ge=0, description="seconds to wait after a write before indexing"
    )
    index_timeout: float = Field(
        300.0,
        gt=0,
        description="seconds per index run, for both engines (funes is killed; the embedded "
        "engine stops between batches, keeping what it committed)",
    )
    # Index runs at once across users: each loads a model and keeps cores busy; 2 leaves the
    # request path room on a small machine.
    index_concurrency: int = Field(
        2,
        ge=1,
        description="index runs at once across all users (first due, first run; with "
        "STORE=postgres, per replica); on the embedded engine, the most worker processes it starts",
    )
    # A minute: a burst of posts reuses a worker (starting one loads the model, a second or two),
    # while a quiet server soon gives the model's memory back.
    index_worker_idle: float = Field(
        60.0,
        gt=0,
        description="seconds an idle index worker keeps its model loaded before it exits (either "
        "store)",
    )

    # Retention: 0 keeps everything, the safe default (forgetting cannot be undone); an hour
    # between sweeps: retention is counted in days, and a sweep reads every source's last turn.
    retention_days: float = Field(
        0.0,
        ge=0,
        description="forget conversations whose last turn is older than this many days, with "
        "receipts and tombstones (0: keep everything)",
    )
    retention_sweep_seconds: float = Field(
        3600.0, gt=0, description="seconds between retention sweeps (the first runs at start)"
    )

    # Transport bounds: no client holds a connection, a descriptor or a slot for long.
    # 200 open connections: far more than RECALL_CONCURRENCY lets work at once, far below the
    # common limit of 1024 open files.
    max_connections: int = Field(
        200,
        ge=1,
        description="open connections at once; one more gets 503 at once. The server raises its "
        "open-files limit to this + 228, or will not start if it cannot",
    )
    # 5 s, uvicorn's own default: an idle connection, or a request head that does not finish,
    # is closed after it.
    keepalive_timeout: float = Field(
        5.0,
        gt=0,
        description="seconds a connection may stay idle, or take to send a request head, before "
        "it is closed",
    )
    # 30 s: a whole 8 MiB /turns body even at 2 Mbit/s; a stalled upload gets 408.
    body_timeout: float = Field(
        30.0,
        gt=0,
        description="seconds a `/turns` body may take to arrive; a slower one gets 408",
    )
    # DNS-rebinding protection: Host names (and browser origins) served, comma-separated. The
    # loopback names are always allowed; empty means loopback only, which refuses to start when
    # HOST is not loopback (the names clients use are unknowable here).
    allowed_hosts: str = Field(
        "",
        description="comma-separated `Host` names served (`*.example.com` works; ports are not "
        "compared); required when `HOST` is not loopback; other names get 421",
        json_schema_extra=shown("(loopback names)"),
    )
    allowed_origins: str = Field(
        "",
        description="comma-separated browser origins allowed besides the server's own "
        "(`https://chat.example.com`); others get 403",
    )

    def host_allowlist(self) -> list[str]:
        """Host header names to serve; empty when HOST is not loopback and none are set."""
        configured = [name.strip() for name in self.allowed_hosts.split(",") if name.strip()]
        loopback = self.host == "localhost" or _is_loopback_address(self.host)
        return configured or (["127.0.0.1", "localhost", "[::1]"] if loopback else [])

    def origin_allowlist(self) -> list[str]:
        """Browser origins to serve besides the server's own and loopback ones."""
        return [name.strip() for name in self.allowed_origins.split(",") if name.strip()]

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        if value.upper() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return value

    @field_validator(
        "jwt_jwks_uri",
        "jwt_public_key",
        "jwt_issuer",
        "jwt_audience",
        "funes_bin",
        "database_url",
        "public_url",
    )
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value or None

    @field_validator(
        "auth_tokens_file",
        "jwt_public_key_file",
        "hf_home",
        "embed_model_dir",
        "redact_patterns_file",
        mode="before",
    )
    @classmethod
    def _blank_path_is_unset(cls, value: object) -> object:
        return value or None

    def min_similarity(self) -> float:
        """RECALL_MIN_SIMILARITY, or the floor calibrated for EMBED_MODEL."""
        if self.recall_min_similarity is not None:
            return self.recall_min_similarity
        return MODEL_MIN_SIMILARITY[self.embed_model]

    def jwt_algorithm_list(self) -> list[str]:
        """JWT_ALGORITHMS as a list, blanks dropped."""
        return [name.strip() for name in self.jwt_algorithms.split(",") if name.strip()]

    def limits(self) -> Limits:
        """What one posted conversation may hold and what is redacted from it (the route and the
        backfill apply the same); ConfigError when REDACT_PATTERNS_FILE cannot be used."""
        try:
            redactor = Redactor.with_file(self.redact_patterns_file)
        except BadPatterns as exc:
            raise ConfigError(str(exc)) from exc
        return Limits(
            max_turns=self.max_turns, max_text_chars=self.max_text_chars, redactor=redactor
        )

    def secrets(self) -> list[str]:
        """What the log must never show (recall/logs.py takes them out of every record): the
        keys, and DATABASE_URL's password as written and decoded."""
        found = [self.ingest_key, self.metrics_token]
        if self.database_url:
            found += _url_passwords(self.database_url)
        return [secret for secret in found if secret]

    def problems(self) -> list[str]:
        """Reasons this configuration must not serve; empty when it may."""
        found = []
        if not self.ingest_key:
            found.append(f"INGEST_KEY is not set: {GENERATE_KEY}")
        elif len(self.ingest_key) < 16:
            found.append(f"INGEST_KEY must be at least 16 characters: {GENERATE_KEY}")
        elif is_placeholder_key(self.ingest_key):
            found.append(f"INGEST_KEY looks like a placeholder, not a secret: {GENERATE_KEY}")
        jwt_keys = {
            "JWT_JWKS_URI": self.jwt_jwks_uri,
            "JWT_PUBLIC_KEY": self.jwt_public_key,
            "JWT_PUBLIC_KEY_FILE": self.jwt_public_key_file,
        }
        jwt_keys_set = [name for name, value in jwt_keys.items() if value]
        if not (self.auth_tokens_file or jwt_keys_set):
            found.append(
                "set AUTH_TOKENS_FILE or JWT_JWKS_URI/JWT_PUBLIC_KEY/JWT_PUBLIC_KEY_FILE to "
                "verify tokens"
            )
        if self.auth_tokens_file and jwt_keys_set:
            found.append("set either AUTH_TOKENS_FILE or JWT_*, not both")
        if len(jwt_keys_set) > 1:
            found.append(f"set only one of {', '.join(jwt_keys_set)}")
        if jwt_keys_set:
            unknown = [a for a in self.jwt_algorithm_list() if a not in PUBLIC_KEY_ALGORITHMS]
            if unknown or not self.jwt_algorithm_list():
                found.append(
                    f"JWT_ALGORITHMS: {', '.join(unknown) or 'empty'} not accepted; use one or "
                    f"more of {', '.join(PUBLIC_KEY_ALGORITHMS)} (public-key algorithms: an "
                    "HS* shared secret would let whoever verifies tokens mint them)"
                )
            expected = {"JWT_ISSUER": self.jwt_issuer, "JWT_AUDIENCE": self.jwt_audience}
            missing = [name for name, value in expected.items() if not value]
            if missing:
                found.append(
                    f"JWT mode requires {' and '.join(missing)}: without them a token the key "
                    "signed for another service or issuer would be accepted"
                )
            found += self._public_url_problems()
        if self.store == "postgres" and not self.database_url:
            found.append("STORE=postgres requires DATABASE_URL")
        if self.store != "postgres" and self.database_url:
            # Each replica would keep its own files, and forget what the others were told.
            found.append(
                "DATABASE_URL is set but STORE is files: set STORE=postgres to serve from the "
                "database, or unset DATABASE_URL"
            )
        if self.store == "postgres" and self.database_url and not _readable_url(self.database_url):
            # Never quoted: libpq's own message holds the password (the pool would log it).
            found.append(URL_UNREADABLE)
        if self.store == "postgres" and self.engine == "funes":
            found.append("ENGINE=funes reads files: it works with STORE=files only")
        return found

    def refusal(self) -> str | None:
        """Why this configuration must not serve, in one line; None when it may."""
        if problems := self.problems():
            return "; ".join(problems)
        if not self.host_allowlist():
            return (
                f"HOST {self.host} is not loopback: set ALLOWED_HOSTS to the host names "
                "clients reach this server by (comma-separated)"
            )
        return None

    def _public_url_problems(self) -> list[str]:
        if self.public_url is None:
            return []  # off loopback without it: no sign-in discovery (auth.py says so at start)
        parts = urlsplit(self.public_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return ["PUBLIC_URL: must be an http or https URL, e.g. https://recall.example.com"]
        if parts.path.strip("/") or parts.query or parts.fragment:
            return ["PUBLIC_URL: an origin only (scheme://host[:port]), no path or query"]
        return []

    def resource_origin(self) -> str | None:
        """The origin MCP clients reach the server at: PUBLIC_URL, or on loopback the address it
        listens on; None when HOST is not loopback and PUBLIC_URL is unset."""
        if self.public_url is not None:
            return self.public_url.rstrip("/")
        if self.host == "localhost" or _is_loopback_address(self.host):
            host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
            return f"http://{host}:{self.port}"
        return None


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
        message = first["msg"].removeprefix("Value error, ")  # our validators' own words
        raise ConfigError(f"bad setting {str(first['loc'][0]).upper()}: {message}") from exc


URL_UNREADABLE = (
    "DATABASE_URL is not a PostgreSQL connection URL: percent-encode the password's reserved "
    "characters (@ : / ? # and % itself, as %25)"
)


def _url_passwords(url: str) -> list[str]:
    """A connection string's password, as written and percent-decoded, whether or not libpq can
    parse it (a URL's userinfo; a key/value string's password=)."""
    found = []
    with suppress(ValueError):
        if (password := urlsplit(url).password) is not None:
            found += [password, unquote(password)]
    if (match := re.search(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", url)) is not None:
        found += [match[1], match[1].strip("'")]
    return found


def _readable_url(url: str) -> bool:
    """Whether libpq can parse the connection string (psycopg only with STORE=postgres)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(url)
    except Exception:  # libpq's ProgrammingError, or anything else: unusable either way
        return False
    return True


def _is_loopback_address(host: str) -> bool:
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def settings_reference() -> list[tuple[str, str, str]]:
    """(variable, default as shown, meaning in Markdown) for every setting, in the model's order:
    the one source of --help's settings list and docs/settings.md's table."""
    rows = []
    for name, field in Settings.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        default = field.default
        if "shown_default" in extra:
            text = str(extra["shown_default"])
        elif default is None or default == "":
            text = ""
        else:
            text = f"`{default:g}`" if isinstance(default, float) else f"`{default}`"
        rows.append((name.upper(), text, field.description or ""))
    return rows


def settings_markdown_table() -> str:
    """docs/settings.md's settings table, exactly."""
    lines = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, default, meaning in settings_reference():
        lines.append(f"| `{name}` | {default} | {meaning} |".replace("|  |", "| |"))
    return "\n".join(lines)


def settings_help(width: int = 100) -> str:
    """The settings for --help: each variable with its default, then its meaning, indented."""
    lines = []
    for name, default, meaning in settings_reference():
        default = default.replace("`", "")
        lines.append(f"  {name} {default}" if default.startswith("(") else f"  {name}={default}")
        lines += textwrap.wrap(
            meaning.replace("`", ""), width, initial_indent=" " * 6, subsequent_indent=" " * 6
        )
    return "\n".join(lines)
