"""The write path over real HTTP: the key, validation before disk, the funes file format."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, conversation, install_fake_funes, make_server, tree, turn
from fake_funes import validate_file

from recall.conversations import InvalidConversation, parse_conversation


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


def test_key_is_compared_in_constant_time() -> None:
    # The route uses hmac.compare_digest; a == compare would leak the key's prefix by timing.
    text = (Path(__file__).parent.parent / "recall_server.py").read_text()
    assert "hmac.compare_digest(provided, ingest_key)" in text


# --- refusals: each a 4xx naming the field, nothing on disk -----------------------------------


def with_turn(**changes: Any) -> dict[str, Any]:
    body = good("hostile")
    body["turns"][0] = {**body["turns"][0], **changes}
    return body


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
    ("text a number", with_turn(text=12), "turns[0].text"),
    ("text missing", {**good(), "turns": [without(turn("user", "x"), "text")]}, "turns[0].text"),
    ("text with NUL", with_turn(text="bad\x00byte"), "turns[0].text"),
    ("text too long", with_turn(text="x" * 5001), "turns[0].text"),
    ("ts words", with_turn(ts="yesterday"), "turns[0].ts"),
    ("ts without offset", with_turn(ts="2026-10-08T09:00:00"), "turns[0].ts"),
    ("ts impossible date", with_turn(ts="2026-13-40T09:00:00Z"), "turns[0].ts"),
    ("ts a number", with_turn(ts=1760000000), "turns[0].ts"),
    ("ts date only", with_turn(ts="2026-10-08"), "turns[0].ts"),
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
    server: Server, name: str, body: Any, field: str
) -> None:
    before = tree(server.data_dir)
    status, answer = server.post(body)
    assert status == 400, answer
    assert answer["error"].startswith(field), answer
    assert tree(server.data_dir) == before


def test_body_that_is_not_json_is_refused(server: Server) -> None:
    before = tree(server.data_dir)
    status, answer = server.post(None, raw=b'{"user": "alice", "turns": [')
    assert status == 400 and answer["error"].startswith("body")
    assert tree(server.data_dir) == before


def test_body_over_the_limit_is_refused_with_413_and_writes_nothing(server: Server) -> None:
    before = tree(server.data_dir)
    turns = [turn("user", "y" * 4000) for _ in range(20)]  # ~80 KB, over the 64 KiB limit
    status, answer = server.post({**good("big"), "turns": turns})
    assert status == 413 and answer["error"].startswith("body")
    assert tree(server.data_dir) == before


def test_body_over_the_limit_without_content_length_is_refused_while_streaming(
    server: Server,
) -> None:
    import http.client

    before = tree(server.data_dir)
    connection = http.client.HTTPConnection("127.0.0.1", int(server.env["PORT"]), timeout=30)
    connection.putrequest("POST", "/turns")
    connection.putheader("x-ingest-key", server.ingest_key)
    connection.putheader("transfer-encoding", "chunked")
    connection.endheaders()
    chunk = b"z" * 16384
    try:
        for _ in range(8):  # 128 KiB in chunks, never announced up front
            connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        connection.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer and close before we finish sending
    assert connection.getresponse().status == 413
    assert tree(server.data_dir) == before


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


def test_reposting_the_same_conversation_is_idempotent(server: Server) -> None:
    body = good("idem")
    assert server.post(body)[0] == 202
    first = source(server, "alice", "idem").read_bytes()
    assert server.post(body)[0] == 202
    assert source(server, "alice", "idem").read_bytes() == first


def test_posting_a_longer_version_extends_the_conversation(server: Server) -> None:
    body = good("grows")
    assert server.post(body)[0] == 202
    longer = {**body, "turns": [*body["turns"], turn("user", "And who owns the fix?")]}
    assert server.post(longer)[0] == 202
    lines = source(server, "alice", "grows").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["blocks"][0]["text"] == "And who owns the fix?"
    assert validate_file(source(server, "alice", "grows")) is None


def test_concurrent_posts_of_one_conversation_end_in_one_complete_file(server: Server) -> None:
    versions = [
        {
            **good("racy"),
            "turns": [turn("user", f"version {v} turn {i} " + "w" * 300) for i in range(v + 1)],
        }
        for v in range(12)
    ]
    with ThreadPoolExecutor(max_workers=12) as pool:
        statuses = list(pool.map(lambda body: server.post(body)[0], versions * 2))
    assert statuses == [202] * 24
    path = source(server, "alice", "racy")
    assert validate_file(path) is None
    texts = [json.loads(line)["blocks"][0]["text"] for line in path.read_text().splitlines()]
    version = texts[0].split()[1]
    assert all(text.startswith(f"version {version} ") for text in texts)  # one version, no mix
    assert len(texts) == int(version) + 1
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_no_user_id_or_conversation_text_in_the_logs(server: Server) -> None:
    assert server.post(good("logcheck", user="dave-private"))[0] == 202
    log = server.log()
    assert "dave-private" not in log and "MT-4471" not in log and server.ingest_key not in log


# --- the converter on its own -----------------------------------------------------------------


def test_parse_refuses_before_any_disk_access() -> None:
    with pytest.raises(InvalidConversation, match=r"^turns\[0\]\.ts"):
        parse_conversation(with_turn(ts="2026-10-08 09:00"))
