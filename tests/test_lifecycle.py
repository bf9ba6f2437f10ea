"""The data lifecycle over real HTTP, on both engines of the files store and on the PostgreSQL
store: forget, tombstones, erase, receipts, retention. The forgotten text never comes back: not in
recall, not in the index's bytes (its rows)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import (
    ROOT,
    FakeFunes,
    Server,
    conversation,
    install_fake_funes,
    make_server,
    turn,
    wait_for,
)
from pg import PgDatabase, PgServer

from recall.domain.answers import NO_MEMORY
from recall.domain.conversation import parse_conversation, user_dir_name
from recall.domain.forgetting import forgotten_message, turn_digest
from recall.files import lifecycle
from recall.files.audit_file import AUDIT_FILE as AUDIT
from recall.files.engines.base import ForgetWindows
from recall.files.engines.factory import make_engine
from recall.files.layout import read_source, write_conversation
from recall.files.lifecycle import Lifecycle, UserGates, list_receipts
from recall.files.scheduler import IndexScheduler
from recall.pg.schema import USER_TABLES
from recall.settings import Settings

SECRET = "zephyrquartz"  # a word only the conversation to forget holds
KEPT = "marigoldvector"  # a word only the conversation that stays holds
USERS = [f"user-{n}" for n in range(40)]  # each test takes a fresh one: the server is shared
ENGINES = ["embedded", "funes"]
# The files store with each engine, and the PostgreSQL store (the embedded ranking over it).
STORES = [*ENGINES, "postgres"]


@pytest.fixture(scope="module", params=STORES)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp(f"lifecycle-{request.param}")
    settings = {"ENGINE": request.param, "INDEX_DEBOUNCE": "0.1"}
    funes = install_fake_funes(tmp / "funes-bin") if request.param == "funes" else None
    if funes is not None:
        settings["FUNES_BIN"] = str(funes.path)
    database = None
    if request.param == "postgres":
        pg: PgServer = request.getfixturevalue("pg_server")
        database = pg.new_database()
        settings.update(ENGINE="embedded", STORE="postgres", DATABASE_URL=database.app_url)
    with make_server(tmp, users=USERS, **settings).start() as server:
        server.fake_funes = funes  # type: ignore[attr-defined]
        server.database = database  # type: ignore[attr-defined]
        yield server


_next_user = iter(USERS * len(STORES))


@pytest.fixture
def files_layout(server: Server) -> None:
    """For a test of the files store's own layout on disk (tombstones.json, the receipts file)."""
    if server.store != "files":
        pytest.skip("the files store's on-disk layout")


def rows_of(server: Server, user: str, tables: tuple[str, ...]) -> str:
    """Every row of these tables that belongs to the user, as one text (PostgreSQL store)."""
    database: PgDatabase = server.database  # type: ignore[attr-defined]
    with psycopg.connect(database.superuser_url) as conn:
        return repr(
            [
                conn.execute(
                    f"SELECT * FROM {table} WHERE user_hash = %s", (user_dir_name(user),)
                ).fetchall()
                for table in tables
            ]
        )


@pytest.fixture
def user(server: Server) -> str:
    """A user of its own for each test (the module's server is shared)."""
    return next(_next_user)


