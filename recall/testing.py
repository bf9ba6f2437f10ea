"""recall-server as a child process on a free loopback port: for tests, benchmarks and demo runs.

Started exactly as an operator starts it (`python recall_server.py` with environment settings),
so whatever uses it exercises the real HTTP server, the real MCP transport and real tokens.
`make_server` is the one way tests and the benchmark build one: generated key and tokens.
"""

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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastmcp import Client

from recall.conversations import user_dir_name
from recall.scheduler import needs_index

ROOT = Path(__file__).resolve().parent.parent
# The host's OpenBLAS settings travel with the child: on some processors older OpenBLAS builds
# compute wrong results or crash without them.
# XDG_CACHE_HOME: where the embedder's derived int8 graph is cached (derived once, not per
# server); EMBED_COMPUTE: so that the benchmarks (and the tests) can run on the int8 graph.
PASSED_THROUGH = (
    "PATH",
    "LANG",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "XDG_CACHE_HOME",
    "EMBED_COMPUTE",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalServer:
    data_dir: Path
    env: dict[str, str]  # the settings, e.g. {"INGEST_KEY": ..., "ENGINE": "embedded"}
    tokens: dict[str, str]  # user -> bearer token
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def create(
        cls, data_dir: Path, log_path: Path, tokens: dict[str, str], **settings: str
    ) -> LocalServer:
        env = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
        env.update(
            HOME=str(log_path.parent),
            HOST="127.0.0.1",
            PORT=str(free_port()),
            DATA_DIR=str(data_dir),
            **settings,
        )
        return cls(data_dir=data_dir, env=env, tokens=tokens, log_path=log_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['PORT']}"

    @property
    def ingest_key(self) -> str:
        return self.env["INGEST_KEY"]

    def start(self, timeout: float = 60) -> LocalServer:
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

    def replica(self, log_name: str) -> LocalServer:
        """Another server (not yet started) with these settings, key and tokens on a port of its
        own: with STORE=postgres, a second replica of the same service."""
        env = {**self.env, "PORT": str(free_port())}
        return LocalServer(self.data_dir, env, self.tokens, self.log_path.with_name(log_name))

    @property
    def store(self) -> str:
        return self.env.get("STORE", "files")

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def wait_indexed(self, *users: str, timeout: float = 180) -> None:
        """Until no index run lags behind these users' sources (the server's own marker; with
        STORE=postgres, until no user of the database has an index run due)."""
        engine = self.health()["engine"]
        deadline = time.monotonic() + timeout

        def lagging() -> bool:
            if self.store == "postgres":
                return self.health()["indexing"] != 0
            return any(needs_index(self.home(user), engine) for user in users)

        while lagging():
            if time.monotonic() > deadline:
                raise RuntimeError(f"index not ready after {timeout:.0f}s:\n{self.log()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as response:
            return json.loads(response.read())

    def post(
        self,
        body: Any,
        key: str | None = "default",
        raw: bytes | None = None,
        route: str = "/turns",
    ) -> tuple[int, dict[str, Any]]:
        """POST /turns (or another ingest-key route) as the gateway does; (status, JSON answer)."""
        data = raw if raw is not None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{route}", data=data, method="POST")
        request.add_header("content-type", "application/json")
        if key is not None:
            request.add_header("x-ingest-key", self.ingest_key if key == "default" else key)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    async def recall(self, user: str, query: str) -> str:
        """One tool call in its own MCP session, with the user's bearer token."""
        async with Client(f"{self.url}/mcp", auth=self.tokens[user]) as client:
            result = await client.call_tool("recall_my_conversations", {"query": query})
            return result.content[0].text  # type: ignore[union-attr]

    def home(self, user: str) -> Path:
        return self.data_dir / user_dir_name(user)


def make_server(
    workdir: Path,
    *,
    users: Iterable[str] = ("alice", "bob"),
    log_name: str = "server.log",
    **settings: str,
) -> LocalServer:
    """A server (not yet started) with its data in ``workdir/data``, a generated ingest key and a
    generated bearer token per user (``workdir/tokens.json``); ``settings`` are environment
    variables that add to or override those."""
    tokens = {user: secrets.token_urlsafe(24) for user in users}
    tokens_file = workdir / "tokens.json"
    tokens_file.write_text(json.dumps({token: user for user, token in tokens.items()}))
    defaults = {"INGEST_KEY": secrets.token_hex(16), "AUTH_TOKENS_FILE": str(tokens_file)}
    return LocalServer.create(
        workdir / "data", workdir / log_name, tokens, **{**defaults, **settings}
    )
