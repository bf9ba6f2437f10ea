"""The write path over real HTTP: the key, validation before disk, the funes file format."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    Backing,
    FakeFunes,
    Server,
    conversation,
    install_fake_funes,
    make_server,
    tree,
    turn,
)
from fake_funes import validate_file
from starlette.testclient import TestClient

import recall_server
from recall.app import keyed
from recall.domain.conversation import Conversation, parse_conversation
from recall.domain.errors import InvalidConversation
from recall.files.layout import conversation_lock, write_conversation
from recall.settings import Settings


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("ingest")
    funes = install_fake_funes(tmp / "funes-bin")
    server = make_server(
        tmp,
        ENGINE="funes",
        FUNES_BIN=str(funes.path),
        MAX_TURNS="50",
        MAX_TEXT_CHARS="5000",
        MAX_BODY_BYTES="65536",
        INDEX_DEBOUNCE="5",  # keep the stand-in out of the way of these tests
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stored_by(
    tmp_path_factory: pytest.TempPathFactory, module_backing: Backing
) -> Iterator[Server]:
    """A server on each store (the behaviour suite), for the rules both stores keep."""
    tmp = tmp_path_factory.mktemp("ingest-stores")
    settings = {"MAX_TURNS": "50", "MAX_TEXT_CHARS": "5000", "MAX_BODY_BYTES": "65536"}
    # No index run: a "nothing written" check compares all the store holds, before and after.
    server = make_server(tmp, ENGINE="embedded", INDEX_DEBOUNCE="3600", **settings)
    server.env.update(module_backing.settings)
    server.backing = module_backing  # type: ignore[attr-defined]
    yield server.start()
    server.stop()


def snapshot(server: Server) -> Any:
    # No index run ever starts on this server (its debounce is an hour): nothing to settle.
    return server.backing.snapshot(server, settle=False)  # type: ignore[attr-defined]


def texts_stored(server: Server, cid: str, user: str = "alice") -> list[str]:
    """The stored turns' texts of a conversation, as the user's memory page reads them."""
    return [t["text"] for t in server.stored_turns(user, cid) or []]


def on_files(server: Server) -> bool:
    return server.store == "files"


def good(cid: str = "conv-1", user: str = "alice") -> dict[str, Any]:
    return conversation(user, cid, "Ticket MT-4471 for the K-2 machine?", "MT-4471 is open.")


def source(server: Server, user: str, cid: str) -> Path:
    return server.home(user) / "src" / f"{cid}.funes.jsonl"


# --- the key ----------------------------------------------------------------------------------


def test_post_without_key_is_refused_and_writes_nothing(server: Server) -> None:
    before = tree(server.data_dir)
    status, body = server.post(good("nokey"), key=None)
    assert status == 401 and "x-ingest-key" in body["error"]
    assert tree(server.data_dir) == before


def test_post_with_wrong_key_is_refused_and_writes_nothing(server: Server) -> None:
    before = tree(server.data_dir)
    wrong = secrets.token_hex(16)
    status, body = server.post(good("wrongkey"), key=wrong)
    assert status == 401 and "x-ingest-key" in body["error"]
    # a key that shares the right prefix is still wrong (whole-value, constant-time compare)
    status, _ = server.post(good("wrongkey"), key=server.ingest_key[:-1] + "x")
    assert status == 401
    assert tree(server.data_dir) == before


def test_post_with_right_key_is_stored_and_acknowledged(server: Server) -> None:
    status, body = server.post(good("rightkey"))
    assert (status, body) == (202, {"stored": "rightkey"})
    assert source(server, "alice", "rightkey").exists()


def test_key_is_compared_in_constant_time(
    tmp_path: Path, fake_funes: FakeFunes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A == compare would leak how much of the key's start a guess got right, by its timing:
    # every decision must be hmac.compare_digest's, on the whole key.
    key = secrets.token_hex(16)
    settings = Settings(
        ingest_key=key,
        auth_tokens_file=tmp_path / "tokens.json",
        engine="funes",
        funes_bin=str(fake_funes.path),
        data_dir=tmp_path / "data",
        index_debounce=60,  # no index run: only the route is under test
    )
    (tmp_path / "tokens.json").write_text("{}")
    compared: list[tuple[bytes, bytes]] = []
    compare_digest = hmac.compare_digest

    def watched(provided: bytes, expected: bytes) -> bool:
        compared.append((provided, expected))
        return compare_digest(provided, expected)

    # Given the app in this process, its key comparison watched
    monkeypatch.setattr(keyed.hmac, "compare_digest", watched)
    wrong = [secrets.token_hex(16), key[:-1] + "x", key[:8], key + "x", ""]
    with TestClient(recall_server.create_app(settings)) as client:

        def status(sent: str) -> int:
            headers = {"x-ingest-key": sent}
            return client.post("/turns", json=good("timing"), headers=headers).status_code

        # When wrong keys (of the same length, sharing its start, cut, extended, empty) and then
        # the right one are sent
        answers = [status(guess) for guess in wrong]
        right = status(key)
    # Then each wrong key is refused and the right one accepted
    assert answers == [401] * len(wrong) and right == 202
    # and every one was decided by compare_digest against the whole configured key
    assert compared == [(sent.encode(), key.encode()) for sent in [*wrong, key]]

    # And when compare_digest says "equal", a wrong key is let in: it alone decides
    monkeypatch.setattr(keyed.hmac, "compare_digest", lambda *_: True)
    with TestClient(recall_server.create_app(settings)) as client:
        headers = {"x-ingest-key": wrong[0]}
        assert client.post("/turns", json=good("timing"), headers=headers).status_code == 202


# --- refusals: each a 4xx naming the field, nothing on disk -----------------------------------


def with_turn(**changes: Any) -> dict[str, Any]:
    body = good("hostile")
    body["turns"][0] = {**body["turns"][0], **changes}
    return body


def hours_ahead(hours: float) -> str:
    """A turn time this many hours ahead of now (the server's clock is this machine's)."""
    return (datetime.now(UTC) + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


def without(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}


HOSTILE: list[tuple[str, Any, str]] = [
    ("array body", [good()], "body"),
    ("missing user", without(good(), "user"), "user"),
    ("empty user", {**good(), "user": ""}, "user"),
    ("blank user", {**good(), "user": "   "}, "user"),
    ("user not a string", {**good(), "user": 42}, "user"),
    ("user too long", {**good(), "user": "a" * 257}, "user"),
    ("user with NUL", {**good(), "user": "ali\x00ce"}, "user"),
    ("missing conversation_id", without(good(), "conversation_id"), "conversation_id"),
    ("conversation_id ..", {**good(), "conversation_id": ".."}, "conversation_id"),
    ("conversation_id path", {**good(), "conversation_id": "../../etc/passwd"}, "conversation_id"),
    ("conversation_id slash", {**good(), "conversation_id": "a/b"}, "conversation_id"),
    ("conversation_id NUL", {**good(), "conversation_id": "a\x00b"}, "conversation_id"),
    ("conversation_id colon", {**good(), "conversation_id": "a:b"}, "conversation_id"),
    ("conversation_id too long", {**good(), "conversation_id": "c" * 129}, "conversation_id"),
    ("conversation_id number", {**good(), "conversation_id": 7}, "conversation_id"),
    ("missing turns", without(good(), "turns"), "turns"),
    ("empty turns", {**good(), "turns": []}, "turns"),
    ("turns an object", {**good(), "turns": {"0": turn("user", "hi")}}, "turns"),
    ("too many turns", {**good(), "turns": [turn("user", "x")] * 51}, "turns"),
    ("turn a string", {**good(), "turns": ["hello"]}, "turns[0]"),
    ("unknown role", with_turn(role="admin"), "turns[0].role"),
    ("missing role", {**good(), "turns": [without(turn("user", "hi"), "role")]}, "turns[0].role"),
    ("role a list", with_turn(role=["user"]), "turns[0].role"),
    ("role an object", with_turn(role={"user": 1}), "turns[0].role"),
    ("text a number", with_turn(text=12), "turns[0].text"),
    ("text missing", {**good(), "turns": [without(turn("user", "x"), "text")]}, "turns[0].text"),
    ("text with NUL", with_turn(text="bad\x00byte"), "turns[0].text"),
    ("text too long", with_turn(text="x" * 5001), "turns[0].text"),
    ("ts words", with_turn(ts="yesterday"), "turns[0].ts"),
    ("ts without offset", with_turn(ts="2026-10-08T09:00:00"), "turns[0].ts"),
    ("ts impossible date", with_turn(ts="2026-13-40T09:00:00Z"), "turns[0].ts"),
    ("ts a number", with_turn(ts=1760000000), "turns[0].ts"),
    ("ts date only", with_turn(ts="2026-10-08"), "turns[0].ts"),
    ("ts in year 0 once in UTC", with_turn(ts="0001-01-01T00:30:00+01:00"), "turns[0].ts"),
    ("ts in year 10000 once in UTC", with_turn(ts="9999-12-31T23:30:00-01:00"), "turns[0].ts"),
    ("ts in year 9999", with_turn(ts="9999-12-31T00:00:00Z"), "turns[0].ts"),
    ("ts a day and an hour ahead", with_turn(ts=hours_ahead(25)), "turns[0].ts"),
    ("id a number", with_turn(id=5), "turns[0].id"),
    ("id empty", with_turn(id=""), "turns[0].id"),
    (
        "duplicate ids",
        {**good(), "turns": [turn("user", "a", id="t1"), turn("assistant", "b", id="t1")]},
        "turns[1].id",
    ),
]


@pytest.mark.parametrize(("name", "body", "field"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_malformed_body_is_refused_naming_the_field_and_writes_nothing(
    stored_by: Server, name: str, body: Any, field: str
) -> None:
    before = snapshot(stored_by)
    status, answer = stored_by.post(body)
    assert status == 400, answer
    assert answer["error"].startswith(field), answer
    assert snapshot(stored_by) == before


def test_body_that_is_not_json_is_refused(stored_by: Server) -> None:
    before = snapshot(stored_by)
    status, answer = stored_by.post(None, raw=b'{"user": "alice", "turns": [')
    assert status == 400 and answer["error"].startswith("body")
    assert snapshot(stored_by) == before


def test_body_over_the_limit_is_refused_with_413_and_writes_nothing(stored_by: Server) -> None:
    before = snapshot(stored_by)
    turns = [turn("user", "y" * 4000) for _ in range(20)]  # ~80 KB, over the 64 KiB limit
    status, answer = stored_by.post({**good("big"), "turns": turns})
    assert status == 413 and answer["error"].startswith("body")
    assert snapshot(stored_by) == before


def test_body_over_the_limit_without_content_length_is_refused_while_streaming(
    server: Server,
) -> None:
    import http.client

    before = tree(server.data_dir)
    # Given a chunked upload, its size never announced, that passes the 64 KiB limit and then
    # stalls: its last chunk never comes
    connection = http.client.HTTPConnection("127.0.0.1", int(server.env["PORT"]), timeout=90)
    connection.putrequest("POST", "/turns")
    connection.putheader("x-ingest-key", server.ingest_key)
    connection.putheader("transfer-encoding", "chunked")
    connection.endheaders()
    chunk = b"z" * 16384
    try:
        for _ in range(5):  # 80 KiB
            connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer and close before we finish sending
    # When the server answers, while the body is still unfinished
    status = connection.getresponse().status
    connection.close()
    # Then it is 413: the server counted what arrived; one that waited for the whole body would
    # have answered 408 when BODY_TIMEOUT (30 s) ran out, since the body never ends
    assert status == 413
    assert tree(server.data_dir) == before


# --- lone surrogates: JSON allows "\ud83d" alone, UTF-8 cannot encode it ---------------------
# A gateway that cuts a string inside an emoji sends one. The bodies below are raw bytes, so the
# server receives exactly the six characters \ud83d that such a gateway sends.


def raw_body(
    cid: str = '"cut"',
    user: str = '"alice"',
    text: str = '"hello"',
    turn_id: str = '"t0"',
    role: str = '"user"',
) -> bytes:
    """A body as the gateway's bytes; each argument is a JSON value, written as is."""
    return (
        f'{{"user": {user}, "conversation_id": {cid}, "turns": ['
        f'{{"id": {turn_id}, "role": {role}, "text": {text}, "ts": "2026-10-08T09:00:00Z"}}]}}'
    ).encode()


