"""What an operator sees: GET /readyz, GET /metrics (Prometheus text) and LOG_FORMAT=json, each
through a real server over real HTTP."""

from __future__ import annotations

import asyncio
import gc
import json
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FakeFunes, Server, conversation, install_fake_funes, make_server, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_auth import mcp_status

import recall_server
from recall.domain.answers import NO_MEMORY, UNAVAILABLE
from recall.domain.conversation import user_dir_name

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(server: Server, path: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"{server.url}{path}")
    if token is not None:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(server: Server, token: str | None = None) -> Samples:
    """GET /metrics, parsed: (sample name, labels) -> value."""
    status, body = get(server, "/metrics", token)
    assert status == 200, body
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((f"recall_server_{name}", frozenset(labels.items())))


def added(after: Samples, before: Samples, name: str, **labels: str) -> float:
    """How much a counter grew between two scrapes (on a server the module's tests share)."""
    return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)


def funes_server(tmp_path: Path, funes: FakeFunes, **env: str) -> Server:
    return make_server(tmp_path, ENGINE="funes", FUNES_BIN=str(funes.path), **env).start()


# A server start costs seconds of CPU: the tests that need none of their own share one of these
# for the module. Each shared funes server has a stand-in of its own (its control file is the
# server's); a test that changes the stand-in's control sets it back.
@pytest.fixture(scope="module")
def json_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The embedded engine logging JSON (only the log test reads the log; alice is its user)."""
    workdir = tmp_path_factory.mktemp("json-embedded")
    with make_server(workdir, ENGINE="embedded", LOG_FORMAT="json").start() as server:
        yield server


@pytest.fixture(scope="module")
def shared_funes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, FakeFunes]]:
    """A funes server with the default settings, and its stand-in."""
    workdir = tmp_path_factory.mktemp("funes-default")
    funes = install_fake_funes(workdir / "funes-bin")
    with funes_server(workdir, funes) as server:
        yield server, funes


@pytest.fixture(scope="module")
def impatient_funes(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Server, FakeFunes]]:
    """A funes server logging JSON whose recalls time out after half a second (its tests count
    what their own calls added), and its stand-in; alice is seeded."""
    workdir = tmp_path_factory.mktemp("funes-impatient")
    funes = install_fake_funes(workdir / "funes-bin")
    with funes_server(workdir, funes, LOG_FORMAT="json", RECALL_TIMEOUT="0.5") as server:
        seed_alice(server)
        yield server, funes


def seed_alice(server: Server, marker: str = "MT-4471", cid: str = "c1") -> None:
    body = conversation("alice", cid, f"the {marker} ticket about the K-2 pump", "noted")
    assert server.post(body)[0] == 202
    server.wait_indexed("alice")


# --- GET /readyz --------------------------------------------------------------------------


def test_a_healthy_server_is_ready(json_server: Server) -> None:
    # given a server on the embedded engine, its data directory in place
    # when a probe asks whether it is ready
    status, body = get(json_server, "/readyz")
    # then it is, and says which engine answers
    assert status == 200
    assert json.loads(body) == {"status": "ready", "store": "files", "engine": "embedded"}


def test_a_data_dir_that_takes_no_file_makes_it_not_ready(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    with funes_server(tmp_path, fake_funes) as server:
        assert get(server, "/readyz")[0] == 200
        # given DATA_DIR replaced by a plain file after start (chmod stops no write as root)
        server.data_dir.rename(tmp_path / "data-moved")
        server.data_dir.write_text("not a directory")
        # when a probe asks
        status, body = get(server, "/readyz")
        # then it is not ready, and the failing check is named; liveness is untouched
        assert status == 503
        assert json.loads(body) == {"status": "not ready", "failed": "data_dir"}
        assert get(server, "/healthz")[0] == 200


@pytest.mark.parametrize("damage", ["removed", "not executable"])
def test_a_funes_binary_that_cannot_run_makes_it_not_ready(
    tmp_path: Path, fake_funes: FakeFunes, damage: str
) -> None:
    with funes_server(tmp_path, fake_funes) as server:
        assert get(server, "/readyz")[0] == 200
        # given the funes binary gone, or stripped of its execute bits, after start
        if damage == "removed":
            fake_funes.path.unlink()
        else:
            fake_funes.path.chmod(0o644)
        # when a probe asks
        status, body = get(server, "/readyz")
    # then it is not ready, naming the binary
    assert status == 503
    assert json.loads(body) == {"status": "not ready", "failed": "funes_binary"}


# --- GET /metrics -------------------------------------------------------------------------


async def test_metrics_count_ingest_by_status_and_recall_by_outcome(
    shared_funes: tuple[Server, FakeFunes],
) -> None:
    server, _ = shared_funes
    before = scrape(server)
    # given a stored conversation (202; a new one: a run follows), a post with a wrong key (401),
    # and two recalls: one that finds passages and one by a user with no memory (bob: no test
    # on this server posts for him)
    seed_alice(server, cid="counted")
    assert server.post(conversation("alice", "c2", "x"), key="wrong" * 4)[0] == 401
    assert "MT-4471" in await server.recall("alice", "MT-4471")
    assert await server.recall("bob", "MT-4471") == NO_MEMORY
    # when the metrics are scraped
    samples = scrape(server)
    # then each request and call is counted under its status or outcome, and timed
    assert added(samples, before, "ingest_requests_total", status="202") == 1
    assert added(samples, before, "ingest_requests_total", status="401") == 1
    assert added(samples, before, "ingest_duration_seconds_count", status="202") == 1
    assert added(samples, before, "recalls_total", outcome="passages") == 1
    assert added(samples, before, "recalls_total", outcome="no_memory") == 1
    assert value(samples, "recalls_total", outcome="timeout") == 0  # none on this server
    assert added(samples, before, "recall_duration_seconds_count", outcome="passages") == 1
    assert added(samples, before, "index_runs_total") == 1
    assert value(samples, "index_failures_total") == 0  # none on this server
    assert added(samples, before, "index_duration_seconds_count") == 1
    assert value(samples, "index_waiting_users") == 0  # the run has started: nobody waits
    assert value(samples, "index_oldest_wait_seconds") == 0
    assert value(samples, "recall_slots") == 4
    assert value(samples, "recall_slots_in_use") == 0
    assert value(samples, "vector_cache_bytes") is None  # funes caches no vectors


async def test_a_timed_out_recall_is_told_apart_from_an_unavailable_one(
    impatient_funes: tuple[Server, FakeFunes],
) -> None:
    server, fake_funes = impatient_funes
    before = scrape(server)
    # given one recall that fails (funes errors) and one that outlasts RECALL_TIMEOUT
    try:
        fake_funes.control(mode="fail")
        assert await server.recall("alice", "MT-4471") == UNAVAILABLE
        fake_funes.control(mode="sleep", sleep=30)
        assert await server.recall("alice", "MT-4471") == UNAVAILABLE
    finally:
        fake_funes.control()
    # when the metrics are scraped
    samples = scrape(server)

    # then the agent read the same answer twice, but the outcomes differ
    assert added(samples, before, "recalls_total", outcome="unavailable") == 1
    assert added(samples, before, "recalls_total", outcome="timeout") == 1


async def test_a_recall_holding_its_slot_shows_in_the_slots_gauge(
    shared_funes: tuple[Server, FakeFunes],
) -> None:
    server, fake_funes = shared_funes
    seed_alice(server)
    # given a recall under way (funes takes its time)
    fake_funes.control(mode="sleep", sleep=3)
    try:
        recall = asyncio.create_task(server.recall("alice", "MT-4471"))

        def in_use() -> float | None:
            return value(scrape(server), "recall_slots_in_use")

        # when the metrics are scraped meanwhile, then one slot is in use; after it, none
        for _ in range(200):
            if await asyncio.to_thread(in_use) == 1:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the recall never showed as a slot in use")
        await recall
        assert await asyncio.to_thread(in_use) == 0
    finally:
        fake_funes.control()


def test_a_failed_index_run_is_counted(impatient_funes: tuple[Server, FakeFunes]) -> None:
    # given a funes whose index runs fail (on the impatient server, for a user of this test's
    # own: a failed run is retried at that user's next write only)
    server, fake_funes = impatient_funes
    before = scrape(server)
    fake_funes.control(index_fail=True)
    try:
        assert server.post(conversation("dora", "c1", "MT-4471 ticket"))[0] == 202
        # when the run has ended, then it is counted as a run and as a failure
        wait_for(lambda: added(scrape(server), before, "index_runs_total") == 1, timeout=20)
        assert added(scrape(server), before, "index_failures_total") == 1
    finally:
        fake_funes.control()


def test_writes_waiting_for_an_index_run_show_in_the_backlog_gauges(
    tmp_path: Path, fake_funes: FakeFunes
) -> None:
    # given a long debounce: a post waits that long for its index run
    with funes_server(tmp_path, fake_funes, INDEX_DEBOUNCE="60") as server:
        before = scrape(server)
        assert server.post(conversation("alice", "c1", "MT-4471 ticket"))[0] == 202
        assert server.post(conversation("bob", "c1", "MT-4471 ticket"))[0] == 202
        # when the metrics are scraped a moment later
        wait_for(lambda: value(scrape(server), "index_oldest_wait_seconds") > 0.2)  # type: ignore[operator]
        after = scrape(server)
    # then both users wait, and the oldest wait is counted in seconds
    assert value(before, "index_waiting_users") == 0
    assert value(before, "index_oldest_wait_seconds") == 0
    assert value(after, "index_waiting_users") == 2
    assert 0.2 < value(after, "index_oldest_wait_seconds") < 60  # type: ignore[operator]


async def test_the_embedded_engine_reports_its_vector_cache(tmp_path: Path) -> None:
    with make_server(tmp_path, ENGINE="embedded").start() as server:
        # given an empty cache, then a recall that loads alice's vectors into it
        assert value(scrape(server), "vector_cache_bytes") == 0
        seed_alice(server)
        assert "MT-4471" in await server.recall("alice", "MT-4471")
        # when scraped, then the cache holds her matrix
        assert value(scrape(server), "vector_cache_bytes") > 0  # type: ignore[operator]


async def test_metrics_hold_no_user_id_hash_token_or_text(
    shared_funes: tuple[Server, FakeFunes],
) -> None:
    server, _ = shared_funes
    user, text, cid = (f"{kind}{secrets.token_hex(6)}" for kind in ("user", "word", "conv"))
    # given posts and recalls carrying random markers, including a refused post
    assert server.post(conversation(user, cid, f"the {text} ticket", "ok"))[0] == 202
    assert server.post(conversation(user, cid, text), key="wrong" * 4)[0] == 401
    seed_alice(server, marker=text, cid=cid)  # a conversation of its own: the server is shared
    server.wait_indexed(user)
    assert text in await server.recall("alice", text)
    # when the page is read
    status, body = get(server, "/metrics")
    # then none of them, nor a user's directory hash or a credential, is on it
    page = body.decode()
    assert status == 200 and "recall_server_recalls_total" in page
    secrets_seen = [user, text, cid, user_dir_name(user), user_dir_name("alice"), "alice"]
    secrets_seen += [server.ingest_key, *server.tokens.values()]
    assert [marker for marker in secrets_seen if marker in page] == []


def test_a_metrics_token_guards_the_page(tmp_path: Path, fake_funes: FakeFunes) -> None:
    token = secrets.token_urlsafe(24)
    # given a server with METRICS_TOKEN set
    with funes_server(tmp_path, fake_funes, METRICS_TOKEN=token) as server:
        # when the page is asked for without it, with a wrong one, a user's, and with it
        missing = get(server, "/metrics")
        # (another last character: a token that ends in "x" would be its own "wrong" one)
        wrong = get(server, "/metrics", token=token[:-1] + ("y" if token.endswith("x") else "x"))
        user_token = get(server, "/metrics", token=server.tokens["alice"])
        right = get(server, "/metrics", token=token)
    # then only the right token reads it
    assert missing[0] == wrong[0] == user_token[0] == 401
    assert json.loads(missing[1]) == {
        "error": "authorization: missing or wrong METRICS_TOKEN bearer"
    }
    assert right[0] == 200 and b"recall_server_ingest_requests_total" in right[1]


def test_without_a_metrics_token_the_page_is_open(shared_funes: tuple[Server, FakeFunes]) -> None:
    server, _ = shared_funes
    assert get(server, "/metrics")[0] == 200


# --- LOG_FORMAT=json ----------------------------------------------------------------------


async def test_json_logs_are_one_object_a_line_with_the_user_as_its_hash(
    json_server: Server,
) -> None:
    server = json_server
    text, cid = f"word{secrets.token_hex(6)}", f"conv{secrets.token_hex(6)}"
    # given a server logging JSON, a post and a recall carrying random markers
    assert server.post(conversation("alice", cid, f"the {text} ticket", "ok"))[0] == 202
    server.wait_indexed("alice")
    assert text in await server.recall("alice", text)
    # and the MCP SDK's and uvicorn's lines besides ours (a refused token, the access log)
    assert await asyncio.to_thread(mcp_status, server, "not-a-token") == 401
    # when its output is read
    lines = [json.loads(line) for line in server.log().splitlines()]  # every line parses
    # then each line has time, level, logger and event
    assert all({"time", "level", "logger", "event"} <= line.keys() for line in lines)
    loggers = {line["logger"] for line in lines}
    assert {"mcp.server.streamable_http_manager", "uvicorn.access", "uvicorn.error"} <= loggers
    # (the refused token is answered, and its reason logged, by recall.auth.TokenFirst)
    assert any(line["event"].startswith("bearer token refused: ") for line in lines)
    # and the index and recall lines carry the user as her directory hash and seconds as numbers
    about_alice = [line for line in lines if line["event"].startswith(("indexed", "recall for"))]
    assert {line["event"].split()[0] for line in about_alice} == {"indexed", "recall"}
    for line in about_alice:
        assert line["user"] == user_dir_name("alice")
        assert isinstance(line["seconds"], float) and line["seconds"] >= 0
    # and no user id, text, conversation id or credential is anywhere in it
    log = server.log()
    leaked = [text, cid, '"alice"', server.ingest_key, *server.tokens.values()]
    assert [marker for marker in leaked if marker in log] == []


def test_a_timed_out_recall_logs_its_user_hash_in_json(
    impatient_funes: tuple[Server, FakeFunes],
) -> None:
    # given a JSON-logging server whose funes outlasts RECALL_TIMEOUT
    server, fake_funes = impatient_funes
    logged = server.log().rfind("\n") + 1  # where the next whole line starts
    fake_funes.control(mode="sleep", sleep=30)
    # when a recall times out
    try:
        assert asyncio.run(server.recall("alice", "MT-4471")) == UNAVAILABLE
    finally:
        fake_funes.control()
    # then its warning names the user by her hash (this test's lines: the server is shared)
    lines = [json.loads(line) for line in server.log()[logged:].splitlines()]
    failed = [line for line in lines if line["event"].startswith("recall failed")]
    assert [(line["level"], line["user"]) for line in failed] == [
        ("WARNING", user_dir_name("alice"))
    ]


def test_the_server_leaves_its_startup_objects_out_of_the_garbage_collectors_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given the settings an operator gives, and a server that is built but not served
    for name, value in make_server(tmp_path, ENGINE="embedded").env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["recall_server.py"])
    monkeypatch.setattr(recall_server, "configure_logging", lambda *_: None)  # this process's
    frozen_when_served: list[int] = []
    monkeypatch.setattr(
        recall_server, "serve", lambda *_: frozen_when_served.append(gc.get_freeze_count())
    )
    gc.unfreeze()
    # when it starts
    try:
        recall_server.main()
    finally:
        gc.unfreeze()
    # then by the time it serves, what it built at startup (modules, model, routes) is frozen:
    # full collections no longer walk it, and no longer stop requests for tens of milliseconds
    assert len(frozen_when_served) == 1
    assert frozen_when_served[0] > 50_000
