"""The seeded demo in a real server, and the system Chromium that shows its memory page: shared by
the page's browser test (tests/test_memory_page.py) and its screenshots (docs/screenshots.py).

The browser is Debian's `chromium`, driven by Playwright with `executable_path`: Playwright's own
browser download cannot be used here, so nothing ever runs `playwright install`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devtools.testing import ROOT, LocalServer, make_server

DEMO_TOKENS = ROOT / "examples" / "tokens.json"
SEEDER = ROOT / "seeds" / "seed.py"
CHROMIUM = Path("/usr/bin/chromium")
# Headless, nothing fetched in the background, no sandbox (tests run as root in CI).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def seeded_demo(workdir: Path, timeout: float = 180) -> LocalServer:
    """A started server on the embedded engine with the demo tokens (examples/tokens.json),
    seeded by seeds/seed.py as the gateway would, its index caught up. Stop it when done."""
    server = make_server(
        workdir, ENGINE="embedded", INDEX_DEBOUNCE="0.2", AUTH_TOKENS_FILE=str(DEMO_TOKENS)
    )
    server.tokens = {user: token for token, user in json.loads(DEMO_TOKENS.read_text()).items()}
    server.start()
    try:
        seeded = subprocess.run(
            [sys.executable, str(SEEDER), "--url", server.url],
            env={**os.environ, "INGEST_KEY": server.ingest_key},  # the key stays out of argv
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if seeded.returncode != 0:
            raise RuntimeError(f"seeding failed: {seeded.stderr}")
        server.wait_indexed(*server.tokens, timeout=timeout)
    except BaseException:
        server.stop()
        raise
    return server