def test_a_lone_surrogate_in_text_is_stored_as_a_replacement_character(server: Server) -> None:
    # Given a text cut inside one emoji, and a whole emoji sent as an escaped pair
    body = raw_body('"cut-text"', text=r'"cut \ud83d here, whole \ud83d\ude00 there"')
    # When the gateway posts it
    status, answer = server.post(None, raw=body)
    # Then it is stored, the cut character as U+FFFD and the whole emoji as itself
    assert (status, answer) == (202, {"stored": "cut-text"})
    path = source(server, "alice", "cut-text")
    assert validate_file(path) is None
    stored = json.loads(path.read_text(encoding="utf-8"))["blocks"][0]["text"]
    assert stored == "cut \ufffd here, whole \U0001f600 there"


SURROGATE_REFUSALS: list[tuple[str, dict[str, str], str]] = [
    ("user high surrogate", {"user": r'"alice\ud83d"'}, "user"),
    ("user low surrogate", {"user": r'"\ude00alice"'}, "user"),
    ("user reversed pair", {"user": r'"\ude00\ud83d"'}, "user"),
    ("turn id", {"turn_id": r'"turn-\ud83d"'}, "turns[0].id"),
    ("turn id low surrogate", {"turn_id": r'"\udfff"'}, "turns[0].id"),
    ("role", {"role": r'"user\ud83d"'}, "turns[0].role"),
    ("conversation_id", {"cid": r'"c\ud83d"'}, "conversation_id"),
]


