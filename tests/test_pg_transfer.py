"""`recall-server import` of a files store made by the real server, and `export` back to files."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import ROOT, Server, conversation, install_fake_funes, make_server
from pg import PgDatabase
from psycopg import sql

from recall import transfer
from recall.domain.conversation import conversation_ref, user_dir_name
from recall.files import audit_file
from recall.files.layout import source_files
from recall.files.lifecycle import list_receipts, read_tombstones, remove_source, tombstone_key
from recall.pg.schema import USER_TABLES, key_id
from recall.reading import NOT_FOUND as READ_NOT_FOUND

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
    assert len(audit_file.read(data / BOB_HASH)) == 2
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
    assert [line for h, _, _, line in stored["audit"]] == audit_file.read(files_store / BOB_HASH)
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


# --- a second import after the files store forgot or erased (review issue 32, items 1 and 3) ---


def files_copy(files_store: Path, workdir: Path) -> Path:
    """A copy of the module's files store as ``workdir/data``, where make_server(workdir) serves
    it: a test that changes it changes its own."""
    workdir.mkdir()
    shutil.copytree(files_store, workdir / "data")
    return workdir / "data"


def replica(workdir: Path, database: PgDatabase) -> Server:
    """A replica on the imported database (STORE=postgres), not yet started."""
    workdir.mkdir()
    return make_server(workdir, ENGINE="embedded", STORE="postgres", DATABASE_URL=database.app_url)


def as_user(server: Server, user: str, path: str) -> Any:
    """GET /api/me/... with the user's token (the memory page's API)."""
    request = urllib.request.Request(
        f"{server.url}{path}", headers={"authorization": f"Bearer {server.tokens[user]}"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def rows_of(url: str, user_hash: str, *tables: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(
                sql.SQL("SELECT * FROM {} WHERE user_hash = %s").format(sql.Identifier(table)),
                (user_hash,),
            ).fetchall()
            for table in tables
        }


INDEX_TABLES = ("chunks", "postings", "terms", "indexed")


async def test_a_second_import_removes_what_the_files_store_forgot_or_erased_since(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path
) -> None:
    # given a files store imported into PostgreSQL, and a replica that indexed and serves it
    data = files_copy(files_store, tmp_path / "files")
    assert run("import", pg_database.owner_url, str(data)).returncode == 0
    with replica(tmp_path / "replica", pg_database).start() as served:
        served.wait_indexed()
        assert "Noted: MT-4471" in await served.recall("alice", "the K-2 ticket MT-4471")
        assert "Friday it is" in await served.recall("bob", "N-11 upgrade")
        # when, on the files store (its own server, before the gateway switched over), alice
        # forgets c-keep and bob is erased
        funes = install_fake_funes(tmp_path / "funes-bin")
        with make_server(tmp_path / "files", ENGINE="funes", FUNES_BIN=str(funes.path)) as files:
            files.start()
            forgot = files.post({"user": "alice", "conversation_id": "c-keep"}, route="/forget")
            assert forgot[0] == 200
            assert files.post({"user": "bob"}, route="/erase")[0] == 200
        # and the files store is imported again, the replica serving meanwhile
        done = run("import", pg_database.owner_url, str(data))
        assert done.returncode == 0, done.stderr

        # then bob's audit is gone, as an erase on PostgreSQL removes it: nothing of his queries
        assert as_user(served, "bob", "/api/me/audit")["entries"] == []
        bobs = rows_of(pg_database.owner_url, BOB_HASH, "conversations", "audit", *INDEX_TABLES)
        assert bobs == {table: [] for table in bobs}
        # and what the erase keeps stays: his receipts, the files store's erase among them
        receipts = [
            r for _, _, r in rows_of(pg_database.owner_url, BOB_HASH, "receipts")["receipts"]
        ]
        assert [r["operation"] for r in receipts] == ["erase"]
        assert receipts == list_receipts(data, BOB_HASH)
        # and alice's forgotten conversation has no row and no index piece left
        alices = rows_of(pg_database.owner_url, ALICE_HASH, "conversations", *INDEX_TABLES)
        assert {row[1] for row in alices["conversations"]} == {"c-also"}
        assert {row[3] for row in alices["chunks"]} == {"c-also"}
        assert "mt-4471" not in repr(alices).lower()
        # and through the replica nothing of it is recalled, read or listed
        # (an answer may quote the query: the conversation's own words are what must not come)
        assert "Noted: MT-4471" not in await served.recall("alice", "the K-2 ticket MT-4471")
        assert "4 percent" in await served.recall("alice", "base case growth")
        assert served.stored_turns("alice", "c-keep") is None
        ref = conversation_ref(ALICE_HASH, "c-keep")
        assert await served.read("alice", ref=ref) == READ_NOT_FOUND
        listed = as_user(served, "alice", "/api/me/conversations")["conversations"]
        assert [c["conversation_id"] for c in listed] == ["c-also"]
        assert "Friday it is" not in await served.recall("bob", "N-11 upgrade")
        assert as_user(served, "bob", "/api/me/conversations")["conversations"] == []
        # and the import said what it removed
        assert done.stderr.strip().splitlines() == [
            f"user 1/2 {ALICE_HASH}: 0 conversations (1 already there, 1 forgotten on the files "
            "store since, removed, 1 receipts)",
            f"user 2/2 {BOB_HASH}: 0 conversations (1 erased on the files store since, 1 receipts)",
            "imported 2 users: 0 conversations (1 already there, 1 erased on the files store "
            "since, 1 forgotten on the files store since, removed, 2 receipts)",
        ]


def test_a_second_import_keeps_the_turns_postgres_got_since_of_a_conversation_forgotten_on_files(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path
) -> None:
    # given an import, then a turn of c-keep posted to PostgreSQL after the switch
    data = files_copy(files_store, tmp_path / "files")
    assert run("import", pg_database.owner_url, str(data)).returncode == 0
    last = json.loads(sources(data, ALICE_HASH)["c-keep.funes.jsonl"].splitlines()[-1])
    later = {**last, "turn_uuid": "t-later", "seq": 2, "ts": "2026-10-20T09:00:00Z"}
    later["blocks"] = [{**last["blocks"][0], "text": "The new plan is P-77."}]
    with psycopg.connect(pg_database.owner_url) as conn:
        conn.execute(
            "UPDATE conversations SET body = body || %s, turns = turns + 1, "
            "last_ts = '2026-10-20T09:00:00Z' WHERE conversation_id = 'c-keep'",
            (json.dumps(later) + "\n",),
        )
    # when the files store forgets c-keep (its lifecycle functions, as its server runs them)
    removed = remove_source(data / ALICE_HASH, "c-keep")
    assert removed is not None and removed != "already forgotten"
    # and it is imported again
    done = run("import", pg_database.owner_url, str(data))
    # then only the turn the files store never had is left, renumbered from 0, as a post of
    # the whole conversation would store it now
    assert done.returncode == 0, done.stderr
    assert "1 forgotten on the files store since, removed" in done.stderr.splitlines()[0]
    with psycopg.connect(pg_database.owner_url) as conn:
        body, turns = conn.execute(
            "SELECT body, turns FROM conversations WHERE user_hash = %s "
            "AND conversation_id = 'c-keep'",
            (ALICE_HASH,),
        ).fetchone()
    assert turns == 1
    assert [json.loads(line) for line in body.splitlines()] == [{**later, "seq": 0}]


async def test_a_second_import_never_brings_back_the_audit_an_erase_on_postgres_removed(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path
) -> None:
    # given an import (bob's two recalls in the audit), then bob erased on PostgreSQL
    data = files_copy(files_store, tmp_path / "files")
    assert run("import", pg_database.owner_url, str(data)).returncode == 0
    assert len(rows_of(pg_database.owner_url, BOB_HASH, "audit")["audit"]) == 2
    with replica(tmp_path / "replica", pg_database).start() as served:
        assert served.post({"user": "bob"}, route="/erase")[0] == 200
        # when the files store, which still holds his audit, is imported again
        done = run("import", pg_database.owner_url, str(data))
        assert done.returncode == 0, done.stderr
        # then his queries stay erased, and the import says it left them out
        assert rows_of(pg_database.owner_url, BOB_HASH, "audit") == {"audit": []}
        assert as_user(served, "bob", "/api/me/audit")["entries"] == []
        assert served.stored_turns("bob", "c-bob") is None
        assert done.stderr.strip().splitlines()[1] == (
            f"user 2/2 {BOB_HASH}: 0 conversations (1 forgotten there since, left out, "
            "2 audit lines from before an erase, left out)"
        )


# --- export writes only where it means to (review issue 32, item 10) ----------------------------


def test_export_never_writes_through_a_link_planted_in_its_directory(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path
) -> None:
    # given an existing directory of the caller's, open to others (0755), where links wait at
    # the temporary name export used to write through and at a file's own name
    assert run("import", pg_database.owner_url, str(files_store)).returncode == 0
    out, elsewhere = tmp_path / "alice-export", tmp_path / "elsewhere"
    out.mkdir()
    out.chmod(0o755)
    elsewhere.mkdir()
    victims = {name: elsewhere / name for name in ("authorized_keys", "profile")}
    for victim in victims.values():
        victim.write_text("untouched\n")
    (out / ".c-keep.export.tmp").symlink_to(victims["authorized_keys"])
    (out / "c-also.funes.jsonl").symlink_to(victims["profile"])
    # when alice's conversations are exported into it
    done = run("export", pg_database.app_url, "--user", "alice", "--out", str(out))
    # then nothing is written through either link, the files are new files of their own, and
    # the directory is tightened to 0700
    assert done.returncode == 0, done.stderr
    assert {victim.read_text() for victim in victims.values()} == {"untouched\n"}
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    written = {p.name: p for p in out.iterdir() if p.name.endswith(".funes.jsonl")}
    assert not any(p.is_symlink() for p in written.values())
    assert {name: p.read_bytes() for name, p in written.items()} == sources(files_store, ALICE_HASH)
    assert {stat.S_IMODE(p.stat().st_mode) for p in written.values()} == {0o600}
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [
        ".c-keep.export.tmp"  # the planted link, left alone; no temporary file left behind
    ]


def test_export_creates_its_temporary_file_new_and_never_through_a_link(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given the temporary name export will take (its random part made known), where a link waits
    assert run("import", pg_database.owner_url, str(files_store)).returncode == 0
    monkeypatch.setattr(transfer.uuid, "uuid4", lambda: uuid.UUID(int=7))
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.write_text("untouched\n")
    out.mkdir(0o700)
    (out / f".c-also.funes.jsonl.{uuid.UUID(int=7).hex}.tmp").symlink_to(victim)
    # when alice's conversations are exported there, then the file is refused, not written
    with pytest.raises(FileExistsError):
        asyncio.run(transfer.export_user(pg_database.app_url, "alice", out))
    assert victim.read_text() == "untouched\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user needs root")
def test_export_refuses_a_directory_of_another_user_and_writes_nothing(
    files_store: Path, pg_database: PgDatabase, tmp_path: Path
) -> None:
    assert run("import", pg_database.owner_url, str(files_store)).returncode == 0
    out = tmp_path / "theirs"
    out.mkdir(0o777)
    os.chown(out, 65534, 65534)
    done = run("export", pg_database.app_url, "--user", "alice", "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"recall-server export: {out}: owned by another user (uid 65534): export into a "
        "directory of your own"
    )
    assert list(out.iterdir()) == []