def forget(server: Server, user: str, cid: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    return server.post({"user": user, "conversation_id": cid}, route="/forget", **kw)


def receipts(server: Server, user: str) -> list[dict[str, Any]]:
    status, body = server.post({"user": user}, route="/receipts")
    assert status == 200
    return body["receipts"]


def is_stored(server: Server, user: str, cid: str) -> bool:
    return server.stored_turns(user, cid) is not None


def stored(server: Server, user: str, cid: str) -> list[tuple[int, str]]:
    """(seq, text) of each stored turn of a conversation."""
    return [(t["seq"], t["text"]) for t in server.stored_turns(user, cid) or []]


def holds_nothing_of(server: Server, user: str) -> bool:
    """Whether the store holds nothing at all for the user."""
    if server.store == "postgres":
        return rows_of(server, user, (*USER_TABLES,)) == repr([[] for _ in USER_TABLES])
    return not server.home(user).exists()


def later(minutes: int = 1) -> str:
    """A turn stamp after anything the server did so far (the forget time)."""
    return (datetime.now(UTC) + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def seed(server: Server, user: str) -> None:
    """Two conversations: `secret` (to forget) and `kept`, indexed."""
    forgotten = conversation(user, "secret", f"The vault code word is {SECRET}.", "Noted.")
    kept = conversation(user, "kept", f"The garden plan is {KEPT}.", "Noted the plan.", day=9)
    for body in (forgotten, kept):
        assert server.post(body)[0] == 202
    server.wait_indexed(user)


async def recall(server: Server, user: str, query: str) -> str:
    return await server.recall(user, query)


def index_bytes(server: Server, user: str) -> bytes:
    """Every byte of the user's index files, lowercased (the FTS index stores terms lowercased).
    Not the recall audit: it keeps the queries asked (a query may quote what was later
    forgotten); erase removes it and retention prunes it."""
    if server.store == "postgres":
        return rows_of(server, user, ("chunks", "postings", "terms", "indexed")).lower().encode()
    home = server.home(user)
    files = [p for p in home.rglob("*") if p.is_file() and "src" not in p.parts and p.name != AUDIT]
    return b"".join(p.read_bytes() for p in files).lower()


# --- forget -----------------------------------------------------------------------------------


async def test_forget_removes_the_conversation_and_answers_a_receipt(
    server: Server, user: str
) -> None:
    seed(server, user)
    assert SECRET in await recall(server, user, SECRET)

    status, receipt = forget(server, user, "secret")

    assert status == 200
    assert receipt["operation"] == "forget" and receipt["conversation_id"] == "secret"
    assert receipt["removed"]["conversations"] == 1 and receipt["removed"]["turns"] == 2
    assert receipt["receipt"] and receipt["at"].endswith("Z") and receipt["reason"] == "request"
    assert SECRET not in json.dumps(receipt)
    assert not is_stored(server, user, "secret")
    assert SECRET not in await recall(server, user, SECRET)
    assert KEPT in await recall(server, user, KEPT)


async def test_forgotten_text_is_gone_from_the_index_files(server: Server, user: str) -> None:
    seed(server, user)
    assert SECRET.encode() in index_bytes(server, user)

    assert forget(server, user, "secret")[0] == 200

    assert SECRET.encode() not in index_bytes(server, user)
    assert KEPT.encode() in index_bytes(server, user)
    if server.store == "files":
        wal = server.home(user) / "embedded" / "recall.db-wal"
        assert not wal.exists() or wal.stat().st_size == 0  # checkpointed and truncated


def test_forget_of_an_unknown_conversation_is_404_and_writes_nothing(
    server: Server, user: str
) -> None:
    status, body = forget(server, user, "never-posted")
    assert status == 404 and body["error"].startswith("conversation_id:")
    assert holds_nothing_of(server, user)
    assert receipts(server, user) == []


def test_repeating_a_forget_answers_the_same_receipt(server: Server, user: str) -> None:
    seed(server, user)
    first = forget(server, user, "secret")
    again = forget(server, user, "secret")
    assert first[0] == again[0] == 200 and again[1] == first[1]
    assert len(receipts(server, user)) == 1


def test_forget_without_the_ingest_key_is_refused(server: Server, user: str) -> None:
    seed(server, user)
    status, body = forget(server, user, "secret", key="wrong-key-wrong-key")
    assert status == 401 and body["error"].startswith("x-ingest-key")
    assert is_stored(server, user, "secret")


def test_forget_with_a_bad_conversation_id_names_the_field(server: Server, user: str) -> None:
    status, body = forget(server, user, "../etc")
    assert status == 400 and body["error"].startswith("conversation_id:")
    status, body = server.post({"conversation_id": "x"}, route="/forget")
    assert status == 400 and body["error"].startswith("user:")


# --- tombstones -------------------------------------------------------------------------------


async def test_a_repost_of_a_forgotten_conversation_is_refused_with_410(
    server: Server, user: str
) -> None:
    seed(server, user)
    assert forget(server, user, "secret")[0] == 200

    again = conversation(user, "secret", f"The vault code word is {SECRET}.", "Noted.")
    status, body = server.post(again)

    assert status == 410 and body["error"].startswith("conversation_id:")
    assert not is_stored(server, user, "secret")


async def test_a_410_names_the_operation_that_forgot_the_posted_turns(
    server: Server, user: str
) -> None:
    # Given a forgotten conversation
    seed(server, user)
    assert forget(server, user, "secret")[0] == 200
    secret = conversation(user, "secret", f"The vault code word is {SECRET}.", "Noted.")
    kept = conversation(user, "kept", f"The garden plan is {KEPT}.", "Noted the plan.", day=9)
    # When it is posted again, then the 410 says a forget did it
    status, body = server.post(secret)
    assert status == 410
    assert body["error"] == (
        "conversation_id: every turn of this post was forgotten by a forget of this "
        "conversation, and is never stored again (new turns are); nothing was written"
    )
    # And once the user is erased, a post of either conversation is told it was the erase
    assert server.post({"user": user}, route="/erase")[0] == 200
    for again in (kept, secret):
        status, body = server.post(again)
        assert status == 410
        assert body["error"].startswith(
            "conversation_id: every turn of this post was erased by an erase of this user,"
        )


async def test_a_repost_stores_only_turns_stamped_after_the_forget(
    server: Server, user: str
) -> None:
    seed(server, user)
    assert forget(server, user, "secret")[0] == 200
    reposted = conversation(user, "secret", f"The vault code word is {SECRET}.", "Noted.")
    reposted["turns"].append(turn("user", "And the lunch order is pelicanbrioche.", later()))

    status, _ = server.post(reposted)

    assert status == 202
    assert stored(server, user, "secret") == [(0, "And the lunch order is pelicanbrioche.")]
    server.wait_indexed(user)
    assert "pelicanbrioche" in await recall(server, user, "pelicanbrioche lunch")
    assert SECRET not in await recall(server, user, SECRET)
    assert SECRET.encode() not in index_bytes(server, user)


async def test_a_forgotten_turn_stamped_ahead_of_the_server_never_comes_back(
    server: Server, user: str
) -> None:
    # Given a conversation the gateway stamped two minutes ahead of our clock (skew, or local
    # time sent with a Z), forgotten
    ahead = {
        "user": user,
        "conversation_id": "ahead",
        "turns": [
            turn("user", f"The vault code word is {SECRET}.", later(2)),
            turn("assistant", "Noted.", later(2)),
        ],
    }
    assert server.post(ahead)[0] == 202
    assert forget(server, user, "ahead")[0] == 200

    # When the gateway re-posts the whole conversation after its next turn
    ahead["turns"].append(turn("user", "And the lunch order is pelicanbrioche.", later(3)))
    status, _ = server.post(ahead)

    # Then only the new turn is stored, and the forgotten one is found nowhere
    assert status == 202
    assert stored(server, user, "ahead") == [(0, "And the lunch order is pelicanbrioche.")]
    server.wait_indexed(user)
    assert SECRET not in await recall(server, user, SECRET)
    assert SECRET.encode() not in index_bytes(server, user)


async def test_an_erased_turn_stamped_hours_ahead_never_comes_back(
    server: Server, user: str
) -> None:
    # Given a user erased while one of their turns was stamped two hours ahead
    body = {
        "user": user,
        "conversation_id": "ahead",
        "turns": [turn("user", f"The vault code word is {SECRET}.", later(120))],
    }
    assert server.post(body)[0] == 202
    assert server.post({"user": user}, route="/erase")[0] == 200

    # When that conversation is posted again, alone and then with a new turn
    alone = server.post(body)[0]
    body["turns"].append(turn("assistant", "Starting afresh: quillfern.", later(121)))
    status, _ = server.post(body)

    # Then the erased turn is refused, then left out; the new one is stored
    assert alone == 410
    assert status == 202
    assert stored(server, user, "ahead") == [(0, "Starting afresh: quillfern.")]
    server.wait_indexed(user)
    assert SECRET not in await recall(server, user, SECRET)


def test_a_turn_stamped_within_the_second_after_a_forget_is_stored(
    server: Server, user: str
) -> None:
    # Given a forgotten conversation, and the forget's time from its receipt
    seed(server, user)
    status, receipt = forget(server, user, "secret")
    assert status == 200
    at = datetime.fromisoformat(receipt["at"].replace("Z", "+00:00"))
    within = at.strftime("%Y-%m-%dT%H:%M:%S") + ".999999Z"  # after it, in the same second

    # When the re-post holds new turns, one stamped a fraction of a second after the forget
    reposted = conversation(user, "secret", f"The vault code word is {SECRET}.", "Noted.")
    reposted["turns"] += [
        turn("user", "Order the quillfern seeds.", within),
        turn("assistant", "Ordered.", later()),
    ]
    status, _ = server.post(reposted)

    # Then the 202 stored both new turns: none was dropped silently
    assert status == 202
    assert stored(server, user, "secret") == [(0, "Order the quillfern seeds."), (1, "Ordered.")]


def test_only_a_turn_of_the_same_role_second_and_text_stays_forgotten(
    server: Server, user: str
) -> None:
    # Given a forgotten conversation whose first turn was the user's, at 09:00:00
    seed(server, user)
    assert forget(server, user, "secret")[0] == 200
    said = f"The vault code word is {SECRET}."

    # When a post holds that turn (in another notation of the same second, marked recalled) and
    # turns that differ from it in one thing each
    reposted = {
        "user": user,
        "conversation_id": "secret",
        "turns": [
            turn("user", said, "2026-10-08T11:00:00.400+02:00", recalled=True),
            turn("assistant", said, "2026-10-08T09:00:00Z"),
            turn("user", said, "2026-10-08T09:00:01Z"),
            turn("user", "The vault code word is new.", "2026-10-08T09:00:00Z"),
        ],
    }
    status, _ = server.post(reposted)

    # Then only the forgotten turn is left out
    assert status == 202
    turns = server.stored_turns(user, "secret") or []
    assert [(t["seq"], t["role"], t["ts"], t["text"]) for t in turns] == [
        (0, "assistant", "2026-10-08T09:00:00Z", said),
        (1, "user", "2026-10-08T09:00:01Z", said),
        (2, "user", "2026-10-08T09:00:00Z", "The vault code word is new."),
    ]


def test_a_tombstone_holds_keyed_digests_of_the_forgotten_turns_and_no_text(
    server: Server, user: str, files_layout: None
) -> None:
    # Given a forgotten conversation
    body = conversation(user, "secret", f"The vault code word is {SECRET}.", "Noted.")
    assert server.post(body)[0] == 202
    assert forget(server, user, "secret")[0] == 200

    # When its tombstone is read
    raw = (server.home(user) / "tombstones.json").read_text()
    digests = json.loads(raw)["turns"]["secret"]

    # Then it holds one keyed digest per stored turn, and none of their text
    key = bytes.fromhex((server.data_dir / "_keys" / "tombstone.key").read_text())
    turns = parse_conversation(body).lines
    assert digests == sorted(turn_digest(key, t) for t in turns)
    assert all(re.fullmatch("[0-9a-f]{32}", d) for d in digests)
    assert SECRET not in raw and "Noted" not in raw and user not in raw
    # and without the key a guessed text cannot be checked against it
    assert turn_digest(bytes(32), turns[0]) not in digests


def test_a_tombstone_written_before_digests_keeps_its_time_rule(
    server: Server, user: str, files_layout: None
) -> None:
    # Given a user whose tombstones are in the format of earlier versions: times only
    assert server.post(conversation(user, "other", "Hello there.", "Hi."))[0] == 202
    path = server.home(user) / "tombstones.json"
    legacy = {"erased": None, "conversations": {"old": "2026-11-01T00:00:00.000000Z"}}
    path.write_text(json.dumps(legacy))

    # When that conversation is posted, with a turn from before the forget and one after
    before = turn("user", f"Before: {SECRET}.", "2026-10-31T23:59:59Z")
    after = turn("user", "After: quillfern.", "2026-11-01T00:00:01Z")
    only_before = server.post({"user": user, "conversation_id": "old", "turns": [before]})[0]
    status, _ = server.post({"user": user, "conversation_id": "old", "turns": [before, after]})

    # Then the old rule holds: only what is stamped after the forget time is stored
    assert only_before == 410
    assert status == 202 and stored(server, user, "old") == [(0, "After: quillfern.")]
    # and a forget since keeps the old tombstone beside the new one
    assert forget(server, user, "other")[0] == 200
    tombstones = json.loads(path.read_text())
    assert tombstones["conversations"] == legacy["conversations"]
    assert len(tombstones["turns"]["other"]) == 2
    # and an erasure time of that format still holds for every conversation
    path.write_text(json.dumps({"erased": "2026-11-01T00:00:00.000000Z", "conversations": {}}))
    anything = {"user": user, "conversation_id": "any", "turns": [before]}
    assert server.post(anything)[0] == 410


def test_processes_racing_to_make_the_tombstone_key_agree_on_one(tmp_path: Path) -> None:
    # Given no key yet; when several processes (the server, the backfill) need it at once
    make = (
        "import sys, pathlib, recall.files.lifecycle as lifecycle; "
        "print(lifecycle.tombstone_key(pathlib.Path(sys.argv[1])).hex())"
    )
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", make, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE
        )
        for _ in range(6)
    ]
    keys = {racer.communicate(timeout=120)[0] for racer in racers}

    # Then they all use the one key that is on disk, and nothing else is left there
    keys_dir = tmp_path / "_keys"
    assert keys == {(keys_dir / "tombstone.key").read_bytes() + b"\n"}
    assert len(bytes.fromhex(keys.pop().decode())) == 32
    assert [p.name for p in keys_dir.iterdir()] == ["tombstone.key"]