@pytest.mark.parametrize(
    ("name", "fields", "field"), SURROGATE_REFUSALS, ids=[s[0] for s in SURROGATE_REFUSALS]
)
def test_a_lone_surrogate_outside_text_is_refused_naming_the_field_and_writes_nothing(
    server: Server, name: str, fields: dict[str, str], field: str
) -> None:
    before = tree(server.data_dir)
    status, answer = server.post(None, raw=raw_body(**fields))
    assert status == 400, answer
    assert answer["error"].startswith(f"{field}:"), answer
    assert tree(server.data_dir) == before  # not even an empty directory


def test_a_lone_surrogate_in_an_ignored_key_is_ignored(server: Server) -> None:
    # Unknown fields are ignored, so a cut key (or its value) never reaches the disk
    body = raw_body('"cut-key"').replace(b'"user": ', b'"x\\ud83d": 1, "user": ')
    body = body.replace(b'"role": ', b'"\\udc00": "y\\ud83d", "role": ')
    assert server.post(None, raw=body) == (202, {"stored": "cut-key"})
    assert validate_file(source(server, "alice", "cut-key")) is None


def test_a_turn_stamped_more_than_a_day_ahead_is_refused_naming_the_bound(server: Server) -> None:
    # Given a post whose second turn is stamped a day and five minutes ahead of the server
    body = good("far-ahead")
    body["turns"][1]["ts"] = hours_ahead(24 + 5 / 60)
    before = tree(server.data_dir)
    # When it is posted; then it is refused, naming the field and the bound, and nothing is written
    assert server.post(body) == (
        400,
        {"error": "turns[1].ts: more than 24 hours ahead of the server's clock"},
    )
    assert tree(server.data_dir) == before


