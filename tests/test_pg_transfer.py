"""`recall-server import` of a files store made by the real server, and `export` back to files."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import ROOT, Server, conversation, install_fake_funes, make_server
from pg import PgDatabase
from psycopg import sql

from recall import audit
from recall.conversations import source_files, user_dir_name
from recall.lifecycle import list_receipts, read_tombstones, tombstone_key
from recall.pg.schema import USER_TABLES, key_id

ALICE_HASH, BOB_HASH = user_dir_name("alice"), user_dir_name("bob")


@pytest.fixture(scope="module")
def files_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DATA_DIR written by the real server (files store, funes stand-in), then stopped:
    alice has two conversations and forgot a third, bob has one and made two recalls."""
    root = tmp_path_factory.mktemp("files-store")
    funes = install_fake_funes(root / "funes-bin")
    server: Server = make_server(root, ENGINE="funes", FUNES_BIN=str(funes.path))
    with server.start():
        for body in (
            conversation("alice", "c-keep", "The K-2 ticket is MT-4471.", "Noted: MT-4471."),
            conversation("alice", "c-also", "Base case growth 4 percent.", "Four percent.", day=9),
            conversation("alice", "c-forget", "My old address is 12 Elm St.", "Noted."),
            conversation("bob", "c-bob", "Upgrade N-11 on Friday.", "Friday it is.", day=10),
        ):
            assert server.post(body)[0] == 202
        status, _ = server.post({"user": "alice", "conversation_id": "c-forget"}, route="/forget")
        assert status == 200
        for query in ("N-11 upgrade", "N-11 upgrade"):  # the same line twice: two calls
            asyncio.run(server.recall("bob", query))
    data = server.data_dir
    assert read_tombstones(data / ALICE_HASH)["turns"]["c-forget"]
    assert len(audit.read(data / BOB_HASH)) == 2
    return data


