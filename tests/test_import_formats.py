"""Chat exports read into POST /turns conversations, without a server: each format's fixture (in
tests/chat_exports/, written for these tests in each format's shape) gives its conversations,
with the export's ids, times, roles and text, the shown branch only and what was skipped
counted; a hostile or unusable export is refused whole with an error naming the problem."""

from __future__ import annotations

import json
import stat
import zipfile
from pathlib import Path
from typing import Any

import pytest

from recall.domain.conversation import Conversation, Limits
from recall.importing.errors import ImportRefused
from recall.importing.importer import Summary, conversations, plan
from recall.importing.registry import FORMATS

EXPORTS = Path(__file__).resolve().parent / "chat_exports"
MB = 1024 * 1024
FIXTURES = {
    "chatgpt": "chatgpt-conversations.json",
    "claude": "claude-conversations.json",
    "claude-code": "claude-code-session.jsonl",
    "codex": "codex-rollout.jsonl",
    "open-webui": "open-webui-export.json",
}


def read(fmt: str, path: Path, max_bytes: int = 10 * MB) -> tuple[list[Conversation], Summary]:
    summary = Summary(fmt)
    found = list(conversations(path, FORMATS[fmt], "user-hash", Limits(), max_bytes, summary))
    return found, summary


def texts(conversation: Conversation) -> list[str]:
    return [line["blocks"][0]["text"] for line in conversation.lines]


@pytest.mark.parametrize(
    ("fmt", "conversation_id", "fact", "first_ts", "skip"),
    [
        (
            "chatgpt",
            "chatgpt-6a1f0c2e-4b7d-4e8a-9c61-2f0d3b5a7e11",
            "valve V-17 for 12 minutes at 06:40",
            "2025-10-09T08:53:30Z",
            "image or file part",
        ),
        (
            "claude",
            "claude-3c0e8f52-1d2b-4a9e-b7f4-6e5d4c3b2a10",
            "LBL-COLD-3 by dock 9",
            "2026-09-14T08:00:10Z",
            "tool_use block",
        ),
        (
            "claude-code",
            "claude-code-5e2d1c0b-9a8f-4e7d-a6c5-b4a3f2e1d0c9",
            "Sunday at 03:15",
            "2026-10-01T07:00:00Z",
            "tool_result block",
        ),
        (
            "codex",
            "codex-7f6e5d4c-3b2a-4190-8f7e-6d5c4b3a2918",
            "listens on port 7443",
            "2026-10-02T12:00:02Z",
            "harness context",
        ),
        (
            "open-webui",
            "open-webui-b4c3d2e1-f0a9-4b8c-9d7e-6f5a4b3c2d1e",
            "46 sourdough loaves",
            "2025-10-08T05:06:50Z",
            "file",
        ),
    ],
)
def test_each_format_gives_its_conversation_under_the_exports_own_id_and_time(
    fmt: str, conversation_id: str, fact: str, first_ts: str, skip: str
) -> None:
    found, summary = read(fmt, EXPORTS / FIXTURES[fmt])
    conversation = next(c for c in found if c.conversation_id == conversation_id)
    assert any(fact in text for text in texts(conversation))
    assert conversation.lines[0]["ts"] == first_ts
    assert conversation.lines[0]["role"] == "user"
    assert summary.skipped_turns[skip] >= 1
    # a second read names the same conversations, byte for byte: a re-import is a no-op
    again, _ = read(fmt, EXPORTS / FIXTURES[fmt])
    assert [c.to_jsonl() for c in again] == [c.to_jsonl() for c in found]


def test_chatgpt_keeps_only_the_branch_that_ends_at_the_current_node() -> None:
    found, summary = read("chatgpt", EXPORTS / FIXTURES["chatgpt"])
    shown = texts(found[0])
    assert len(shown) == 2 and "12 minutes" in shown[1]
    assert not any("every hour" in text for text in shown)  # the regenerated answer
    assert summary.skipped_turns["hidden message"] == 1
    assert summary.skipped_turns["code content"] == 1


def test_an_answer_after_a_call_of_our_recall_tool_is_marked_recalled() -> None:
    found, _ = read("claude-code", EXPORTS / FIXTURES["claude-code"])
    kinds = {line["turn_uuid"]: line["blocks"][0]["block_type"] for line in found[0].lines}
    assert kinds == {"cc-1": "text", "cc-4": "tool_result", "cc-5": "text", "cc-6": "text"}


def test_a_conversation_without_text_is_skipped_and_counted() -> None:
    found, summary = read("claude", EXPORTS / FIXTURES["claude"])
    assert len(found) == 1 and summary.conversations == 2
    assert summary.skipped == {"no text messages": 1}