def test_a_turn_stamped_hours_ahead_is_stored(server: Server) -> None:
    # A gateway's clock a few hours off (or local time sent with Z) is not refused
    body = good("hours-ahead")
    body["turns"][1]["ts"] = hours_ahead(23)
    assert server.post(body)[0] == 202
    assert len(source(server, "alice", "hours-ahead").read_text().splitlines()) == 2


def test_a_timestamp_early_in_year_one_is_stored_with_a_four_digit_year(server: Server) -> None:
    body = with_turn(ts="0001-01-01T01:30:00+01:00")
    body["conversation_id"] = "year-one"
    assert server.post(body)[0] == 202
    path = source(server, "alice", "year-one")
    assert json.loads(path.read_text().splitlines()[0])["ts"] == "0001-01-01T00:30:00Z"
    assert validate_file(path) is None  # funes would refuse the whole file for a "1-01-01" date


def test_a_conversation_that_cannot_be_encoded_leaves_no_directory_behind(tmp_path: Path) -> None:
    # Given a conversation built around the validation, holding a lone surrogate
    line = {**parse_conversation(good()).lines[0]}
    line["blocks"] = [{"block_type": "text", "text": "cut \ud83d"}]
    broken = Conversation(user="alice", conversation_id="cut", lines=[line])
    # When it is written
    with pytest.raises(UnicodeEncodeError):
        write_conversation(tmp_path / "home", broken)
    # Then nothing is on disk, not even the user's directory
    assert not (tmp_path / "home").exists()


