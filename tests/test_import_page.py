""" "Bring your history" in a real browser (Debian's Chromium, headless): dana signs in with her
token, picks ChatGPT and her export's zip, imports it, watches it finish with its summary, sees
the imported chats in her list, and her agent's tool then finds a fact from them; a refused
upload shows the server's error and adds nothing."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_memory_page as memory_page
from conftest import Server, make_server
from test_import_chats import found_within
from test_memory_page import Page, sign_in

pytestmark = memory_page.pytestmark  # skipped where Debian's Chromium is absent
browser = memory_page.browser  # the module's one Chromium
page = memory_page.page  # a fresh context in it at a phone's width, no script error
EXPORTS = Path(__file__).resolve().parent / "chat_exports"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("import-page")
    server = make_server(workdir, ENGINE="embedded", users=("dana",)).start()
    yield server
    server.stop()


def chatgpt_zip(folder: Path) -> Path:
    path = folder / "chatgpt-export.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(EXPORTS / "chatgpt-conversations.json", "conversations.json")
    return path


async def test_dana_imports_her_chatgpt_export_on_the_page_and_her_agent_finds_it(
    server: Server, page: Page, tmp_path: Path
) -> None:
    await sign_in(page, server, "dana")
    await page.get_by_role("link", name="Bring your history").click()
    # a Claude export named as ChatGPT: the server's error, nothing added
    await page.get_by_label("Where the export comes from").select_option("chatgpt")
    await page.get_by_label("The export file").set_input_files(
        str(EXPORTS / "claude-conversations.json")
    )
    await page.get_by_role("button", name="Import").click()
    status = page.locator("#import-status")
    await page.get_by_text("it looks like --format claude").wait_for()
    # her ChatGPT export's zip: imported, with the summary
    await page.get_by_label("The export file").set_input_files(str(chatgpt_zip(tmp_path)))
    await page.get_by_role("button", name="Import").click()
    await page.get_by_text("Done: 2 conversations imported.").wait_for(timeout=60_000)
    summary = await page.locator("#import-summary").inner_text()
    assert "2 conversations in the export, 4 messages to import" in summary
    assert "Messages skipped (image or file part): 1" in summary
    assert await status.inner_text() == "Done: 2 conversations imported."
    await page.get_by_role("link", name="Conversations").click()
    await page.get_by_text("What is the torque spec for the gearbox bolts").wait_for()
    await found_within(server, "dana", "gearbox bolts torque press P-220", "94 Nm", 60)
