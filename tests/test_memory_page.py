"""The memory page in a real browser: Debian's Chromium, headless, driven by Playwright, against a
real server holding the seeded demo. Alice signs in with her token, finds the N-11 decision with
the search box, reads the capacity check, forgets the unit-ratio chat (and her agent's tool no
longer returns it); bob sees only his chat; markup in a turn is shown as text and never runs,
while its Markdown tables and lists show as tables and lists; the layout keeps counts, first lines
and the search's status readable."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from conftest import Server, turn

from devtools.demo import CHROMIUM, CHROMIUM_ARGS, seeded_demo
from recall.domain.conversation import conversation_ref, user_dir_name

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"{CHROMIUM} is absent: the memory page's browser test needs Debian's chromium "
        "(apt-get install chromium; CI installs it)",
    ),
    pytest.mark.asyncio(loop_scope="module"),  # the module's one browser lives in one loop
]
playwright_api = pytest.importorskip("playwright.async_api", reason="the test extra's playwright")
Browser = playwright_api.Browser
Page = playwright_api.Page
Locator = playwright_api.Locator

UNIT_RATIOS = "alice-2026-10-12-unit-ratios"
CAPACITY_CHECK = "alice-2026-10-08-capacity-check"
MARKUP = '<script>window.pwned = "script"</script> and <img src=x onerror="window.pwned = 1">'
MARKUP_CHAT = {
    "user": "alice",
    "conversation_id": "alice-markup",
    "turns": [
        turn("user", f"Paste test: {MARKUP}", "2026-10-14T08:00:00Z"),
        turn("assistant", "That is markup, shown as you typed it.", "2026-10-14T08:01:00Z"),
        turn(
            "assistant",
            "Also in a table:\n\n| what | shown |\n|---|---|\n"
            f"| {MARKUP.split(' and ')[1]} | **as text** |\n\n- `<b>code</b>`\n\n"
            "```\n| not | a table |\n- nor a list\n```",
            "2026-10-14T08:02:00Z",
        ),
    ],
}
# A conversation whose answer holds a Markdown table and whose next turn a plain-text one, aligned
# with spaces as a program prints it.
TABLES_TITLE = "Compare the quokka feeders for the East pen, please."
ALIGNED = "feeder  date        refills\nEast    2026-10-12  3\nWest    2026-10-12  5"
TABLES_CHAT = {
    "user": "alice",
    "conversation_id": "alice-quokka-tables",
    "turns": [
        turn("user", TABLES_TITLE, "2026-10-13T10:00:00Z"),
        turn(
            "assistant",
            "The quokka feeders side by side:\n\n| feeder | refills per day |\n|---|---|\n"
            "| East | 3 |\n| West | 5 |",
            "2026-10-13T10:01:00Z",
        ),
        turn(
            "user",
            f"Thanks. The quokka feeder log, as printed:\n\n{ALIGNED}",
            "2026-10-13T10:02:00Z",
        ),
        turn("assistant", "Noted: the West feeder is refilled more often.", "2026-10-13T10:03:00Z"),
    ],
}
PHONE = {"width": 390, "height": 760}
DESKTOP = {"width": 1000, "height": 800}
# How many lines an element's text takes on screen: the line boxes its text's rectangles sit in.
LINES = """element => {
    const range = document.createRange();
    range.selectNodeContents(element);
    return new Set([...range.getClientRects()].map(rect => Math.round(rect.top))).size;
}"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = seeded_demo(tmp_path_factory.mktemp("memory-page"))
    try:
        assert server.post(MARKUP_CHAT)[0] == 202
        assert server.post(TABLES_CHAT)[0] == 202
        server.wait_indexed("alice")
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One Chromium for the module (a launch costs about a second of CPU); each test gets a
    context of its own in it (`page`)."""
    async with playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A fresh browser context (its own storage, cookies and cache, as a fresh profile) at a
    phone's width; fails the test on any script error and on anything the page's
    Content-Security-Policy refused (an inline style, an innerHTML)."""
    context = await browser.new_context(viewport=PHONE)
    errors: list[str] = []
    page = await context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on(
        "console",
        lambda message: (
            errors.append(message.text)
            if "Content Security Policy" in message.text or "Trusted Type" in message.text
            else None
        ),
    )
    try:
        yield page
    finally:
        await context.close()
    assert errors == []


async def sign_in(page: Page, server: Server, user: str) -> None:
    await page.goto(f"{server.url}/memory")
    await page.get_by_label("Access token").fill(server.tokens[user])
    await page.get_by_role("button", name="Sign in").click()
    await page.locator("#conversation-list li").first.wait_for()