def test_a_write_that_fails_on_disk_leaves_no_directory_behind(tmp_path: Path) -> None:
    # Given a conversation whose file name the filesystem refuses (too long), after the mkdir
    good_lines = parse_conversation(good()).lines
    unwritable = Conversation(user="alice", conversation_id="c" * 300, lines=good_lines)
    # When it is written
    with pytest.raises(OSError):
        write_conversation(tmp_path / "home", unwritable)
    # Then the directories it created are gone again
    assert not (tmp_path / "home").exists()


# --- what lands on disk -----------------------------------------------------------------------


def test_written_file_follows_the_funes_format_contract(server: Server) -> None:
    body = {
        "user": "alice",
        "conversation_id": "format-check",
        "turns": [
            turn("user", "Shift handover: MT-4471 on K-2.", "2026-10-03T07:15:00+02:00", id="u1"),
            turn("assistant", "Noted. North finishing line runs at 80%.", "2026-10-03T05:16:30Z"),
            turn("tool", "lookup result", "2026-10-03T05:17:00.250Z", id="x:y/../z"),
            turn("system", "", "2026-10-03T05:18:00z"),
        ],
    }
    assert server.post(body)[0] == 202
    path = source(server, "alice", "format-check")
    assert validate_file(path) is None
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["seq"] for line in lines] == [0, 1, 2, 3]
    assert [line["ts"] for line in lines] == [
        "2026-10-03T05:15:00Z",  # the +02:00 offset converted to UTC
        "2026-10-03T05:16:30Z",
        "2026-10-03T05:17:00Z",
        "2026-10-03T05:18:00Z",
    ]
    assert lines[0]["turn_uuid"] == "u1"
    assert lines[1]["turn_uuid"] == "format-check-1"  # no id: <conversation_id>-<seq>
    assert ":" not in lines[2]["turn_uuid"] and "/" not in lines[2]["turn_uuid"]
    assert {line["harness"] for line in lines} == {"gateway"}
    assert lines[0]["blocks"] == [{"block_type": "text", "text": "Shift handover: MT-4471 on K-2."}]


def test_unsafe_turn_ids_map_to_the_same_safe_id_every_time(server: Server) -> None:
    body = {**good("stable-ids"), "turns": [turn("user", "a", id="gw:turn:1")]}
    assert server.post(body)[0] == 202
    first = json.loads(source(server, "alice", "stable-ids").read_text())["turn_uuid"]
    assert server.post(body)[0] == 202
    second = json.loads(source(server, "alice", "stable-ids").read_text())["turn_uuid"]
    assert first == second and ":" not in first


def test_user_directory_is_a_hash_and_no_user_id_appears_on_disk(server: Server) -> None:
    user = "carol.secret@example.com"
    assert server.post(good("hashed", user=user))[0] == 202
    expected = hashlib.sha256(user.encode()).hexdigest()[:24]
    assert (server.data_dir / expected / "src" / "hashed.funes.jsonl").exists()
    for path in server.data_dir.rglob("*"):
        assert "carol" not in str(path.relative_to(server.data_dir))
        if path.is_file():
            assert "carol" not in path.read_text(errors="ignore")
    assert "carol" not in server.log()


