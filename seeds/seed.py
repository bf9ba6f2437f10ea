"""Play the chat gateway: post every seed conversation to a running recall server.

Production posts the whole conversation so far after each finished turn (turn 1, turns 1-2, ...),
which makes the write idempotent. The seeder does exactly the same, so a seeded memory is built
the way a real one is.

    python seeds/seed.py --url http://127.0.0.1:8000 --key KEY [--dir seeds] [--wait 60]

--wait N first waits up to N seconds for the server's /healthz, so the seeder can be started
together with the server; then, once everything is posted, up to N seconds more until /healthz
reports no index run due or going on ("indexing": 0), so a search right after finds it all.
A server that was already answering and refuses the key, or another program on the port, is
reported as that: the server just started could not take the port.

The key may also come from the environment (INGEST_KEY). Standard library only, so it runs
anywhere Python does, without the project installed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TIMEOUT = 30.0  # seconds per post; /turns only writes a file, so this is generous
# What a 410 means for the demo: erased or forgotten turns never come back, by design.
START_OVER = (
    "the server never stores forgotten or erased turns again; to seed the demo from the start, "
    "stop the server, remove its data (rm -rf recall-data) and start it again"
)


class SeedError(Exception):
    """A reason to stop; the message is printed as the one-line error."""


class KeyRefused(SeedError):
    """The server answered 401 to the ingest key."""


def load_conversations(folder: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` body in ``folder``, oldest conversation first (as they happened)."""
    bodies = []
    for path in sorted(folder.glob("*.json")):
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise SeedError(f"{path}: not a readable JSON file ({exc})") from exc
        if not isinstance(body, dict) or not isinstance(body.get("turns"), list):
            raise SeedError(f"{path}: not a POST /turns body (needs a 'turns' list)")
        bodies.append(body)
    if not bodies:
        raise SeedError(f"no *.json conversations in {folder}")
    bodies.sort(key=lambda b: str(b["turns"][0].get("ts", "")) if b["turns"] else "")
    return bodies


def post(url: str, key: str, body: dict[str, Any]) -> None:
    """One POST /turns; anything but 202 Accepted is an error."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode("utf-8"),
        headers={"content-type": "application/json", "x-ingest-key": key},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            status = response.status
            detail = response.read(300).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        status = exc.code
        detail = exc.read(300).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SeedError(f"cannot reach the recall server at {url}: {reason}") from exc
    if status == 401:
        raise KeyRefused(f"the server at {url} refused the ingest key (401): check INGEST_KEY")
    if status != 202:
        one_line = " ".join(detail.split())
        hint = f"; {START_OVER}" if status == 410 else ""
        raise SeedError(f"{url} answered {status} for {body['conversation_id']}: {one_line}{hint}")


def port_held(url: str, what: str) -> SeedError:
    port = urlsplit(url).port or 80
    return SeedError(
        f"{what} at {url}: another program holds port {port}, so a recall server started there "
        "could not take it (its log says the port is already in use); stop that program first"
    )


def wait_until_up(base_url: str, seconds: float) -> bool:
    """Poll /healthz until a recall server answers, or stop with a SeedError after ``seconds``
    (at once when another program answers there). Whether it was answering at the first poll:
    then it was running before the seeder started."""
    url = base_url.rstrip("/") + "/healthz"
    deadline = time.monotonic() + seconds
    first = True
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                answer = json.loads(response.read())
            if not (isinstance(answer, dict) and answer.get("status") == "ok"):
                raise port_held(url, "something that is not a recall server answers")
            return first
        except urllib.error.HTTPError as exc:  # a recall server's /healthz is 200 (503: busy)
            if exc.code != 503:
                raise port_held(url, f"something answers {exc.code}, not a recall server,") from exc
        except OSError:  # refused while the server starts (URLError is an OSError)
            pass
        except (http.client.HTTPException, ValueError) as exc:  # not HTTP, or not JSON
            raise port_held(url, "something that is not a recall server answers") from exc
        if time.monotonic() > deadline:
            raise SeedError(f"no recall server answered at {url} within {seconds:g}s")
        first = False
        time.sleep(0.25)


def health(url: str) -> dict[str, Any] | None:
    """/healthz's answer, or None while nothing answers there (URLError is an OSError)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            answer = json.loads(response.read()) if response.status == 200 else None
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def wait_until_indexed(base_url: str, seconds: float) -> None:
    """Poll /healthz until no index run is due or going on, or stop with a SeedError."""
    url = base_url.rstrip("/") + "/healthz"
    deadline = time.monotonic() + seconds
    while True:
        answer = health(url)
        # A server without the "indexing" field (an older one) counts as done; null (its
        # database did not say in time) does not.
        if answer is not None and answer.get("indexing", 0) == 0:
            return
        if time.monotonic() > deadline:
            state = "was still indexing" if answer else "stopped answering /healthz"
            raise SeedError(f"the server at {base_url} {state} after {seconds:g}s")
        time.sleep(0.25)


def seed(base_url: str, key: str, folder: Path) -> int:
    """Post every conversation turn by turn; returns the number of posts made."""
    url = base_url.rstrip("/") + "/turns"
    posts = 0
    for body in load_conversations(folder):
        turns = body["turns"]
        for upto in range(1, len(turns) + 1):
            post(url, key, {**body, "turns": turns[:upto]})
            posts += 1
        print(f"{body['user']}: {body['conversation_id']} ({len(turns)} turns)")
    return posts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Post the seed conversations to /turns.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    parser.add_argument("--key", default=os.environ.get("INGEST_KEY"), help="ingest key")
    parser.add_argument(
        "--dir", type=Path, default=Path(__file__).resolve().parent, help="folder of *.json"
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="wait for /healthz first, and for the index runs after posting",
    )
    args = parser.parse_args(argv)
    if not args.key:
        print("seed.py: no ingest key: pass --key or set INGEST_KEY", file=sys.stderr)
        return 2
    try:
        earlier = args.wait > 0 and wait_until_up(args.url, args.wait)
        try:
            posts = seed(args.url, args.key, args.dir)
        except KeyRefused as exc:
            if not earlier:
                raise
            raise SeedError(
                f"a recall server was already running at {args.url} when the seeder started, "
                "and it refuses this INGEST_KEY (401): it is an earlier server, started with "
                "another key, and the one just started could not take its port (its log says "
                "the port is already in use); stop the earlier server (kill its process) and "
                "start again"
            ) from exc
        print(f"posted {posts} times to {args.url.rstrip('/')}/turns")
        if args.wait > 0:
            wait_until_indexed(args.url, args.wait)
            print("indexed: a search finds it all now")
    except SeedError as exc:
        print(f"seed.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