# --- erase and receipts -----------------------------------------------------------------------


async def test_erase_leaves_only_the_erasure_tombstone_and_answers_a_receipt(
    server: Server, user: str
) -> None:
    seed(server, user)

    status, receipt = server.post({"user": user}, route="/erase")

    assert status == 200 and receipt["operation"] == "erase"
    assert receipt["removed"]["conversations"] == 2 and receipt["removed"]["turns"] == 4
    if server.store == "postgres":  # every row of theirs gone but the tombstones, the receipt
        kept = ("tombstones", "receipts")
        gone = tuple(t for t in USER_TABLES if t not in (*kept, "users"))
        assert rows_of(server, user, gone) == repr([[] for _ in gone])
        digests = rows_of(server, user, ("tombstones",))
        assert digests.count("'secret'") == 2 and digests.count("'kept'") == 2
        assert await recall(server, user, SECRET) == NO_MEMORY
        return
    home = server.home(user)
    assert sorted(p.name for p in home.iterdir()) == ["tombstones.json"]
    tombstones = json.loads((home / "tombstones.json").read_text())
    assert set(tombstones) == {"turns", "erased", "conversations"}
    assert {cid: len(digests) for cid, digests in tombstones["turns"].items()} == {
        "secret": 2,
        "kept": 2,
    }
    assert await recall(server, user, SECRET) == NO_MEMORY