def test_reposting_the_same_conversation_is_idempotent(stored_by: Server) -> None:
    body = good("idem")
    assert stored_by.post(body)[0] == 202
    first = snapshot(stored_by)
    assert stored_by.post(body)[0] == 202
    assert snapshot(stored_by) == first


def test_posting_a_longer_version_extends_the_conversation(stored_by: Server) -> None:
    body = good("grows")
    assert stored_by.post(body)[0] == 202
    longer = {**body, "turns": [*body["turns"], turn("user", "And who owns the fix?")]}
    assert stored_by.post(longer)[0] == 202
    texts = texts_stored(stored_by, "grows")
    assert len(texts) == 3 and texts[2] == "And who owns the fix?"
    if on_files(stored_by):
        assert validate_file(source(stored_by, "alice", "grows")) is None


def test_concurrent_posts_of_one_conversation_end_in_one_complete_file(stored_by: Server) -> None:
    versions = [
        {
            **good("racy"),
            "turns": [turn("user", f"version {v} turn {i} " + "w" * 300) for i in range(v + 1)],
        }
        for v in range(12)
    ]
    with ThreadPoolExecutor(max_workers=12) as pool:
        statuses = list(pool.map(lambda body: stored_by.post(body)[0], versions * 2))
    assert statuses == [202] * 24
    texts = texts_stored(stored_by, "racy")
    version = texts[0].split()[1]
    assert all(text.startswith(f"version {version} ") for text in texts)  # one version, no mix
    assert len(texts) == int(version) + 1
    if on_files(stored_by):
        path = source(stored_by, "alice", "racy")
        assert validate_file(path) is None
        assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


# --- stale re-posts: a delayed retry of an older snapshot never shortens a conversation ------


def chat(cid: str, n: int, **edits: str) -> dict[str, Any]:
    """A conversation of n turns; edits replace a turn's text, e.g. {"t1": "edited"}."""
    roles = ["user", "assistant"]
    turns = [
        turn(roles[i % 2], edits.get(f"t{i}", f"turn {i} of {cid}"), f"2026-10-08T09:{i:02d}:00Z")
        for i in range(n)
    ]
    return {"user": "alice", "conversation_id": cid, "turns": turns}


def texts_of(path: Path) -> list[str]:
    return [json.loads(line)["blocks"][0]["text"] for line in path.read_text().splitlines()]


def test_a_stale_shorter_repost_keeps_the_longer_stored_version(stored_by: Server) -> None:
    # Given a conversation stored with four turns
    assert stored_by.post(chat("stale", 4))[0] == 202
    before = snapshot(stored_by)
    # When a delayed retry of its two-turn snapshot arrives
    status, answer = stored_by.post(chat("stale", 2))
    # Then it is acknowledged, and what is stored is untouched (a file: not even replaced)
    assert (status, answer) == (202, {"stored": "stale"})
    assert snapshot(stored_by) == before
    assert len(texts_stored(stored_by, "stale")) == 4


def test_an_identical_repost_writes_nothing(stored_by: Server) -> None:
    assert stored_by.post(chat("same", 3))[0] == 202
    before = snapshot(stored_by)
    inode = source(stored_by, "alice", "same").stat().st_ino if on_files(stored_by) else None
    assert stored_by.post(chat("same", 3)) == (202, {"stored": "same"})
    assert snapshot(stored_by) == before
    if inode is not None:
        assert source(stored_by, "alice", "same").stat().st_ino == inode  # a write: new inode


def test_a_shorter_repost_with_an_edited_turn_replaces_the_stored_version(
    stored_by: Server,
) -> None:
    assert stored_by.post(chat("edited", 4))[0] == 202
    assert stored_by.post(chat("edited", 3, t1="edited answer")) == (202, {"stored": "edited"})
    texts = texts_stored(stored_by, "edited")
    assert texts == ["turn 0 of edited", "edited answer", "turn 2 of edited"]
    if on_files(stored_by):
        assert validate_file(source(stored_by, "alice", "edited")) is None


