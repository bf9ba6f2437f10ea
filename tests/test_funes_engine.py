"""The funes engine through the real server and MCP client, with the stand-in as the binary."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import (
    FakeFunes,
    Server,
    conversation,
    install_fake_funes,
    make_server,
    turn,
    wait_for,
)

from recall.domain.answers import NO_MEMORY, NOTHING_FOUND, UNAVAILABLE
from recall.domain.conversation import (
    SOURCE_SUFFIX,
    conversation_ref,
    parse_conversation,
    user_dir_name,
)
from recall.files.engines.funes import FunesEngine, parse_hits, render_hits
from recall.files.layout import write_conversation


# One server and its stand-in for the tests that take `funes_server` (a server start costs
# seconds of CPU): each sees the stand-in's calls from its own start on, and leaves it as it
# found it (normal mode, installed). The tests that need other settings start a server of their
# own, on a stand-in of their own: the shared server's index runs cannot show up in its calls.
@pytest.fixture(scope="module")
def module_funes(tmp_path_factory: pytest.TempPathFactory) -> FakeFunes:
    return install_fake_funes(tmp_path_factory.mktemp("funes-engine") / "funes-bin")


@pytest.fixture
def fake_funes(
    request: pytest.FixtureRequest, module_funes: FakeFunes, tmp_path: Path
) -> Iterator[FakeFunes]:
    if "funes_server" not in request.fixturenames:
        yield install_fake_funes(tmp_path / "funes-bin")
        return
    yield module_funes.from_now()
    module_funes.control()
    if not module_funes.path.exists():
        module_funes.install()


@pytest.fixture(scope="module")
def module_server(
    tmp_path_factory: pytest.TempPathFactory, module_funes: FakeFunes
) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("funes-engine-server")
    # HF_HOME and a variable funes must not see: for the cleared-environment test
    settings = {"HF_HOME": str(workdir / "models"), "SECRET_THING": "must-not-leak"}
    with make_server(
        workdir, ENGINE="funes", FUNES_BIN=str(module_funes.path), **settings
    ).start() as server:
        yield server


@pytest.fixture
def funes_server(module_server: Server, fake_funes: FakeFunes) -> Server:
    return module_server


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
    # and the run the post made due is over: while one is due, nothing found says "not yet"
    wait_for(lambda: server.health()["indexing"] == 0)


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


async def test_funes_runs_with_a_cleared_environment(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    # given the server's settings hold HF_HOME and SECRET_THING (module_server)
    assert funes_server.env["SECRET_THING"] == "must-not-leak"
    seed_alice(funes_server)
    await funes_server.recall("alice", "MT-4471")
    calls = fake_funes.calls()
    assert calls  # the recall's, at least
    for call in calls:
        env = dict(call["env"])
        env.pop("LC_CTYPE", None)  # set by the stand-in's own Python interpreter at startup
        assert env == {
            "FUNES_HOME": str(funes_server.home("alice")),
            "HF_HOME": funes_server.env["HF_HOME"],
            "HF_HUB_OFFLINE": "1",
            "PATH": funes_server.env["PATH"],
        }


async def test_hint_lines_are_removed_and_passages_kept(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    seed_alice(funes_server)
    answer = await funes_server.recall("alice", "MT-4471 K-2")
    assert "MT-4471" in answer and "  ~ [" in answer  # passages and neighbours survive
    assert "→ get" not in answer and "--memory" not in answer
    assert str(funes_server.data_dir) not in answer


async def test_funes_headers_end_with_the_ref_and_turn_the_read_tool_reads_whole(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    # given alice's handover, indexed by funes
    seed_alice(funes_server)
    # when her agent searches it
    answer = await funes_server.recall("alice", "Priya integrations follow-up")
    # then funes' header comes through as funes prints it, with the turn's place added at its end
    ref = conversation_ref(user_dir_name("alice"), "handover")
    header = answer.splitlines()[0]  # the best hit's: the turn that names all three words
    assert header.endswith(f"score=0.500 · ref {ref} turn 4"), answer
    # and that place reads the turn whole
    read = await funes_server.read("alice", ref=ref, from_turn=4, to_turn=4)
    assert "Priya owns the follow-up with the integrations team.\n---\n" in read


def test_funes_hits_are_read_by_their_header_and_hint_lines_whatever_a_turn_holds() -> None:
    # Given funes output whose first turn holds a Markdown rule ("---") and a line shaped like
    # a header, and a second hit cut short by the output cap (no closing ---)
    out = (
        "[2026-10-08T09:00:00Z] gateway /work/conv-one text  score=0.500\n"
        "  → get conv-one t1 --memory /srv/data/abc/memory\n"
        "Part one\n---\n[2031-05-05T05:05:05Z] a b c  score=9\nbody → get mentioned\n"
        "  ~ [user text seq0] the question\n"
        "---\n"
        "[2026-10-09T09:00:00Z] gateway /work/conv-two text  score=0.400\n"
        "  → get conv-two t7 --memory /srv/data/abc/memory\n"
        "Second hit\n"
    )
    # When it is read
    hits = parse_hits(out)
    recalled = render_hits(
        hits, "0123456789abcdef01234567", {("conv-one", "t1"): 0, ("conv-two", "t7"): 6}
    )
    # Then there are two hits, each whole, named by the full session and turn of its hint line
    assert [(h.session, h.turn, h.ts) for h in hits] == [
        ("conv-one", "t1", "2026-10-08T09:00:00Z"),
        ("conv-two", "t7", "2026-10-09T09:00:00Z"),
    ]
    first = recalled.text[recalled.passages[0].start : recalled.passages[0].end]
    # each header as funes printed it, with where the read tool finds the turn at its end
    assert first.startswith(
        "[2026-10-08T09:00:00Z] gateway /work/conv-one text  score=0.500 · ref "
        f"{conversation_ref('0123456789abcdef01234567', 'conv-one')} turn 1\nPart one\n"
    )
    assert "Part one\n---\n[2031-05-05T05:05:05Z]" in first and "the question" in first
    # and no hint line (a path, a session id) reaches the agent, while the turn's words do
    assert "→ get conv" not in recalled.text and "/srv/data" not in recalled.text
    assert "body → get mentioned" in recalled.text
    assert recalled.text.endswith("Second hit\n---\n")
    assert parse_hits("no results\n") == []


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
    assert "funes recall exited 1: model missing" in funes_server.log()


async def test_funes_stderr_reaches_the_log_only_as_a_fixed_reason(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    # Given a funes whose error message echoes the query, a path and a terminal escape
    seed_alice(funes_server)
    fake_funes.control(
        mode="fail", error="error: cannot search for {query} in {home}/memory \x1b[31mfailed"
    )
    # When a recall fails with it
    assert await funes_server.recall("alice", "zanzibar-secret MT-4471") == UNAVAILABLE
    # Then the log names the exit status and a fixed reason, and none of that text
    log = funes_server.log()
    assert "funes recall exited 1: unrecognised error" in log
    for leaked in ("zanzibar", str(funes_server.home("alice")), "\x1b", "cannot search"):
        assert leaked not in log


def peak_rss(pid: int) -> int:
    """The process's high-water mark of resident memory, in bytes (VmHWM)."""
    status = Path(f"/proc/{pid}/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))
    return int(kib) * 1024


async def test_a_runaway_funes_output_is_read_without_being_kept(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    # Given a funes that prints 100 MB for one recall
    seed_alice(funes_server)
    assert funes_server.process is not None
    before = peak_rss(funes_server.process.pid)
    fake_funes.control(mode="huge", huge_bytes=100_000_000)
    # When the agent recalls
    answer = await funes_server.recall("alice", "MT-4471")
    # Then the answer holds none of it (no hit came within the kept head), and the server
    # never held the output
    assert answer == NOTHING_FOUND
    assert peak_rss(funes_server.process.pid) - before < 40_000_000


async def test_missing_binary_gives_the_fail_soft_text(
    funes_server: Server, fake_funes: FakeFunes
) -> None:
    seed_alice(funes_server)
    fake_funes.path.unlink()
    assert await funes_server.recall("alice", "MT-4471") == UNAVAILABLE
    assert "funes could not start" in funes_server.log()


# The two timeout tests share one server that times recalls out after a second and runs one at
# a time, on a stand-in of its own (each sees its calls from its own start, and sets its control
# back): a server start costs seconds of CPU.
@pytest.fixture(scope="module")
def impatient_funes(tmp_path_factory: pytest.TempPathFactory) -> FakeFunes:
    return install_fake_funes(tmp_path_factory.mktemp("funes-impatient") / "funes-bin")


@pytest.fixture(scope="module")
def impatient_server(
    tmp_path_factory: pytest.TempPathFactory, impatient_funes: FakeFunes
) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("funes-impatient-server")
    settings = {"RECALL_TIMEOUT": "1", "RECALL_CONCURRENCY": "1"}
    with make_server(
        workdir, ENGINE="funes", FUNES_BIN=str(impatient_funes.path), **settings
    ).start() as server:
        seed_alice(server)
        yield server


@pytest.fixture
def impatient(
    impatient_server: Server, impatient_funes: FakeFunes
) -> Iterator[tuple[Server, FakeFunes]]:
    yield impatient_server, impatient_funes.from_now()
    impatient_funes.control()


async def test_timeout_fails_soft_in_time_and_leaves_no_process(
    impatient: tuple[Server, FakeFunes],
) -> None:
    server, fake_funes = impatient
    logged = len(server.log())
    fake_funes.control(mode="sleep", sleep=120, spawn_child=True)
    started = time.monotonic()
    assert await server.recall("alice", "MT-4471") == UNAVAILABLE
    # long before funes would have answered: the timeout ended it (a margin for load)
    assert time.monotonic() - started < 30
    recall_pid = fake_funes.calls("recall")[-1]["pid"]
    child_pid = next(e["pid"] for e in fake_funes.events() if e["event"] == "child")
    wait_for(lambda: not alive(recall_pid) and not alive(child_pid), timeout=30)
    assert "timed out" in server.log()[logged:]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_timed_out_recall_keeps_its_slot_until_its_process_is_gone(
    impatient: tuple[Server, FakeFunes],
) -> None:
    # Given a funes that takes far longer than the timeout, on a server of one recall at a time
    server, fake_funes = impatient
    assert server.env["RECALL_CONCURRENCY"] == "1"
    fake_funes.control(mode="sleep", sleep=30)
    # When recalls time out, one after another and then several at once
    for _ in range(3):
        assert await server.recall("alice", "MT-4471") == UNAVAILABLE
    answers = await asyncio.gather(*(server.recall("alice", "MT-4471") for _ in range(4)))
    assert answers == [UNAVAILABLE] * 4
    # Then every recall process is gone, and no two were ever alive at once
    pids = {e["pid"] for e in fake_funes.calls("recall")}
    assert len(pids) >= 3
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=30)
    assert most_at_once(fake_funes, "recall") == 1


def most_at_once(funes: FakeFunes, command: str) -> int:
    """The largest number of `command` processes alive at one time, from their start and end
    events (the stand-in records its end when killed too)."""
    pids = {e["pid"] for e in funes.calls(command)}
    events = [e for e in funes.events() if e["event"] in ("start", "end") and e["pid"] in pids]
    ends = {e["pid"] for e in events if e["event"] == "end"}
    assert ends == pids, "a process never recorded its end"
    running, most = 0, 0
    # at equal times an end sorts first: a process that ends as another starts is not overlap
    for event in sorted(events, key=lambda e: (e["t"], e["event"] == "start")):
        running += 1 if event["event"] == "start" else -1
        most = max(most, running)
    return most


async def test_at_most_four_recalls_run_at_once(tmp_path: Path, fake_funes: FakeFunes) -> None:
    # A timeout far beyond the test: the recalls waiting for a slot must not give up
    with make_server(
        tmp_path, ENGINE="funes", FUNES_BIN=str(fake_funes.path), RECALL_TIMEOUT="120"
    ).start() as server:
        # Given recalls held inside funes until the test lets them go
        seed_alice(server)
        gate = tmp_path / "recall-gate"
        fake_funes.control(recall_gate=str(gate))
        # When ten recalls come at once
        recalls = asyncio.gather(*(server.recall("alice", "MT-4471") for _ in range(10)))
        try:
            # Then four start, and no fifth while they are held
            for _ in range(1200):  # a minute
                if len(fake_funes.calls("recall")) >= 4:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # time for a fifth to start, were the bound not kept
            assert len(fake_funes.calls("recall")) == 4
        finally:
            gate.touch()
        # and all are answered, never more than four at a time
        answers = await asyncio.wait_for(recalls, timeout=120)
    assert all("MT-4471" in a for a in answers)
    assert most_at_once(fake_funes, "recall") == 4


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


# --- turns whose own text holds a "---" line (item 13 of the third review) -------------------

RULED = "Step one is done.\n---\nzephyrquartz is the second half of this turn."


def write_source(home: Path, cid: str, *turns: dict[str, object]) -> None:
    body = {"user": "alice", "conversation_id": cid, "turns": list(turns)}
    assert write_conversation(home, parse_conversation(body))


async def rebuild_started(fake_funes: FakeFunes) -> None:
    while len(fake_funes.calls("index")) < 2:  # the first index run, then the forget's rebuild
        await asyncio.sleep(0.05)


async def test_a_turn_holding_a_markdown_rule_is_hidden_whole_while_its_forget_rebuilds(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # Given a funes memory in which the conversation to forget has a turn with a "---" line
    home = tmp_path / "home"
    write_source(home, "ruled", turn("user", RULED))
    write_source(home, "kept", turn("user", "zephyrquartz is only a word here, nothing else."))
    engine = FunesEngine(str(fake_funes.path))
    await engine.index(home)
    assert "second half" in (await engine.recall(home, "zephyrquartz second half")).text
    # When its source is gone and the forget's rebuild is held before it swaps the memory in
    (home / "src" / f"ruled{SOURCE_SUFFIX}").unlink()
    gate = tmp_path / "gate"
    fake_funes.control(index_gate=str(gate))
    forgetting = asyncio.create_task(engine.forget(home, "ruled"))
    await asyncio.wait_for(rebuild_started(fake_funes), 30)
    during = await engine.recall(home, "zephyrquartz second half")
    gate.touch()
    await forgetting
    # Then no part of the forgotten turn was served meanwhile, while the other conversation was
    assert "second half" not in during.text and "Step one" not in during.text
    assert "nothing else" in during.text
    assert {p.conversation_id for p in during.passages} == {"kept"}


async def test_a_recalled_turn_holding_a_markdown_rule_is_never_served(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # Given a turn answered from recall whose text holds a "---" line, after a question
    home = tmp_path / "home"
    write_source(
        home,
        "asked",
        turn("user", "What did we note about zephyrquartz?", "2026-10-08T09:00:00Z"),
        turn("assistant", RULED, "2026-10-08T09:01:00Z", recalled=True),
    )
    engine = FunesEngine(str(fake_funes.path))
    await engine.index(home)
    # When the agent searches words that only the recalled turn holds
    found = await engine.recall(home, "second half step done")
    # Then neither half of it is served as a passage
    assert "second half" not in found.text and "Step one" not in found.text
    assert found.passages == ()