async def test_after_an_erase_only_turns_stamped_later_are_stored(
    server: Server, user: str
) -> None:
    seed(server, user)
    assert server.post({"user": user}, route="/erase")[0] == 200

    old = conversation(user, "kept", f"The garden plan is {KEPT}.", "Noted the plan.", day=9)
    assert server.post(old)[0] == 410
    old["turns"].append(turn("user", "New start: quillfern project.", later()))
    assert server.post(old)[0] == 202

    server.wait_indexed(user)
    assert "quillfern" in await recall(server, user, "quillfern project")
    assert KEPT not in await recall(server, user, KEPT)


def test_receipts_list_every_forget_and_erase_without_text(server: Server, user: str) -> None:
    seed(server, user)
    forgot = forget(server, user, "secret")[1]
    erased = server.post({"user": user}, route="/erase")[1]

    listed = receipts(server, user)

    assert [r["receipt"] for r in listed] == [forgot["receipt"], erased["receipt"]]
    assert all(r["user"] == user_dir_name(user) for r in listed)
    assert SECRET not in json.dumps(listed) and KEPT not in json.dumps(listed)
    assert user not in json.dumps(listed)  # the hash, never the id
    if server.store == "files":
        assert (server.data_dir / "_receipts" / f"{server.home(user).name}.jsonl").exists()