async def conversation_titles(page: Page) -> list[str]:
    return await page.locator("#conversation-list .first-line").all_inner_texts()


async def test_alice_finds_the_decision_reads_the_chat_and_forgets_the_unit_ratios(
    demo: Server, page: Page
) -> None:
    # given alice's agent still finds the unit-ratio chat
    assert "A truck takes 26 pallets" in await demo.recall("alice", "truck pallets")
    # when she signs in with her token
    await sign_in(page, demo, "alice")
    assert await page.get_by_text("Signed in as alice").is_visible()
    titles = await conversation_titles(page)
    assert len(titles) == 8 and titles[0].startswith("Paste test")  # newest first
    # the token is in this tab's sessionStorage only: no URL, cookie or localStorage holds it
    token = demo.tokens["alice"]
    assert await page.evaluate("sessionStorage.getItem('recall.token')") == token
    assert await page.evaluate("localStorage.length") == 0
    assert await page.context.cookies() == []
    assert token not in page.url and "alice" not in page.url

    # she finds the N-11 decision through the search box, the query's words highlighted
    await page.get_by_role("link", name="Search", exact=True).click()
    await page.get_by_label("Search your conversations").fill("N-11 decision")
    await page.get_by_role("button", name="Search", exact=True).click()
    results = page.locator("#search-results")
    await results.get_by_text("Decision: we go ahead with the N-11 upgrade").first.wait_for()
    marked = {text.lower() for text in await results.locator("mark").all_inner_texts()}
    assert {"n-11", "decision"} <= marked
    capacity = conversation_ref(user_dir_name("alice"), CAPACITY_CHECK)
    decision = results.locator("li.passage", has_text="Decision: we go ahead").first
    said = await decision.locator(".passage-head").inner_text()
    assert said == "You · 2026-10-08 09:20 UTC · turn 5"

    # she opens the capacity check from its passage (named by its first line) and reads it
    # whole, dated, by speaker
    await decision.get_by_role("link", name="Capacity check for the N-11").click()
    turns = page.locator("#turn-list > li")
    await turns.first.wait_for()
    assert await turns.count() == 12
    assert await page.locator("#conversation-title").inner_text() == (
        "Capacity check for the N-11 upgrade proposal. N-11 is the North filler; after the "
        "upgrade it sends about 245 units/d…"
    )
    # at the passage's turn, addressed as the agent's read tool addresses it: no gateway id
    assert page.url.endswith(f"#conversation/{capacity}/5")
    assert await page.locator("#turn-list > li.target").get_attribute("id") == "turn-5"
    fifth = await turns.nth(4).inner_text()
    assert fifth.startswith("You · 2026-10-08 09:20 UTC · turn 5")
    assert "Decision: we go ahead with the N-11 upgrade proposal." in fifth

    # she opens the unit-ratio chat; cancelling the confirmation forgets nothing
    await page.get_by_role("link", name="Back to the conversations").click()
    await page.get_by_role("link", name="Some unit arithmetic").click()
    await turns.first.wait_for()
    await page.get_by_role("button", name="Forget this conversation").click()
    dialog = page.get_by_role("dialog", name="Forget this conversation?")
    assert await dialog.is_visible()
    await dialog.get_by_role("button", name="Cancel").click()
    assert not await dialog.is_visible()
    assert "A truck takes 26 pallets" in await demo.recall("alice", "truck pallets")
    # confirming forgets it: the receipt shows, the list no longer holds it
    await page.get_by_role("button", name="Forget this conversation").click()
    await dialog.get_by_role("button", name="Forget it").click()
    receipt = page.locator("#receipt")
    await receipt.wait_for()
    text = await receipt.inner_text()
    assert "Forgotten: “Some unit arithmetic" in text and UNIT_RATIOS in text
    assert "Turns removed\n10" in text
    titles = await conversation_titles(page)
    assert len(titles) == 7 and not any(t.startswith("Some unit arithmetic") for t in titles)

    # then her agent's tool no longer returns it, and the page says it is gone
    answer = await demo.recall("alice", "truck pallets")
    assert "26 pallets" not in answer and "[2026-10-12" not in answer
    forgotten = conversation_ref(user_dir_name("alice"), UNIT_RATIOS)
    await page.goto(f"{demo.url}/memory#conversation/{forgotten}")
    await page.get_by_text(
        "That conversation is not stored (it may have been forgotten)."
    ).wait_for()