def run(command: str, url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "recall_server.py", command, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (the owner's policy lets it read all users)."""
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(
                sql.SQL("SELECT * FROM {} ORDER BY 1, 2").format(sql.Identifier(table))
            ).fetchall()
            for table in (*USER_TABLES, "server_keys")
        }


def sources(data_dir: Path, user_hash: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in source_files(data_dir / user_hash)}


def test_import_loads_every_users_data_and_a_second_run_changes_nothing(
    files_store: Path, pg_database: PgDatabase
) -> None:
    # when the files store is imported
    done = run("import", pg_database.owner_url, str(files_store))
    assert done.returncode == 0, done.stderr
    # then the progress names users by hash only, one line each, then the totals
    assert ALICE_HASH < BOB_HASH  # the order of the users: their hashes'
    assert done.stderr.strip().splitlines() == [
        f"user 1/2 {ALICE_HASH}: 2 conversations (1 receipts)",
        f"user 2/2 {BOB_HASH}: 1 conversations (2 audit lines)",
        "imported 2 users: 3 conversations (1 receipts, 2 audit lines)",
    ]
    assert "alice" not in done.stderr and "bob" not in done.stderr
    # and the conversations are the files, byte for byte
    stored = rows(pg_database.owner_url)
    for user_hash in (ALICE_HASH, BOB_HASH):
        assert {
            f"{cid}.funes.jsonl": body.encode()
            for h, cid, body, *_ in stored["conversations"]
            if h == user_hash
        } == sources(files_store, user_hash)
    # and the forgotten conversation's digests are there under the files store's key
    key = tombstone_key(files_store)
    assert stored["server_keys"][0][:2] == (key_id(key), key)
    digests = read_tombstones(files_store / ALICE_HASH)["turns"]["c-forget"]
    assert sorted(stored["tombstones"]) == [
        (ALICE_HASH, "c-forget", key_id(key), d) for d in sorted(digests)
    ]
    # and the receipts and the audit lines, as the files store reads them
    assert [r for h, _, r in stored["receipts"]] == list_receipts(files_store, ALICE_HASH)
    assert [line for h, _, _, line in stored["audit"]] == audit.read(files_store / BOB_HASH)
    # and each user is due for indexing
    assert {(h, due is not None, changes) for h, changes, _, due, *_ in stored["users"]} == {
        (ALICE_HASH, True, 2),
        (BOB_HASH, True, 1),
    }
    # when it runs again, then nothing changes
    again = run("import", pg_database.owner_url, str(files_store))
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip().splitlines()[-1] == (
        "imported 2 users: 0 conversations (3 already there)"
    )
    assert rows(pg_database.owner_url) == stored


def test_export_writes_a_users_conversations_back_byte_for_byte(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path
) -> None:
    assert run("import", pg_database.owner_url, str(files_store)).returncode == 0
    out = tmp_path / "alice-export"
    # the app role reads its own rows: export needs no owner
    done = run("export", pg_database.app_url, "--user", "alice", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (
        f"recall-server export: 2 conversations of user {ALICE_HASH} in {out}"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == sources(files_store, ALICE_HASH)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o600}


def test_import_keeps_what_postgres_holds_newer_and_what_it_forgot_since(
    files_store: Path, pg_database: PgDatabase
) -> None:
    # given an import, then a replica on PostgreSQL that grew c-keep and forgot c-also
    assert run("import", pg_database.owner_url, str(files_store)).returncode == 0
    with psycopg.connect(pg_database.owner_url) as conn:
        conn.execute(
            "UPDATE conversations SET body = 'grown', last_ts = last_ts + interval '1 day', "
            "turns = turns + 1 WHERE conversation_id = 'c-keep'"
        )
        conn.execute("DELETE FROM conversations WHERE conversation_id = 'c-also'")
        conn.execute("INSERT INTO tombstones VALUES (%s, 'c-also', 'pgkey001', 'd')", (ALICE_HASH,))
    # when the files store is imported again
    done = run("import", pg_database.owner_url, str(files_store))
    assert done.returncode == 0, done.stderr
    # then neither comes back from the files
    assert done.stderr.splitlines()[0] == (
        f"user 1/2 {ALICE_HASH}: 0 conversations (1 already there, 1 forgotten there since, "
        "left out)"
    )
    with psycopg.connect(pg_database.owner_url) as conn:
        assert conn.execute(
            "SELECT conversation_id, body FROM conversations WHERE user_hash = %s", (ALICE_HASH,)
        ).fetchall() == [("c-keep", "grown")]


def test_import_brings_the_time_rules_from_before_digests_and_counts_unreadable_files(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path
) -> None:
    # given a copy of the store where bob's tombstones hold the old time rules, and a damaged
    # conversation file
    data = tmp_path / "data"
    shutil.copytree(files_store, data)
    tombstones = data / BOB_HASH / "tombstones.json"
    tombstones.write_text(
        json.dumps(
            {"erased": "2026-01-02T00:00:00Z", "conversations": {"c-old": "2026-03-04T05:06:07Z"}}
        )
    )
    (data / BOB_HASH / "src" / "c-torn.funes.jsonl").write_bytes(b'{"role": "us')
    # when it is imported
    done = run("import", pg_database.owner_url, str(data))
    # then the rules are in tombstone_times ('*' the erasure), and the damaged file is counted,
    # left out, and makes the exit status 1
    assert done.returncode == 1
    assert f"{BOB_HASH}: 1 conversations (1 unreadable, left out, 2 audit lines)" in done.stderr
    with psycopg.connect(pg_database.owner_url) as conn:
        times = conn.execute(
            "SELECT conversation_id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') "
            "FROM tombstone_times WHERE user_hash = %s ORDER BY 1",
            (BOB_HASH,),
        ).fetchall()
    assert times == [("*", "2026-01-02 00:00:00"), ("c-old", "2026-03-04 05:06:07")]


def test_import_refuses_a_store_whose_digests_lost_their_key(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(files_store, data)
    (data / "_keys" / "tombstone.key").unlink()
    done = run("import", pg_database.owner_url, str(data))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "recall-server import: _keys/tombstone.key is missing but tombstones hold digests: "
        "restore it from the backup of DATA_DIR first"
    )
    assert rows(pg_database.owner_url)["conversations"] == []


def test_import_into_a_database_without_the_schema_says_run_migrate(
    files_store: Path, pg_server: Any
) -> None:
    database = pg_server.empty_database()
    try:
        done = run("import", database.owner_url, str(files_store))
        assert done.returncode == 2
        assert done.stderr.strip().startswith(
            "recall-server import: the database has no recall schema"
        )
    finally:
        pg_server.drop_database(database.name)


def test_import_refuses_a_user_whose_tombstones_are_unreadable(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(files_store, data)
    (data / ALICE_HASH / "tombstones.json").write_text('{"turns": ')
    done = run("import", pg_database.owner_url, str(data))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"recall-server import: user {ALICE_HASH}: tombstones.json unreadable (JSONDecodeError): "
        "restore it from the backup of DATA_DIR first"
    )
    assert rows(pg_database.owner_url)["conversations"] == []


def test_export_into_a_file_says_so_in_one_line(pg_database: PgDatabase, tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    done = run("export", pg_database.app_url, "--user", "alice", "--out", str(taken))
    assert done.returncode == 2
    assert done.stderr.startswith("recall-server export: [Errno 17] File exists: ")
    assert len(done.stderr.strip().splitlines()) == 1