def test_a_torn_last_receipt_line_is_skipped_and_never_appended_onto(
    server: Server, user: str, files_layout: None
) -> None:
    # Given a receipt, then a line cut short by a crash in the middle of an append
    seed(server, user)
    status, first = forget(server, user, "secret")
    assert status == 200
    path = server.data_dir / "_receipts" / f"{server.home(user).name}.jsonl"
    with path.open("a") as handle:
        handle.write('{"receipt": "cut-short", "operat')

    # When the receipts are listed, the forget repeated and another receipt written
    listed = receipts(server, user)
    again = forget(server, user, "secret")
    erased = server.post({"user": user}, route="/erase")

    # Then the earlier receipt answers, and the next one is readable on a line of its own
    assert listed == [first]
    assert again == (200, first)
    assert erased[0] == 200
    assert receipts(server, user) == [first, erased[1]]
    assert [json.loads(line) for line in path.read_text().splitlines()] == [first, erased[1]]


# --- retention --------------------------------------------------------------------------------


RETENTION = {"RETENTION_DAYS": "30", "RETENTION_SWEEP_SECONDS": "0.3"}
# bob's audit as the embedded retention server finds it at start: a line from long ago, one today
OLD_AUDIT = {"at": "2020-01-01T00:00:00Z", "client": "c", "query": SECRET, "outcome": "passages"}


