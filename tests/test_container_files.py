"""Static checks of the container and demo files (no Docker engine is needed to run them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_server

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


def test_project_is_installed_from_pyproject() -> None:
    runs = " ".join(stage("base").all("RUN"))
    assert "pip install --no-cache-dir ." in runs


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


def compose_service() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return document["services"]["recall-mcp"]


def compose_env() -> dict[str, str]:
    env = compose_service()["environment"]
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
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
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
