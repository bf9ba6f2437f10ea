"""Everything the server and the backfill command create under DATA_DIR is the owner's only:
files 0600, directories 0700, whatever the umask they were started with."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, conversation, make_server


def loose(data_dir: Path) -> list[str]:
    """Each path under DATA_DIR (itself included) that is not a 0600 file or a 0700 directory."""
    found = []
    for path in [data_dir, *data_dir.rglob("*")]:
        mode = path.lstat().st_mode
        wanted = 0o700 if stat.S_ISDIR(mode) else 0o600
        if stat.S_IMODE(mode) != wanted:
            found.append(f"{stat.S_IMODE(mode):o} {path.relative_to(data_dir.parent)}")
    return found


async def test_everything_under_data_dir_is_owner_only(tmp_path: Path) -> None:
    # Given the usual umask, which leaves new files readable by everyone
    usual = os.umask(0o022)
    try:
        server = make_server(tmp_path, ENGINE="embedded", INDEX_DEBOUNCE="0.1")
        # When the server stores, indexes (embedded engine), recalls, forgets, erases and lists
        # receipts
        with server.start():
            for body in (
                conversation("alice", "kept", "Ticket MT-4471 is open for K-2.", "Noted."),
                conversation("alice", "gone", "The vault code word is zephyrquartz.", "Ok."),
                conversation("bob", "b1", "Motor P-7 has bearing noise.", "Logged."),
            ):
                assert server.post(body)[0] == 202
            server.wait_indexed("alice", "bob")
            assert "MT-4471" in await server.recall("alice", "MT-4471 K-2")
            forgot = server.post({"user": "alice", "conversation_id": "gone"}, route="/forget")
            assert forgot[0] == 200
            assert server.post({"user": "bob"}, route="/erase")[0] == 200
            assert server.post({"user": "alice"}, route="/receipts")[0] == 200
        # and the backfill command imports a history into the same DATA_DIR
        source = tmp_path / "history.jsonl"
        body = conversation("carol", "c1", "The pallet count is 480.", "Counted.")
        source.write_text(json.dumps(body) + "\n")
        backfill = subprocess.run(
            [sys.executable, str(ROOT / "recall_server.py"), "backfill", str(source)],
            env=server.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert backfill.returncode == 0, backfill.stderr
    finally:
        os.umask(usual)

    # Then every file under DATA_DIR is 0600 and every directory 0700
    data_dir = server.data_dir
    assert loose(data_dir) == []
    kinds = {p.name for p in data_dir.rglob("*")}
    assert {"recall.db", "tombstones.json", "tombstone.key", "audit.jsonl"} <= kinds  # all made