@pytest.fixture(scope="module")
def embedded_retention(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server with a retention on the embedded engine, for the retention tests of alice's
    conversations and of bob's audit (a server start costs seconds of CPU)."""
    server = make_server(tmp_path_factory.mktemp("retention"), ENGINE="embedded", **RETENTION)
    home = server.home("bob")
    home.mkdir(parents=True)
    recent = {"at": later(0), "client": "c", "query": KEPT, "outcome": "nothing_found"}
    (home / "audit.jsonl").write_text(json.dumps(OLD_AUDIT) + "\n" + json.dumps(recent) + "\n")
    with server.start():
        yield server


@pytest.mark.parametrize("store", STORES)
async def test_retention_forgets_conversations_whose_last_turn_is_older(
    tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    settings = {"ENGINE": store, **RETENTION}
    if store == "funes":
        settings["FUNES_BIN"] = str(install_fake_funes(tmp_path / "funes-bin").path)
    if store == "postgres":
        database = request.getfixturevalue("pg_database")
        settings.update(ENGINE="embedded", STORE="postgres", DATABASE_URL=database.app_url)
    if store == "embedded":
        running = contextlib.nullcontext(request.getfixturevalue("embedded_retention"))
    else:
        running = make_server(tmp_path, **settings).start()
    with running as server:
        old = conversation("alice", "old", f"Long ago {SECRET}.", "Ok.")
        recent = {
            "user": "alice",
            "conversation_id": "recent",
            "turns": [turn("user", f"Today {KEPT}.", later(0))],
        }
        for body in (old, recent):
            assert server.post(body)[0] == 202

        wait_for(lambda: not is_stored(server, "alice", "old"), timeout=60)
        server.wait_indexed("alice")
        wait_for(lambda: server.health()["indexing"] == 0, timeout=60)

        assert is_stored(server, "alice", "recent")
        listed = receipts(server, "alice")
        assert [(r["conversation_id"], r["reason"]) for r in listed] == [("old", "retention")]
        assert SECRET not in await server.recall("alice", SECRET)
        assert KEPT in await server.recall("alice", KEPT)
        assert server.post(old)[0] == 410  # the same tombstone rule


async def test_retention_keeps_a_conversation_resumed_after_the_sweep_listed_it(
    tmp_path: Path, fake_funes: FakeFunes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a conversation whose last turn is long past the retention
    data_dir = tmp_path / "data"
    home = data_dir / user_dir_name("alice")
    old = conversation("alice", "old", f"Long ago {SECRET}.", "Ok.")
    write_conversation(home, parse_conversation(old))
    # and the gateway posting its next turn just after the sweep has listed it as expired
    old["turns"].append(turn("user", f"Back to it: {KEPT}.", later(0)))
    listed = lifecycle.expired_conversations

    def listed_then_resumed(home: Path, cutoff: datetime) -> list[str]:
        names = listed(home, cutoff)
        write_conversation(home, parse_conversation(old))
        return names

    monkeypatch.setattr(lifecycle, "expired_conversations", listed_then_resumed)
    (tmp_path / "tokens.json").write_text("{}")
    settings = Settings(
        ingest_key="k" * 32,
        auth_tokens_file=tmp_path / "tokens.json",
        engine="funes",
        funes_bin=str(fake_funes.path),
        data_dir=data_dir,
    )
    scheduler = IndexScheduler(lambda _: asyncio.sleep(0), debounce=60)

    # When the retention sweep runs
    with ThreadPoolExecutor(2) as writes:
        sweep = Lifecycle(data_dir, make_engine(settings), scheduler, writes, UserGates())
        forgot = await sweep.sweep(30)
        await scheduler.close()

    # Then the resumed conversation stays whole, with no retention receipt
    assert forgot == 0
    assert [t["blocks"][0]["text"] for t in read_source(home / "src" / "old.funes.jsonl")] == [
        f"Long ago {SECRET}.",
        "Ok.",
        f"Back to it: {KEPT}.",
    ]
    assert list_receipts(data_dir, home.name) == []
    assert not (home / "tombstones.json").exists()


# --- funes: hits of a conversation being forgotten are dropped until the swap ----------------


def test_a_funes_forget_goes_through_when_funes_rejects_another_file(
    server: Server, user: str
) -> None:
    if server.env["ENGINE"] != "funes":
        pytest.skip("funes rebuilds its memory; the embedded engine deletes rows")
    seed(server, user)
    # A file funes rejects (not written by us: copied in by hand) must not block every forget.
    (server.home(user) / "src" / "foreign.funes.jsonl").write_text('{"not": "a turn"}\n')

    status, receipt = forget(server, user, "secret")

    assert status == 200 and receipt["removed"]["turns"] == 2
    assert SECRET.encode() not in index_bytes(server, user)


def test_a_funes_forget_rebuilds_in_a_fresh_home_and_swaps_it_in(server: Server, user: str) -> None:
    if server.env["ENGINE"] != "funes":
        pytest.skip("funes rebuilds its memory; the embedded engine deletes rows")
    seed(server, user)
    home = server.home(user)
    before = len(server.fake_funes.calls("index"))  # type: ignore[attr-defined]

    assert forget(server, user, "secret")[0] == 200

    # This user's runs only: the module's server indexes other users' homes meanwhile.
    rebuilds = [
        c["env"]["FUNES_HOME"]
        for c in server.fake_funes.calls("index")[before:]  # type: ignore[attr-defined]
        if Path(c["env"]["FUNES_HOME"]).is_relative_to(home) and c["env"]["FUNES_HOME"] != str(home)
    ]
    assert len(rebuilds) == 1 and Path(rebuilds[0]).parent == home
    assert not Path(rebuilds[0]).exists()  # the old memory went with it after the swap
    assert (home / "memory" / "chunks.json").exists()


def test_a_recall_that_overlapped_a_forget_hides_it_and_a_later_one_does_not() -> None:
    windows = ForgetWindows()
    home = Path("/data/user")
    before = time.monotonic()
    window = windows.open(home, "secret")
    assert windows.hidden(home, before) == {"secret"}  # the forget is going on
    windows.close(window)
    assert windows.hidden(home, before) == {"secret"}  # began before the forget ended
    assert windows.hidden(Path("/data/other"), before) == set()
    assert windows.hidden(home, time.monotonic()) == set()  # began after: reads a clean index


def test_retention_also_drops_old_lines_of_the_recall_audit(embedded_retention: Server) -> None:
    # Given a user whose audit holds a line from long ago and one from today (bob's, written
    # before the server started)
    # When a server with a retention starts (it sweeps at once)
    server, home = embedded_retention, embedded_retention.home("bob")
    wait_for(lambda: SECRET not in (home / "audit.jsonl").read_text(), timeout=60)
    status, answer = server.post({"user": "bob"}, route="/audit")

    # Then the old line is gone and the recent one kept
    assert status == 200
    assert [e["query"] for e in answer["entries"]] == [KEPT]


def test_the_410_names_the_retention_sweep_when_it_forgot_the_conversation() -> None:
    receipts = [
        {"operation": "erase"},
        {"operation": "forget", "conversation_id": "other", "reason": "request"},
        {"operation": "forget", "conversation_id": "c1", "reason": "retention"},
    ]
    assert "forgotten by the retention sweep (RETENTION_DAYS)" in forgotten_message(receipts, "c1")
    assert "erased by an erase of this user" in forgotten_message(receipts, "c2")
