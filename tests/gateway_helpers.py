"""What the gateway adapters' tests share: the adapters loaded as their gateways load them, and
stand-ins for a recall-server that is down, stalled or refusing."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
LITELLM_DIR = ROOT / "integrations" / "litellm"
OPEN_WEBUI_FILTER = ROOT / "integrations" / "open_webui" / "recall_filter.py"


def load_litellm_callback() -> ModuleType:
    """recall_litellm as LiteLLM imports it: a top-level module beside recall_forward."""
    if str(LITELLM_DIR) not in sys.path:
        sys.path.insert(0, str(LITELLM_DIR))
    import recall_litellm

    return recall_litellm


def load_forward() -> ModuleType:
    load_litellm_callback()
    import recall_forward

    return recall_forward


def load_open_webui_filter() -> ModuleType:
    """The pasted file as a module of its own (Open WebUI executes the pasted text)."""
    spec = importlib.util.spec_from_file_location("pasted_recall_filter", OPEN_WEBUI_FILTER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def stalled_server() -> Iterator[str]:
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def closed_port_url() -> str:
    """A loopback URL where nothing listens: connection refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


class CountingServer:
    """An HTTP server answering every POST with one status; it counts the requests."""

    def __init__(self, status: int) -> None:
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                counter.requests += 1
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_: object) -> None:
                pass

        self.requests = 0
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> CountingServer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.http.shutdown()
        self.http.server_close()