async def test_bobs_token_shows_only_bobs_chat(demo: Server, page: Page) -> None:
    # when bob signs in
    await sign_in(page, demo, "bob")
    # then his list holds his one chat, and his search never reaches alice's
    titles = await conversation_titles(page)
    assert len(titles) == 1 and titles[0].startswith("I'm at the South hub. Motor P-7")
    await page.get_by_role("link", name="Search", exact=True).click()
    await page.get_by_label("Search your conversations").fill("N-11 upgrade decision")
    await page.get_by_role("button", name="Search", exact=True).click()
    # (his history never names N-11: the status says so, and no passage of alice's shows)
    await (
        page.locator("#search-status")
        .get_by_text("No earlier conversation mentions N-11")
        .wait_for()
    )
    assert "N-11" not in await page.locator("#search-results").inner_text()
    # nor does an address naming alice's conversation's reference
    alices = conversation_ref(user_dir_name("alice"), CAPACITY_CHECK)
    await page.goto(f"{demo.url}/memory#conversation/{alices}")
    await page.get_by_text("That conversation is not stored").wait_for()
    assert "N-11" not in await page.locator("main").inner_text()


async def test_markup_in_a_turn_is_shown_as_text_and_never_runs(demo: Server, page: Page) -> None:
    # given a turn holding a script tag and an image with an onerror handler
    await sign_in(page, demo, "alice")
    # when alice lists and opens that conversation
    assert (await conversation_titles(page))[0] == f"Paste test: {MARKUP}"
    await page.get_by_role("link", name="Paste test").click()
    first = page.locator("#turn-list > li").first
    await first.wait_for()
    # then the literal text is what she sees, no element came of it, and nothing ran
    assert await first.locator(".text").inner_text() == f"Paste test: {MARKUP}"
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("typeof window.pwned") == "undefined"
    # a table cell, bold and code holding markup show it as text too; a fenced block stays as typed
    third = page.locator("#turn-list > li").nth(2)
    cell = third.locator("table td").first
    assert await cell.inner_text() == MARKUP.split(" and ")[1]
    assert await third.locator("td strong").inner_text() == "as text"
    assert await third.locator("li code").inner_text() == "<b>code</b>"
    assert await third.locator("pre").inner_text() == "| not | a table |\n- nor a list"
    assert await third.locator("table, ul").count() == 2  # the fenced lines made neither
    assert await page.locator("main img, main script, main b").count() == 0
    # and the same holds for a search result that shows it
    await page.get_by_role("link", name="Search", exact=True).click()
    await page.get_by_label("Search your conversations").fill("paste test onerror")
    await page.get_by_role("button", name="Search", exact=True).click()
    await page.locator("#search-results li").first.wait_for()
    assert MARKUP.split(" and ")[1] in await page.locator("#search-results").inner_text()
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("typeof window.pwned") == "undefined"


async def test_the_page_works_from_the_keyboard_and_fits_a_phone(demo: Server, page: Page) -> None:
    await page.goto(f"{demo.url}/memory")
    # Tab past the skip link to the token field, type, Enter
    await page.keyboard.press("Tab")
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.id") == "token"
    await page.keyboard.type(demo.tokens["bob"])
    await page.keyboard.press("Enter")
    await page.locator("#conversation-list li").first.wait_for()
    # focus moved to the view's heading; the next Tab reaches the first conversation's link
    assert await page.evaluate("document.activeElement.id") == "conversations-title"
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.tagName") == "A"
    await page.keyboard.press("Enter")
    await page.locator("#turn-list li").first.wait_for()
    # the forget button is next; Escape closes its dialog and forgets nothing
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.id") == "forget-button"
    await page.keyboard.press("Enter")
    assert await page.get_by_role("dialog").is_visible()
    await page.keyboard.press("Escape")
    assert not await page.get_by_role("dialog").is_visible()
    assert "P-7" in await demo.recall("bob", "P-7 motor bearing")
    # nothing is wider than the phone's screen
    assert await page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )


async def test_the_audit_shows_a_page_and_loads_earlier_searches_on_demand(
    demo: Server, page: Page
) -> None:
    # Given bob's audit with 25 searches more (more than one page)
    audit = demo.home("bob") / "audit.jsonl"
    earlier = len(audit.read_text().splitlines()) if audit.exists() else 0
    with open(audit, "a", encoding="utf-8") as handle:
        for n in range(25):
            line = {"at": f"2026-11-01T00:00:{n:02d}Z", "client": None, "query": f"search {n}"}
            handle.write(json.dumps({**line, "outcome": "nothing_found", "served": []}) + "\n")
    # When he opens what the assistant looked up
    await sign_in(page, demo, "bob")
    await page.get_by_role("link", name="What the assistant looked up").click()
    cards = page.locator("#audit-list > li")
    await cards.first.wait_for()
    # Then the newest page shows, and the button brings the earlier searches, then goes
    assert await cards.count() == 20
    assert await cards.first.get_by_text("search 24").count() == 1
    await page.get_by_role("button", name="Show earlier searches").click()
    await page.locator("#audit-list > li", has_text="search 0").wait_for()
    assert await cards.count() == 25 + earlier
    assert await page.get_by_role("button", name="Show earlier searches").is_hidden()


