"""A stand-in for the funes binary, faithful to docs/CONTRACTS.md (the funes contract).

The real binary and its models cannot be downloaded here, so the tests run this instead. It
honours what the server relies on: FUNES_HOME picks the memory (`<home>/memory` exists once
indexed), `index --yes <dir>` walks *.jsonl recursively and rejects a whole file on any format
violation, one writer per memory (a second gets "another funes memory operation is in
progress"), chunk ids from session, turn, block and split (append-only: an edited turn is
ignored), `recall -k K --candidates C -- <query>` prints the agent format with `→ get` hint
lines and neighbour lines, and `no results` when nothing matches.

For the tests it also records every call (argv, environment, pid, times) in `calls.jsonl` next
to itself, including the end of a call killed by SIGTERM, and obeys `control.json` next to
itself: {"mode": "normal" | "sleep" | "fail" | "empty" | "big" | "huge", "sleep": seconds,
"index_sleep": seconds, "index_write_sleep": seconds (between reading the sources and writing
the memory, as embedding takes), "index_gate" | "write_gate" | "recall_gate": a file path (an
index run waits for it to exist before reading the sources, or before writing the memory; a
recall after reading the memory, before answering: the test opens the gate when it chooses),
"index_fail": bool, "spawn_child": bool, "huge_bytes": int (stdout size in mode huge), "error":
str (the failure message instead of the usual one; "{query}" and "{home}" are filled in)}; it
records "read" once an index run has read the sources. The control file sits beside the script,
not in the environment, because the server clears the environment.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOCKED = "another funes memory operation is in progress"

REQUIRED = {"session_id": str, "turn_uuid": str, "seq": int, "ts": str, "role": str,
            "harness": str, "blocks": list}  # fmt: skip
OPTIONAL = {"format": int, "cwd": str, "parent_uuid": str}
BLOCK_TYPES = {"text", "thinking", "tool_use", "tool_result"}
BLOCK_FIELDS = {"block_type", "text", "tool_name", "tool_use_id"}
UTC_TS = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z")
HARNESS = re.compile(r"[a-z0-9_-]+")
SPLIT = 1200  # funes splits long text in pieces of about this many characters


def validate_lines(lines: list[str]) -> str | None:
    """Why funes would reject this file, or None when it accepts it (format 1)."""
    seen: set[str] = set()
    for number, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            turn = json.loads(raw)
        except ValueError:
            return f"line {number + 1}: not JSON"
        if not isinstance(turn, dict):
            return f"line {number + 1}: not an object"
        unknown = set(turn) - set(REQUIRED) - set(OPTIONAL)
        if unknown:
            return f"line {number + 1}: unknown field {sorted(unknown)[0]}"
        for field, kind in REQUIRED.items():
            if field not in turn:
                return f"line {number + 1}: missing field {field}"
            value = turn[field]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                return f"line {number + 1}: {field} has the wrong type"
        for field, kind in OPTIONAL.items():
            if field in turn and not isinstance(turn[field], kind):
                return f"line {number + 1}: {field} has the wrong type"
        if turn.get("format", 1) != 1:
            return f"line {number + 1}: unsupported format"
        if turn["seq"] != number:
            return f"line {number + 1}: seq is not dense from 0"
        if not UTC_TS.fullmatch(turn["ts"]):
            return f"line {number + 1}: ts is not RFC 3339 UTC with Z"
        if ":" in turn["session_id"] or ":" in turn["turn_uuid"]:
            return f"line {number + 1}: ':' in session_id or turn_uuid"
        if turn["turn_uuid"] in seen:
            return f"line {number + 1}: duplicate turn_uuid"
        seen.add(turn["turn_uuid"])
        if not HARNESS.fullmatch(turn["harness"]):
            return f"line {number + 1}: harness outside [a-z0-9_-]"
        for block in turn["blocks"]:
            if not isinstance(block, dict) or set(block) - BLOCK_FIELDS:
                return f"line {number + 1}: bad block"
            if block.get("block_type") not in BLOCK_TYPES:
                return f"line {number + 1}: bad block_type"
            if not isinstance(block.get("text"), str):
                return f"line {number + 1}: block text is not a string"
    return None


def validate_file(path: Path) -> str | None:
    return validate_lines(path.read_text(encoding="utf-8").splitlines())


def _control() -> dict[str, Any]:
    try:
        return json.loads((HERE / "control.json").read_text())
    except (OSError, ValueError):
        return {}


def _record(event: dict[str, Any]) -> None:
    line = json.dumps(event) + "\n"
    fd = os.open(HERE / "calls.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # one O_APPEND write a line, so concurrent calls never mix their lines
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _wait_for_gate(gate: str | None) -> None:
    while gate and not Path(gate).exists():
        time.sleep(0.02)


def _chunk_id(session: str, turn: str, block: int, split: int) -> str:
    return hashlib.sha1(f"{session}:{turn}:{block}:{split}".encode()).hexdigest()[:16]


def cmd_index(args: list[str], home: Path, control: dict[str, Any]) -> int:
    if args[:1] == ["--check"]:
        target = Path(args[1])
        files = [target] if target.is_file() else sorted(target.rglob("*.jsonl"))
        bad = [(f, why) for f in files if (why := validate_file(f))]
        for f, why in bad:
            print(f"rejected {f.name}: {why}", file=sys.stderr)
        return 1 if bad else 0
    if args[:1] != ["--yes"] or len(args) != 2:
        print("usage: funes index --yes <dir>", file=sys.stderr)
        return 2
    home.mkdir(parents=True, exist_ok=True)
    lock = open(home / ".lock", "w")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"error: {LOCKED}", file=sys.stderr)
        return 1
    time.sleep(float(control.get("index_sleep", 0)))
    _wait_for_gate(control.get("index_gate"))
    if control.get("index_fail"):
        print(_error(control, "error: failed to open the Lance store", "", home), file=sys.stderr)
        return 1
    memory = home / "memory"
    memory.mkdir(exist_ok=True)
    store_path = memory / "chunks.json"
    chunks: dict[str, dict[str, Any]] = (
        json.loads(store_path.read_text()) if store_path.exists() else {}
    )
    rejected = 0
    for path in sorted(Path(args[1]).rglob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if why := validate_lines(lines):
            print(f"rejected {path.name}: {why}", file=sys.stderr)
            rejected += 1
            continue
        for line in filter(str.strip, lines):
            turn = json.loads(line)
            for b, block in enumerate(turn["blocks"]):
                text = block["text"]
                pieces = [text[i : i + SPLIT] for i in range(0, max(len(text), 1), SPLIT)]
                for s, piece in enumerate(pieces):
                    cid = _chunk_id(turn["session_id"], turn["turn_uuid"], b, s)
                    chunks.setdefault(cid, {  # append-only: a known id keeps its first text
                        "session_id": turn["session_id"], "turn_uuid": turn["turn_uuid"],
                        "seq": turn["seq"], "ts": turn["ts"], "role": turn["role"],
                        "harness": turn["harness"], "block_type": block["block_type"],
                        "text": piece,
                    })  # fmt: skip
    _record({"event": "read", "argv": ["index"], "pid": os.getpid(), "t": time.time()})
    time.sleep(float(control.get("index_write_sleep", 0)))  # embedding: read, then written
    _wait_for_gate(control.get("write_gate"))
    tmp = store_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(chunks))
    tmp.replace(store_path)
    (home / "state.json").write_text(json.dumps({"chunks": len(chunks)}))
    return 1 if rejected else 0


def _terms(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", text.lower()))


def cmd_recall(args: list[str], home: Path, control: dict[str, Any]) -> int:
    k, candidates, query_words = 8, 30, []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            query_words = args[i + 1 :]
            break
        if arg in ("-k", "--candidates", "--half-life", "--neighbors"):
            value = int(args[i + 1])
            k = value if arg == "-k" else k
            candidates = value if arg == "--candidates" else candidates
            i += 2
            continue
        if arg.startswith("-"):
            print(f"error: unexpected argument '{arg}'", file=sys.stderr)
            return 2
        query_words.append(arg)
        i += 1
    store_path = home / "memory" / "chunks.json"
    if not store_path.exists():
        print(f"error: no memory at {home}", file=sys.stderr)
        return 1
    mode = control.get("mode", "normal")
    if mode == "fail":
        usual = "error: model bge-small-en-v1.5 not found in HF_HOME (offline)"
        print(_error(control, usual, " ".join(query_words), home), file=sys.stderr)
        return 1
    if mode == "sleep":
        if control.get("spawn_child"):
            child = subprocess.Popen(["sleep", "300"])  # same process group: must die with us
            _record({"event": "child", "pid": child.pid})
        time.sleep(float(control.get("sleep", 30)))
    if mode == "empty":
        return 0
    chunks = list(json.loads(store_path.read_text()).values())
    _wait_for_gate(control.get("recall_gate"))  # the memory is read: it answers from what it read
    if control.get("fail_after_read"):  # it read the memory, then failed before answering
        print(_error(control, "error: recall failed", " ".join(query_words), home), file=sys.stderr)
        return 1
    wanted = _terms(" ".join(query_words))
    scored = [(len(wanted & _terms(c["text"])), c) for c in chunks]
    hits = [c for score, c in sorted(scored, key=lambda x: -x[0]) if score > 0][:candidates][:k]
    if mode == "big":
        hits = (hits or chunks[:1]) * 40
    if mode == "huge":  # a runaway output: far more than any reader should keep
        line = ("filler " * 18 + "\n").encode()
        for _ in range(int(control.get("huge_bytes", 100_000_000)) // len(line)):
            sys.stdout.buffer.write(line)
        sys.stdout.flush()
    if not hits:
        print("no results")
        return 0
    by_turn = {(c["session_id"], c["seq"]): c for c in chunks}
    for hit in hits:
        print(f"[{hit['ts']}] {hit['harness']} /work/{hit['session_id'][:8]} "
              f"{hit['block_type']}  score=0.500")  # fmt: skip
        print(f"  → get {hit['session_id']} {hit['turn_uuid']} --memory {home / 'memory'}")
        print(hit["text"])
        for seq in (hit["seq"] - 1, hit["seq"] + 1):
            if near := by_turn.get((hit["session_id"], seq)):
                print(f"  ~ [{near['role']} {near['block_type']} seq{seq}] {near['text'][:160]}")
        print("---")
    return 0


def _error(control: dict[str, Any], usual: str, query: str, home: Path) -> str:
    return str(control.get("error", usual)).replace("{query}", query).replace("{home}", str(home))


def main() -> int:
    started = time.time()
    args = sys.argv[1:]

    def killed(signum: int, _: Any) -> None:  # killed by the server: its end is still recorded
        _record({"event": "end", "argv": args[:1], "pid": os.getpid(), "t": time.time(),
                 "signal": signum})  # fmt: skip
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, killed)
    home_env = os.environ.get("FUNES_HOME")
    _record({"event": "start", "argv": args, "env": dict(os.environ), "pid": os.getpid(),
             "pgid": os.getpgid(0), "t": started})  # fmt: skip
    control = _control()
    home = Path(home_env) if home_env else Path.home() / ".funes"
    try:
        if args[:1] == ["index"]:
            return cmd_index(args[1:], home, control)
        if args[:1] == ["recall"]:
            return cmd_recall(args[1:], home, control)
        print(f"error: unknown command {args[:1]}", file=sys.stderr)
        return 2
    finally:
        _record({"event": "end", "argv": args[:1], "pid": os.getpid(), "t": time.time()})


if __name__ == "__main__":
    sys.exit(main())
