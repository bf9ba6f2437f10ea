"""The funes engine through the real server and MCP client, with the stand-in as the binary."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil
import pytest
from conftest import FakeFunes, Server, conversation, make_server, wait_for

from recall.engines.base import NO_MEMORY, NOTHING_FOUND, UNAVAILABLE
from recall.engines.funes import HINT_LINE


def seed_alice(server: Server) -> None:
    body = conversation(
        "alice",
        "handover",
        "Shift handover: maintenance ticket MT-4471 is open for the K-2 machine.",
        "Noted: MT-4471 on K-2 slows the North finishing line to 80%.",
        "Who owns the follow-up?",
        "Priya owns the follow-up with the integrations team.",
    )
    assert server.post(body)[0] == 202
    wait_for(lambda: (server.home("alice") / "memory").exists())


async def test_query_follows_a_double_dash_so_it_stays_text(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    seed_alice(funes_server)
    await funes_server.recall("alice", "-k 100 MT-4471")
    argv = fake_funes.calls("recall")[-1]["argv"]
    assert argv == ["recall", "-k", "3", "--candidates", "8", "--", "-k 100 MT-4471"]


async def test_query_is_cut_at_500_characters(funes_server: Server, fake_funes: FakeFunes) -> None:
    seed_alice(funes_server)
    await funes_server.recall("alice", "MT-4471 " + "x" * 2000)
    assert len(fake_funes.calls("recall")[-1]["argv"][-1]) == 500


async def test_funes_runs_with_a_cleared_environment(tmp_path: Path, fake_funes: FakeFunes) -> None:
    models = tmp_path / "models"
    with make_server(
        tmp_path,
        ENGINE="funes",
        FUNES_BIN=str(fake_funes.path),
        HF_HOME=str(models),
        SECRET_THING="must-not-leak",
    ).start() as server:
        seed_alice(server)
        await server.recall("alice", "MT-4471")
        for call in fake_funes.calls():
            env = dict(call["env"])
            env.pop("LC_CTYPE", None)  # set by the stand-in's own Python interpreter at startup
            assert env == {
                "FUNES_HOME": str(server.home("alice")),
                "HF_HOME": str(models),
                "HF_HUB_OFFLINE": "1",
                "PATH": server.env["PATH"],
            }


async def test_hint_lines_are_removed_and_passages_kept(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    seed_alice(funes_server)
    answer = await funes_server.recall("alice", "MT-4471 K-2")
    assert "MT-4471" in answer and "  ~ [" in answer  # passages and neighbours survive
    assert "→ get" not in answer and "--memory" not in answer
    assert str(funes_server.data_dir) not in answer


def test_hint_pattern_removes_every_hint_line_and_nothing_else() -> None:
    text = "[ts] gateway /w/ab text  score=1\n  → get s t --memory /x\nbody → get\n---\n"
    assert HINT_LINE.sub("", text) == "[ts] gateway /w/ab text  score=1\nbody → get\n---\n"


async def test_result_is_capped_at_max_result_chars(tmp_path: Path, fake_funes: FakeFunes) -> None:
    with make_server(
        tmp_path, ENGINE="funes", FUNES_BIN=str(fake_funes.path), MAX_RESULT_CHARS="1000"
    ).start() as server:
        seed_alice(server)
        fake_funes.control(mode="big")
        answer = await server.recall("alice", "MT-4471")
        assert 900 < len(answer) <= 1000


async def test_no_results_and_empty_output_say_nothing_found(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    seed_alice(funes_server)
    assert await funes_server.recall("alice", "zebra giraffe") == NOTHING_FOUND
    fake_funes.control(mode="empty")
    assert await funes_server.recall("alice", "MT-4471") == NOTHING_FOUND


async def test_user_without_memory_is_told_so(funes_server: Server, fake_funes: FakeFunes) -> None:
    assert await funes_server.recall("bob", "MT-4471") == NO_MEMORY
    assert fake_funes.calls("recall") == []


async def test_failing_funes_gives_the_fail_soft_text_and_logs_the_cause(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    seed_alice(funes_server)
    fake_funes.control(mode="fail")
    assert await funes_server.recall("alice", "MT-4471") == UNAVAILABLE
    assert "model bge-small-en-v1.5 not found" in funes_server.log()


async def test_missing_binary_gives_the_fail_soft_text(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    seed_alice(funes_server)
    fake_funes.path.unlink()
    assert await funes_server.recall("alice", "MT-4471") == UNAVAILABLE
    assert "funes could not start" in funes_server.log()


async def test_timeout_fails_soft_in_time_and_leaves_no_process(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    with make_server(
        tmp_path, ENGINE="funes", FUNES_BIN=str(fake_funes.path), RECALL_TIMEOUT="1"
    ).start() as server:
        seed_alice(server)
        fake_funes.control(mode="sleep", sleep=60, spawn_child=True)
        started = time.monotonic()
        assert await server.recall("alice", "MT-4471") == UNAVAILABLE
        assert time.monotonic() - started < 1 + 3  # the timeout plus a margin
        recall_pid = fake_funes.calls("recall")[-1]["pid"]
        child_pid = next(e["pid"] for e in fake_funes.events() if e["event"] == "child")
        wait_for(lambda: not alive(recall_pid) and not alive(child_pid), timeout=5)
        assert "timed out" in server.log()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_at_most_four_recalls_run_at_once(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    seed_alice(funes_server)
    fake_funes.control(mode="sleep", sleep=0.8)
    answers = await asyncio.gather(*(funes_server.recall("alice", "MT-4471") for _ in range(10)))
    assert all("MT-4471" in a for a in answers)
    events = [e for e in fake_funes.events() if e["event"] in ("start", "end")]
    recall_pids = {e["pid"] for e in fake_funes.calls("recall")}
    running, most = 0, 0
    for event in sorted((e for e in events if e["pid"] in recall_pids), key=lambda e: e["t"]):
        running += 1 if event["event"] == "start" else -1
        most = max(most, running)
    assert most == 4  # bounded, and the bound is actually used


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"INGEST_KEY": ""}, "INGEST_KEY"),
        ({"INGEST_KEY": "short-key"}, "INGEST_KEY"),
        ({"AUTH_TOKENS_FILE": ""}, "verify tokens"),
        ({"ENGINE": "funes", "FUNES_BIN": "/nonexistent/funes"}, "ENGINE=funes"),
        ({"RECALL_K": "zero"}, "RECALL_K"),
    ],
)
def test_server_refuses_to_start_without_a_safe_configuration(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    server = make_server(tmp_path, **env)
    with pytest.raises(RuntimeError, match="exited early"):
        server.start(timeout=30)
    assert message in server.log()
    assert server.process is not None and server.process.returncode != 0


async def test_no_query_token_or_user_in_the_logs(funes_server: Server) -> None:
    seed_alice(funes_server)
    await funes_server.recall("alice", "zanzibar-query MT-4471")
    await funes_server.recall("bob", "zanzibar-query")
    log = funes_server.log()
    assert "recall for user" in log  # recalls are logged, by hash
    for secret in ("zanzibar", "alice", "bob", "Priya", *funes_server.tokens.values()):
        assert secret not in log
