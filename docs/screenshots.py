"""Regenerate the memory page's screenshots in docs/ (docs/memory-page.md).

    .venv/bin/python docs/screenshots.py

Starts a server with the seeded demo (devtools/demo.py), lets alice's agent search twice (so the
audit has something to show), and photographs the page in Debian's Chromium at a phone's width:
sign-in, the conversation list, one conversation (at its first table), search results (at the
first hit) and the audit. Needs /usr/bin/chromium (apt-get install chromium) and the test extra
(playwright); not run by tests.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # this checkout: devtools/ is not installed

from devtools.demo import CHROMIUM, CHROMIUM_ARGS, seeded_demo  # noqa: E402 - after the path above

VIEWPORT = {"width": 390, "height": 760}  # a phone's width keeps the PNGs small
AGENT_QUERIES = ("N-11 upgrade decision", "MT-4471 owner")


def shoot(page: Page, name: str) -> None:
    path = DOCS / f"memory-{name}.png"
    page.screenshot(path=str(path))
    print(f"{path.relative_to(DOCS.parent)}: {path.stat().st_size // 1024} KB")


def main() -> int:
    if not CHROMIUM.exists():
        print(f"{CHROMIUM} is missing: apt-get install chromium", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as workdir:
        server = seeded_demo(Path(workdir))
        try:
            for query in AGENT_QUERIES:  # what the audit view shows
                asyncio.run(server.recall("alice", query))
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch_persistent_context(
                    str(Path(workdir) / "chromium"),
                    executable_path=str(CHROMIUM),
                    args=CHROMIUM_ARGS,
                    viewport=VIEWPORT,
                )
                page = browser.new_page()
                page.goto(f"{server.url}/memory")
                page.get_by_label("Access token").wait_for()
                shoot(page, "signin")
                page.get_by_label("Access token").fill(server.tokens["alice"])
                page.get_by_role("button", name="Sign in").click()
                page.locator("#conversation-list li").first.wait_for()
                shoot(page, "conversations")
                page.get_by_role("link", name="Some unit arithmetic").click()
                page.locator("#turn-list li").first.wait_for()
                # its first answer, a Markdown table, at the top: the page shows it as a table
                page.locator("#turn-list > li").nth(1).evaluate("turn => turn.scrollIntoView()")
                shoot(page, "conversation")
                page.get_by_role("link", name="Search", exact=True).click()
                page.get_by_label("Search your conversations").fill("N-11 upgrade decision")
                page.get_by_role("button", name="Search", exact=True).click()
                page.locator("#search-results li").first.wait_for()
                # its first hit at the top: who said it, when, in which conversation, around it
                page.locator("#search-status").evaluate("status => status.scrollIntoView()")
                shoot(page, "search")
                page.get_by_role("link", name="What the assistant looked up").click()
                page.locator("#audit-list li").first.wait_for()
                shoot(page, "audit")
                browser.close()
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