async def test_counts_stay_on_one_line_and_first_lines_end_after_a_word(
    demo: Server, page: Page
) -> None:
    # given alice's list on a desktop's width, where each count sits beside a long first line
    await page.set_viewport_size(DESKTOP)
    await sign_in(page, demo, "alice")
    # then every "N turns" takes one line
    counts = page.locator("#conversation-list .count")
    assert await counts.count() >= 6
    for count in await counts.all():
        assert await count.evaluate(LINES) == 1, await count.inner_text()
    # and a first line too long to show whole ends after a whole word, with an ellipsis
    titles = await conversation_titles(page)
    capacity = next(t for t in titles if t.startswith("Capacity check"))
    assert capacity == (
        "Capacity check for the N-11 upgrade proposal. N-11 is the North filler; after the "
        "upgrade it sends about 245 units/d…"
    )
    assert all(len(t) <= 120 for t in titles)


async def test_a_turns_markdown_table_and_list_show_as_a_table_and_a_list(
    demo: Server, page: Page
) -> None:
    # given alice's budget forecast, whose answers hold a pipe table and bulleted lists
    await sign_in(page, demo, "alice")
    # when she opens it on a phone
    await page.get_by_role("link", name="I need a volume forecast").click()
    turns = page.locator("#turn-list > li")
    await turns.first.wait_for()
    # then the table is a table: a header row and one row per line, no pipes or rule left
    table = page.locator("#turn-list table").first
    headers = await table.locator("th").all_inner_texts()
    assert headers[:2] == ["months", "hyperbolic rate"]
    assert await table.locator("tbody tr").count() == 3
    cells = await table.locator("tbody tr").first.locator("td").all_inner_texts()
    assert cells[:2] == ["6", "1,329.7 units/d"]
    text = await page.locator("#turn-list").inner_text()
    assert "|---|" not in text and "| months" not in text
    # the lists are lists, without their dashes
    item = page.locator("#turn-list ul > li", has_text="Rate: 1,069.5")
    assert (await item.inner_text()).startswith("Rate: 1,069.5 − 1,030.9")
    # and the wide table scrolls in its turn: the page is no wider than the phone
    assert await page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )


async def test_the_search_says_nothing_found_once_just_above_its_results(
    demo: Server, page: Page
) -> None:
    await sign_in(page, demo, "alice")
    await page.get_by_role("link", name="Search", exact=True).click()
    box = page.get_by_label("Search your conversations")
    button = page.get_by_role("button", name="Search", exact=True)
    # when a search finds nothing, the answer is said once
    await box.fill("zebra giraffe quantum")
    await button.click()
    await page.get_by_text("Nothing relevant found").first.wait_for()
    assert await page.get_by_text("Nothing relevant found").count() == 1
    # when one finds passages, their count sits between the search button and the first result
    await box.fill("N-11 decision")
    await button.click()
    status = page.get_by_role("status").filter(has_text="passages found")
    await status.wait_for()
    assert await page.get_by_text("Nothing relevant found").count() == 0
    below = await button.bounding_box()
    said = await status.bounding_box()
    first = await page.locator("#search-results > li").first.bounding_box()
    assert below and said and first
    assert below["y"] + below["height"] <= said["y"]
    assert 0 <= first["y"] - (said["y"] + said["height"]) <= 24


# What the agent's answer says that a person should never have to read: a passage header's
# reference and turn, and a neighbour's line.
AGENT_SYNTAX = re.compile(r"ref [0-9a-f]{6,} turn \d+|~ (?:before|after) \(\w+\)")


async def first_text(found: Locator) -> str | None:
    """The first match's text; None when nothing matches (as on a page without that part)."""
    return await found.first.inner_text() if await found.count() else None


async def search_for(page: Page, query: str) -> Locator:
    await page.get_by_role("link", name="Search", exact=True).click()
    await page.get_by_label("Search your conversations").fill(query)
    await page.get_by_role("button", name="Search", exact=True).click()
    await page.locator("#search-status").get_by_text("found").wait_for()
    return page.locator("#search-results")


