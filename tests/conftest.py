"""Fixtures that build real things: a server process on a free loopback port, a funes stand-in."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

ROOT = Path(__file__).resolve().parent.parent
FAKE_FUNES = Path(__file__).resolve().parent / "fake_funes.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class FakeFunes:
    """The funes stand-in installed as an executable in its own folder."""

    folder: Path

    @property
    def path(self) -> Path:
        return self.folder / "funes"

    def control(self, **settings: Any) -> None:
        (self.folder / "control.json").write_text(json.dumps(settings))

    def calls(self, command: str | None = None) -> list[dict[str, Any]]:
        log = self.folder / "calls.jsonl"
        events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        starts = [e for e in events if e["event"] == "start"]
        return [e for e in starts if command is None or e["argv"][:1] == [command]]

    def events(self) -> list[dict[str, Any]]:
        log = self.folder / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def install_fake_funes(folder: Path) -> FakeFunes:
    folder.mkdir(parents=True)
    script = folder / "funes"
    script.write_text(f"#!{sys.executable}\n" + FAKE_FUNES.read_text())
    script.chmod(0o755)
    return FakeFunes(folder)


@pytest.fixture
def fake_funes(tmp_path: Path) -> FakeFunes:
    return install_fake_funes(tmp_path / "funes-bin")


def turn(role: str, text: str, ts: str = "2026-10-08T09:00:00Z", **extra: Any) -> dict[str, Any]:
    return {"role": role, "text": text, "ts": ts, **extra}


def conversation(user: str, cid: str, *texts: str, day: int = 8) -> dict[str, Any]:
    roles = ["user", "assistant"]
    return {
        "user": user,
        "conversation_id": cid,
        "turns": [
            turn(roles[i % 2], text, f"2026-10-{day:02d}T09:{i:02d}:00Z")
            for i, text in enumerate(texts)
        ],
    }


@dataclass
class Server:
    """recall-server started the way an operator starts it, on a free loopback port."""

    data_dir: Path
    env: dict[str, str]
    tokens: dict[str, str]  # user -> token
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['PORT']}"

    @property
    def ingest_key(self) -> str:
        return self.env["INGEST_KEY"]

    def start(self, timeout: float = 60) -> Server:
        assert self.log_path is not None
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "recall_server.py")],
            env=self.env,
            stdout=open(self.log_path, "ab"),  # noqa: SIM115 - the child owns it
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server did not start:\n{self.log()}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def post(
        self, body: Any, key: str | None = "default", raw: bytes | None = None
    ) -> tuple[int, dict[str, Any]]:
        data = raw if raw is not None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}/turns", data=data, method="POST")
        request.add_header("content-type", "application/json")
        if key is not None:
            request.add_header("x-ingest-key", self.ingest_key if key == "default" else key)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    async def recall(self, user: str, query: str) -> str:
        async with Client(f"{self.url}/mcp", auth=self.tokens[user]) as client:
            result = await client.call_tool("recall_my_conversations", {"query": query})
            return result.content[0].text  # type: ignore[union-attr]

    def home(self, user: str) -> Path:
        from recall.conversations import user_dir_name

        return self.data_dir / user_dir_name(user)


def make_server(tmp_path: Path, **settings: str) -> Server:
    data_dir = tmp_path / "data"
    tokens = {user: secrets.token_urlsafe(24) for user in ("alice", "bob")}
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps({token: user for user, token in tokens.items()}))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "HOST": "127.0.0.1",
        "PORT": str(free_port()),
        "DATA_DIR": str(data_dir),
        "INGEST_KEY": secrets.token_hex(16),
        "AUTH_TOKENS_FILE": str(tokens_file),
        "INDEX_DEBOUNCE": "0.2",
        "LOG_LEVEL": "INFO",
        **settings,
    }
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # this machine's numpy safety settings
        if name in os.environ:
            env[name] = os.environ[name]
    return Server(data_dir=data_dir, env=env, tokens=tokens, log_path=tmp_path / "server.log")


@pytest.fixture
def funes_server(tmp_path: Path, fake_funes: FakeFunes) -> Iterator[Server]:
    """A server on the funes engine, driven through the stand-in."""
    server = make_server(tmp_path, ENGINE="funes", FUNES_BIN=str(fake_funes.path)).start()
    yield server
    server.stop()


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not met in time")


def tree(path: Path) -> list[str]:
    """Everything under a directory, for 'nothing was written' checks."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []
