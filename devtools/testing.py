"""recall-server as a child process on a free loopback port: for tests, benchmarks and demo runs.

Started exactly as an operator starts it (`python recall_server.py` with environment settings),
so whatever uses it exercises the real HTTP server, the real MCP transport and real tokens.
`make_server` is the one way tests and the benchmark build one: generated key and tokens.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastmcp import Client

from recall.domain.conversation import user_dir_name
from recall.files.scheduler import needs_index

ROOT = Path(__file__).resolve().parent.parent
# The host's OpenBLAS settings travel with the child: on some processors older OpenBLAS builds
# compute wrong results or crash without them.
# XDG_CACHE_HOME: where the embedder's derived int8 graph is cached (derived once, not per
# server); EMBED_COMPUTE, EMBED_MODEL: so that the benchmarks (and the tests) can run on the
# int8 graph or the multilingual model.
PASSED_THROUGH = (
    "PATH",
    "LANG",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "XDG_CACHE_HOME",
    "EMBED_COMPUTE",
    "EMBED_MODEL",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on loopback ``port`` (Linux's /proc;
    True where there is no /proc to ask)."""
    try:
        tables = [Path(f"/proc/net/{kind}").read_text() for kind in ("tcp", "tcp6")]
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return not Path("/proc/net/tcp").exists()
    listening = set()
    for line in "".join(tables).splitlines()[1:]:
        fields = line.split()
        # local address "0100007F:1F40" (hex port), state 0A = LISTEN, inode
        if len(fields) > 9 and fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):
            listening.add(f"socket:[{fields[9]}]")
    held = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            held.add(os.readlink(fd))
    return bool(listening & held)


@dataclass
class LocalServer:
    data_dir: Path
    env: dict[str, str]  # the settings, e.g. {"INGEST_KEY": ..., "ENGINE": "embedded"}
    tokens: dict[str, str]  # user -> bearer token
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    # The program that is the server: this checkout's, or another's (a benchmark comparing two
    # versions starts the other from its own checkout and venv: see server_command).
    command: tuple[str, ...] = (sys.executable, str(ROOT / "recall_server.py"))

    @classmethod
    def create(
        cls,
        data_dir: Path,
        log_path: Path,
        tokens: dict[str, str],
        command: tuple[str, ...] | None = None,
        **settings: str,
    ) -> LocalServer:
        env = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
        env.update(
            HOME=str(log_path.parent),
            HOST="127.0.0.1",
            PORT=str(free_port()),
            DATA_DIR=str(data_dir),
            **settings,
        )
        server = cls(data_dir=data_dir, env=env, tokens=tokens, log_path=log_path)
        if command:
            server.command = command
        return server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['PORT']}"

    @property
    def ingest_key(self) -> str:
        return self.env["INGEST_KEY"]

    def start(self, timeout: float = 60) -> LocalServer:
        """Start it and wait for /healthz, answered by this process: a port that another program
        took between free_port() and the bind (other tests, other test workers) makes the server
        exit saying the port "is already in use", and it starts again on another free port."""
        deadline = time.monotonic() + timeout
        while True:
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            self.process = subprocess.Popen(
                list(self.command),
                env=self.env,
                stdout=open(self.log_path, "ab"),  # noqa: SIM115 - the child owns it
                stderr=subprocess.STDOUT,
                cwd=Path(self.command[-1]).parent,
            )
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    if "already in use" not in self.log()[logged:]:
                        raise RuntimeError(f"server exited early:\n{self.log()}")
                    self.env["PORT"] = str(free_port())
                    break
                if self._answers() and listens(self.process.pid, int(self.env["PORT"])):
                    return self
                time.sleep(0.1)
            else:
                raise RuntimeError(f"server did not start:\n{self.log()}")

    def _answers(self) -> bool:
        return answers_healthz(self.url, timeout=1)

    def replica(self, log_name: str) -> LocalServer:
        """Another server (not yet started) with these settings, key and tokens on a port of its
        own: with STORE=postgres, a second replica of the same service."""
        env = {**self.env, "PORT": str(free_port())}
        log_path = self.log_path.with_name(log_name)
        return LocalServer(self.data_dir, env, self.tokens, log_path, command=self.command)

    @property
    def store(self) -> str:
        return self.env.get("STORE", "files")

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def wait_no_index_run(self, timeout: float = 3_600) -> None:
        """Until /healthz counts no index run due or going: a server started on a stored history
        may check it first, and a search meanwhile says "still being indexed" (a benchmark that
        compares answers byte for byte asks only after)."""
        deadline = time.monotonic() + timeout
        while self.health().get("indexing") != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"index runs still due after {timeout:.0f}s")
            time.sleep(0.2)

    def wait_indexed(self, *users: str, timeout: float = 300) -> None:
        """Until no index run lags behind these users' sources (the server's own marker; with
        STORE=postgres, until no user of the database has an index run due). A ceiling, not a
        measurement: index workers run at SCHED_IDLE, so on a busy machine (parallel test
        workers) they get the CPU only when nothing else wants it."""
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
            # A ceiling: a forget or an erase waits for a running index run (SCHED_IDLE, slow on
            # a busy machine) to end
            with urllib.request.urlopen(request, timeout=300) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def stored_turns(self, user: str, conversation_id: str) -> list[dict[str, Any]] | None:
        """A stored conversation's turns (seq, ts, role, text, recalled) as the user's memory
        page reads them, from whichever store; None when there is no such conversation."""
        request = urllib.request.Request(
            f"{self.url}/api/me/conversation",
            data=json.dumps({"conversation_id": conversation_id}).encode(),
            headers={"authorization": f"Bearer {self.tokens[user]}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())["turns"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    async def recall(self, user: str, query: str) -> str:
        """One tool call in its own MCP session, with the user's bearer token."""
        async with Client(f"{self.url}/mcp", auth=self.tokens[user]) as client:
            result = await client.call_tool("recall_my_conversations", {"query": query})
            return result.content[0].text  # type: ignore[union-attr]

    async def read(self, user: str, **arguments: Any) -> str:
        """One call of the read tool (ref, from_turn, to_turn) in its own MCP session."""
        async with Client(f"{self.url}/mcp", auth=self.tokens[user]) as client:
            result = await client.call_tool("read_my_conversation", arguments)
            return result.content[0].text  # type: ignore[union-attr]

    def home(self, user: str) -> Path:
        return self.data_dir / user_dir_name(user)


def make_server(
    workdir: Path,
    *,
    users: Iterable[str] = ("alice", "bob"),
    log_name: str = "server.log",
    command: tuple[str, ...] | None = None,
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
        workdir / "data", workdir / log_name, tokens, command, **{**defaults, **settings}
    )


def server_command(checkout: Path) -> tuple[str, ...]:
    """The server of another checkout, run by its own venv's Python (``checkout/.venv``)."""
    return (str(checkout / ".venv" / "bin" / "python"), str(checkout / "recall_server.py"))


# --- deploy/nginx.conf in front of local replicas (the replicas' tests and benchmark) ----------

NGINX_CONF = ROOT / "deploy" / "nginx.conf"
REPLICA_NAMES = ("replica-1", "replica-2")  # the upstream servers deploy/nginx.conf names
NGINX_TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def nginx_copy(workdir: Path, replicas: list[str], port: int) -> Path:
    """deploy/nginx.conf as it runs here: the replicas at these addresses, listening on this
    loopback port, its temporary files under workdir. Nothing else changes."""
    text = NGINX_CONF.read_text(encoding="utf-8")
    for name, address in zip(REPLICA_NAMES, replicas, strict=True):
        text = text.replace(f"server {name}:8000", f"server {address}")
    text = re.sub(r"listen \d+;", f"listen 127.0.0.1:{port};", text)
    temp = "".join(f"    {kind}_temp_path {workdir}/{kind};\n" for kind in NGINX_TEMP_PATHS)
    config = workdir / "nginx.conf"
    config.write_text(text.replace("http {\n", "http {\n" + temp, 1), encoding="utf-8")
    return config


@dataclass
class Nginx:
    url: str
    access_log: Path
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def running_nginx(workdir: Path, replicas: list[str], port: int | None = None) -> Iterator[Nginx]:
    """Debian's nginx (`apt-get install nginx`) running deploy/nginx.conf in front of these
    replica addresses (host:port) until the block ends."""
    port = port or free_port()
    config = nginx_copy(workdir, replicas, port)
    access_log, error_log = workdir / "access.log", workdir / "error.log"
    daemon = f"daemon off; pid {workdir}/nginx.pid;"
    process = subprocess.Popen(
        ["nginx", "-p", f"{workdir}/", "-c", str(config), "-e", "stderr", "-g", daemon],
        stdout=open(access_log, "wb"),  # noqa: SIM115 - the child owns them
        stderr=open(error_log, "wb"),  # noqa: SIM115
    )
    try:
        deadline = time.monotonic() + 30
        while process.poll() is None and not port_open(port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not listen on {port}")
            time.sleep(0.05)
        if process.poll() is not None:
            raise RuntimeError(f"nginx exited: {error_log.read_text()}")
        yield Nginx(f"http://127.0.0.1:{port}", access_log, process)
    finally:
        process.terminate()
        process.wait(10)


def answers_healthz(url: str, timeout: float = 2) -> bool:
    """A server at ``url`` answers /healthz with 200."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False