async def test_a_search_hit_says_who_said_it_when_and_in_which_conversation(
    demo: Server, page: Page
) -> None:
    # given alice's conversation about the quokka feeders
    await sign_in(page, demo, "alice")
    # when she searches for it
    results = await search_for(page, "quokka feeders refills")
    # then the hit holding the Markdown table says who said it and when, as a person reads it,
    # names its conversation by its first line, and links there; so do the turns around the hits
    # (her questions, here); no agent syntax anywhere
    card = results.locator("li.passage", has_text="The quokka feeders side by side")
    said = results.locator("li.passage .passage-head strong, li.passage summary strong")
    seen = {
        "speakers": sorted(set(await said.all_inner_texts())),
        "date": await first_text(card.locator("time")),
        "conversation": await card.get_by_role("link", name=TABLES_TITLE).count(),
        "agent syntax": AGENT_SYNTAX.findall(await results.inner_text()),
    }
    assert seen == {
        "speakers": ["Assistant", "You"],
        "date": "2026-10-13 10:01 UTC",
        "conversation": 1,
        "agent syntax": [],
    }
    # and its link opens that conversation at that turn
    await card.get_by_role("link", name=TABLES_TITLE).click()
    await page.locator("#turn-list > li.target").wait_for()
    assert await page.locator("#conversation-title").inner_text() == TABLES_TITLE
    assert await page.locator("#turn-list > li.target").get_attribute("id") == "turn-2"


async def test_a_search_shows_a_markdown_table_as_a_table_and_an_aligned_one_in_monospace(
    demo: Server, page: Page
) -> None:
    # given the quokka conversation, with a Markdown table and, a turn later, one aligned by spaces
    await sign_in(page, demo, "alice")
    # when alice searches for it and opens what is folded around the hits
    results = await search_for(page, "quokka feeders refills")
    folded = results.locator("details:not([open]) > summary")
    while await folded.count():
        await folded.first.click()
    # then the Markdown table is a table with its cells, in the hit or beside it
    tables = results.locator("table", has_text="refills per day")
    cells = "rows => rows.map(row => [...row.cells].map(cell => cell.innerText))"
    rows = await tables.first.locator("tr").evaluate_all(cells) if await tables.count() else []
    # and the aligned one keeps its columns: the lines as written, in a monospace font
    aligned = results.locator("pre", has_text="feeder  date        refills")
    font = "e => getComputedStyle(e).fontFamily"
    seen = {
        "table rows": rows,
        "aligned text": await first_text(aligned),
        "monospace": await aligned.count() > 0
        and "monospace" in await aligned.first.evaluate(font),
        "pipes left": "|---|" in await results.inner_text(),
    }
    assert seen == {
        "table rows": [["feeder", "refills per day"], ["East", "3"], ["West", "5"]],
        "aligned text": ALIGNED,
        "monospace": True,
        "pipes left": False,
    }
    # the aligned block scrolls sideways in its card: the page is no wider than the phone
    assert await page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )


async def test_the_audit_names_the_conversation_each_looked_up_passage_came_from(
    demo: Server, page: Page
) -> None:
    # given alice's agent looked the quokka feeders up, then read the first turns of that chat
    assert "quokka" in await demo.recall("alice", "quokka feeders refills")
    ref = conversation_ref(user_dir_name("alice"), TABLES_CHAT["conversation_id"])
    assert "quokka" in await demo.read("alice", ref=ref, from_turn=1, to_turn=2)
    # when she opens what the assistant looked up
    await sign_in(page, demo, "alice")
    await page.get_by_role("link", name="What the assistant looked up").click()
    read, searched = (
        page.locator("#audit-list > li").nth(0),
        page.locator("#audit-list > li").nth(1),
    )
    await searched.wait_for()
    # then the search's entry says of each passage it was given who said it, when, and in which
    # conversation (linked there); the read's names the conversation read; no agent syntax
    searched_text, read_text = await searched.inner_text(), await read.inner_text()
    seen = {
        "conversation links": await searched.get_by_role("link", name=TABLES_TITLE).count() > 0,
        "the table's turn": f"Assistant, 2026-10-13 10:01 UTC in {TABLES_TITLE}" in searched_text,
        "the read": f"Read turns 1 to 2 of {TABLES_TITLE}" in read_text,
        "the read's ref shown": ref in read_text,
        "agent syntax": AGENT_SYNTAX.findall(searched_text + read_text),
    }
    assert seen == {
        "conversation links": True,
        "the table's turn": True,
        "the read": True,
        "the read's ref shown": False,
        "agent syntax": [],
    }
