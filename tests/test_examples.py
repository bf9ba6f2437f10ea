"""The example scripts as their users run them, against real servers: the agent examples/ask.sh
starts may run every tool the server lists; examples/search.py says why a token was refused, in
the server's words; examples/record_runs.py runs after the README's non-editable install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, FakeFunes, Server, install_fake_funes, make_server
from fastmcp import Client
from fastmcp.server.auth.providers.jwt import RSAKeyPair
from test_auth import claims, jwt_settings, signed

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