def test_credentials_in_an_export_are_redacted_before_anything_is_stored(tmp_path: Path) -> None:
    records = json.loads((EXPORTS / FIXTURES["claude"]).read_text())
    key = "AKIA" + "Q7RT2VB6NM4XZP3L"  # shaped like an AWS access key id, made up here
    records[0]["chat_messages"][0]["content"][0]["text"] = f"my key is {key} ok"
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(records))
    found, summary = read("claude", path)
    assert key not in found[0].to_jsonl() and "[REDACTED:" in texts(found[0])[0]
    assert sum(summary.redacted.values()) == 1


# --- refused whole: nothing of these is ever handed on ------------------------------------------


def refused(fmt: str, path: Path, max_bytes: int = 10 * MB) -> ImportRefused:
    with pytest.raises(ImportRefused) as caught:
        plan(path, FORMATS[fmt], "user-hash", Limits(), max_bytes)
    return caught.value


def chatgpt_records() -> list[dict[str, Any]]:
    return json.loads((EXPORTS / FIXTURES["chatgpt"]).read_text())


def test_a_message_tree_with_a_cycle_is_refused(tmp_path: Path) -> None:
    records = chatgpt_records()
    records[1]["mapping"]["c-root"]["parent"] = "c-answer"  # the root's parent is the leaf
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(records))
    error = refused("chatgpt", path)
    assert "conversations.json #2: the message tree has a cycle" in str(error)


def test_malformed_json_is_refused_without_quoting_the_text(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(chatgpt_records())[:-40] + '"unfinished secret words')
    error = refused("chatgpt", path)
    assert "conversations.json: not valid JSON" in str(error)
    assert "secret" not in str(error) and "torque" not in str(error).lower()


def test_a_session_file_with_a_broken_line_is_refused_by_line(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    lines = (EXPORTS / FIXTURES["claude-code"]).read_text().splitlines()
    path.write_text("\n".join([*lines[:3], "{not json", *lines[3:]]))
    assert str(refused("claude-code", path)) == "session.jsonl line 4: not valid JSON"


@pytest.mark.parametrize(
    ("named", "fixture", "guess"),
    [
        ("chatgpt", "claude", "claude"),
        ("claude", "chatgpt", "chatgpt"),
        ("codex", "claude-code", "claude-code"),
        ("claude-code", "codex", "codex"),
        ("chatgpt", "open-webui", "open-webui"),
    ],
)
def test_another_format_than_the_one_named_is_refused_with_a_hint(
    tmp_path: Path, named: str, fixture: str, guess: str
) -> None:
    error = refused(named, EXPORTS / FIXTURES[fixture])
    assert f"not a {FORMATS[named].label} export; it looks like --format {guess}" in str(error)


def test_a_zip_without_the_formats_files_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "export.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(EXPORTS / FIXTURES["chatgpt"], "conversations.json")
    assert "holds no Codex CLI chats" in str(refused("codex", path))


def zipped(path: Path, *members: tuple[zipfile.ZipInfo | str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for info, data in members:
            archive.writestr(info, data)
    return path


GOOD = ("conversations.json", (EXPORTS / FIXTURES["chatgpt"]).read_bytes())


def symlink_member() -> zipfile.ZipInfo:
    info = zipfile.ZipInfo("link.json")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


@pytest.mark.parametrize(
    ("member", "message"),
    [
        ("../../etc/cron.d/evil.json", "../../etc/cron.d/evil.json: a path that climbs out"),
        ("/etc/passwd.json", "/etc/passwd.json: a path that climbs out"),
        ("export/..\\..\\up.json", "a path that climbs out"),
        (symlink_member(), "link.json: a symbolic link in the archive"),
    ],
)
def test_a_hostile_member_path_refuses_the_whole_archive(
    tmp_path: Path, member: zipfile.ZipInfo | str, message: str
) -> None:
    path = zipped(tmp_path / "export.zip", GOOD, (member, b"[]"))
    assert message in str(refused("chatgpt", path))


def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    path = zipped(tmp_path / "export.zip", ("images/big.png", bytes(8 * MB)), GOOD)
    assert path.stat().st_size < 100_000
    error = refused("chatgpt", path)
    assert "images/big.png: inflates" in str(error) and "zip bomb" in str(error)
    assert error.status == 413


def test_an_export_larger_than_the_limit_is_refused_by_its_size(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    with open(path, "wb") as handle:  # 2 GB, sparse: nothing is read
        handle.truncate(2 * 1024 * MB)
    error = refused("chatgpt", path, max_bytes=1024 * MB)
    assert "2147483648 bytes, more than IMPORT_MAX_BYTES (1073741824)" in str(error)


def test_chats_that_inflate_past_the_limit_are_refused(tmp_path: Path) -> None:
    padded = GOOD[1].replace(b"[", b"[" + b" " * 300_000, 1)
    path = zipped(tmp_path / "export.zip", ("conversations.json", padded))
    error = refused("chatgpt", path, max_bytes=200_000)
    assert "inflate to more than IMPORT_MAX_BYTES (200000)" in str(error)