def test_a_regenerated_last_turn_replaces_the_stored_version(stored_by: Server) -> None:
    assert stored_by.post(chat("regen", 4))[0] == 202
    assert stored_by.post(chat("regen", 4, t3="a regenerated answer"))[0] == 202
    assert texts_stored(stored_by, "regen")[3] == "a regenerated answer"


SHORTER_AND_DIFFERENT: list[tuple[str, dict[str, Any]]] = [
    ("text", {"text": "other words"}),
    ("ts", {"ts": "2026-10-08T10:00:00Z"}),
    ("role", {"role": "system"}),
    ("id", {"id": "another-id"}),
]


@pytest.mark.parametrize(
    ("name", "change"), SHORTER_AND_DIFFERENT, ids=[c[0] for c in SHORTER_AND_DIFFERENT]
)
def test_a_shorter_post_differing_in_any_turn_field_replaces_the_stored_version(
    stored_by: Server, name: str, change: dict[str, Any]
) -> None:
    # Given a stored conversation of three turns
    cid = f"differs-{name}"
    assert stored_by.post(chat(cid, 3))[0] == 202
    # When a two-turn version arrives whose first turn differs in one field
    shorter = chat(cid, 2)
    shorter["turns"][0] = {**shorter["turns"][0], **change}
    assert stored_by.post(shorter)[0] == 202
    # Then it is not a prefix of what is stored, and replaces it
    assert len(texts_stored(stored_by, cid)) == 2


def test_concurrent_posts_of_growing_prefixes_end_in_the_longest_version(
    stored_by: Server,
) -> None:
    # Given twelve snapshots of one growing conversation, each posted twice, the longest first
    # and the rest in random order, all at once, as a gateway retrying on timeouts might
    longest = chat("growing", 12)
    for i, t in enumerate(longest["turns"]):
        t["text"] = f"turn {i} " + "w" * 3000  # big enough that writes overlap
    versions = [{**longest, "turns": longest["turns"][: n + 1]} for n in range(12)]
    rest = versions[:-1] * 2 + [versions[-1]]
    random.Random(8).shuffle(rest)
    with ThreadPoolExecutor(max_workers=12) as pool:
        statuses = list(pool.map(lambda body: stored_by.post(body)[0], [versions[-1], *rest]))
    # Then every post is acknowledged and the conversation is whole: the longest version
    assert statuses == [202] * 24
    assert texts_stored(stored_by, "growing") == [t["text"] for t in longest["turns"]]
    if on_files(stored_by):
        path = source(stored_by, "alice", "growing")
        assert validate_file(path) is None
        assert not [p for p in path.parent.iterdir() if not p.name.endswith(".funes.jsonl")]


def test_a_post_waits_for_the_conversation_lock_another_process_holds(server: Server) -> None:
    # Given another writer (the backfill command, say) holding the conversation's lock
    assert server.post(chat("locked", 1))[0] == 202
    home = server.home("alice")
    answers: list[tuple[int, dict[str, Any]]] = []
    with conversation_lock(home, "locked"):
        # When the gateway posts a longer version meanwhile
        poster = threading.Thread(target=lambda: answers.append(server.post(chat("locked", 2))))
        poster.start()
        time.sleep(1.0)
        # Then it waits: nothing answered, nothing written
        assert answers == [] and len(texts_of(source(server, "alice", "locked"))) == 1
    # And once the lock is released it goes through
    poster.join(timeout=60)
    assert answers == [(202, {"stored": "locked"})]
    assert len(texts_of(source(server, "alice", "locked"))) == 2


def test_no_user_id_or_conversation_text_in_the_logs(server: Server) -> None:
    assert server.post(good("logcheck", user="dave-private"))[0] == 202
    log = server.log()
    assert "dave-private" not in log and "MT-4471" not in log and server.ingest_key not in log


# --- the converter on its own -----------------------------------------------------------------


def test_parse_refuses_before_any_disk_access() -> None:
    with pytest.raises(InvalidConversation, match=r"^turns\[0\]\.ts"):
        parse_conversation(with_turn(ts="2026-10-08 09:00"))
