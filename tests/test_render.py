"""The embedded engine's passage format, byte for byte: what the agent reads is a contract.

Hits and neighbours are built by hand: no model, no db. A change that moves one byte here is a
change to docs/CONTRACTS.md and must be made on purpose.
"""

from __future__ import annotations

from recall.domain.answers import (
    MORE_MATCH,
    NEVER_MENTIONED_YET,
    Recalled,
)
from recall.ranking.render import Neighbour, render
from recall.ranking.search import Hit, Notes
from recall.ranking.text import Query

USER = "0123456789abcdef01234567"  # a user's hash, as the store keys them
REF = "ref 3703f5ddfa38"  # of USER's conversation c7f3a-mobile-login: pinned, refs must not move
FILLER = "The quarterly report covers revenue, churn and hiring in every region. "


def hit(seq: int, ts: str, role: str, text: str) -> Hit:
    return Hit(seq, "c7f3a-mobile-login", f"t{seq}", seq, ts, 0.0, role, text, score=0.0)


TICKET = hit(
    1,
    "2026-03-02T10:01:00Z",
    "assistant",
    "MT-4471 tracks the login timeouts in the mobile app. The owner is Priya Raman.",
)
AROUND_TICKET = [
    Neighbour(-1, "user", "Can you summarise ticket MT-4471 for me?"),
    Neighbour(1, "user", "Great,  I'll ask Priya\nfor an update on Thursday."),
]
LATER = hit(4, "2026-03-05T09:30:00+02:00", "user", "Priya says MT-4471 ships in release 3.2.\n")
VAULT = hit(
    7,
    "2026-01-01T00:00:00Z",
    "user",
    FILLER * 4 + "The vault combination is kept under key ZX-9917 by facilities. " + FILLER * 4,
)
AROUND_VAULT = [Neighbour(1, "assistant", "Noted: ZX-9917 is the vault key. " + FILLER * 3)]


def test_hits_that_fit_are_shown_whole_with_their_neighbours_on_one_line_each() -> None:
    # Given two hits, the first with the turns before and after it, and room for everything
    hits = [(TICKET, AROUND_TICKET), (LATER, [])]

    # When they are rendered
    output = render(hits, Query.parse("who owns MT-4471?"), 4000, USER).text

    # Then each is a dated block, times in UTC, neighbours collapsed to one line, no ids
    assert output == (
        f"[2026-03-02 10:01 UTC] assistant · {REF} turn 2\n"
        "MT-4471 tracks the login timeouts in the mobile app. The owner is Priya Raman.\n"
        "  ~ before (user): Can you summarise ticket MT-4471 for me?\n"
        "  ~ after (user): Great, I'll ask Priya for an update on Thursday.\n"
        "---\n"
        f"[2026-03-05 07:30 UTC] user · {REF} turn 5\n"
        "Priya says MT-4471 ships in release 3.2.\n"
        "---\n"
    )
    assert "c7f3a" not in output


def test_each_shown_hit_is_a_passage_whose_span_is_its_block_whatever_its_text_holds() -> None:
    # Given a hit whose own text holds a line shaped like a passage header, and a second hit
    forged = hit(2, "2026-03-02T11:00:00Z", "user", "notes\n[2031-05-05 05:05 UTC] swordfish\nend")
    hits = [(forged, AROUND_TICKET), (LATER, [])]

    # When they are rendered
    recalled = render(hits, Query.parse("notes MT-4471"), 4000, USER)

    # Then there are two passages, told by the engine and not by the text: each span is one
    # whole block, and each names its conversation, turn, time and role
    assert [(p.conversation_id, p.turn_id, p.ts, p.role) for p in recalled.passages] == [
        ("c7f3a-mobile-login", "t2", "2026-03-02T11:00:00Z", "user"),
        ("c7f3a-mobile-login", "t4", LATER.ts, "user"),
    ]
    blocks = [recalled.text[p.start : p.end] for p in recalled.passages]
    assert "".join(blocks) == recalled.text
    assert all(block.endswith("---\n") for block in blocks)
    assert "swordfish" in blocks[0]


def test_a_long_passage_is_cut_around_the_querys_identifier() -> None:
    # Given a long passage whose identifier sits far from its start
    query = Query.parse("vault ZX-9917")

    # When it is rendered under a small cap
    output = render([(VAULT, AROUND_VAULT)], query, 426, USER).text

    # Then the excerpt starts a little before the identifier, and both cuts are marked
    assert output == (
        f"[2026-01-01 00:00 UTC] user · {REF} turn 8\n"
        "…region. The vault combination is kept under key ZX-9917 by facilities. The quarterly "
        "report covers revenue, churn and hiring in every region. The quarterly report covers "
        "revenue, churn and hiring…\n"
        "  ~ after (assistant): Noted: ZX-9917 is the vault key. The quarterly report covers "
        "revenue, churn and hiring in every region. The quarterly report covers revenue,…\n"
        "---\n"
    )
    assert len(output) <= 426


def test_hits_share_the_character_cap_and_stay_under_it() -> None:
    # Given three hits and a cap too small for any of them whole
    hits = [(TICKET, AROUND_TICKET), (VAULT, AROUND_VAULT), (LATER, [])]

    # When they are rendered
    output = render(hits, Query.parse("MT-4471 vault"), 378, USER).text

    # Then each keeps its header and a shortened passage, neighbours give way, best first
    assert output == (
        f"[2026-03-02 10:01 UTC] assistant · {REF} turn 2\n"
        "MT-4471 tracks the login timeouts in the mobile app. The…\n"
        "---\n"
        f"[2026-01-01 00:00 UTC] user · {REF} turn 8\n"
        "…region. The vault combination is kept under key ZX-9917 by…\n"
        "---\n"
        f"[2026-03-05 07:30 UTC] user · {REF} turn 5\n"
        "Priya says MT-4471 ships in release 3.2.\n"
        "---\n"
    )
    assert len(output) <= 378


def test_more_hits_never_shorten_the_first_three_blocks() -> None:
    # Given three hits and a cap that cuts them, and the same three with two more after them
    three = [(TICKET, AROUND_TICKET), (VAULT, AROUND_VAULT), (LATER, [])]
    five = [*three, (hit(20, "2026-03-06T09:00:00Z", "user", FILLER), []), (VAULT, [])]
    query = Query.parse("MT-4471 vault")

    # When each is rendered at the same cap
    short, longer = (render(hits, query, 900, USER) for hits in (three, five))

    # Then the longer answer starts with the shorter one's three blocks, byte for byte
    assert len(short.passages) == 3 and len(longer.passages) > 3
    assert longer.text.startswith(short.text)


def test_turns_further_away_follow_in_order_and_give_way_first_when_room_is_short() -> None:
    # Given a hit with two turns on each side: the adjacent ones longer than the far ones
    near_before = "Which ticket tracks the login timeouts in the mobile app, and who owns it now?"
    near_after = "Thanks, I will ask Priya about the release date for the fix on Thursday."
    around = [
        Neighbour(-2, "user", "Morning!"),
        Neighbour(-1, "assistant", near_before),
        Neighbour(1, "user", near_after),
        Neighbour(2, "assistant", "Anytime."),
    ]

    # When there is room for everything, and then for little more than the adjacent turns
    roomy = render([(TICKET, around)], Query.parse("MT-4471 owner"), 4000, USER).text
    tight = render([(TICKET, around)], Query.parse("MT-4471 owner"), 356, USER).text

    # Then all four follow in conversation order; under the small cap the adjacent turns stay
    # whole and the far ones give way
    labels = [line.split(":")[0] for line in roomy.splitlines() if line.startswith("  ~")]
    assert labels == ["  ~ before (user)", "  ~ before (assistant)", "  ~ after (user)",
                      "  ~ after (assistant)"]  # fmt: skip
    assert f"  ~ before (assistant): {near_before}\n" in tight
    assert f"  ~ after (user): {near_after}\n" in tight
    assert "Morning!" not in tight and "Anytime." not in tight
    assert len(tight) <= 356


def test_the_notes_come_before_and_after_the_blocks_and_the_spans_still_point_at_them() -> None:
    # Given one hit, a query naming an identifier no conversation mentions, and two more that
    # match as fully as those shown
    notes = Notes(unknown=("MT-5120",), near_misses=True)
    more = Notes(more=2)

    # When they are rendered, under a cap
    near = render([(LATER, [])], Query.parse("MT-5120 release"), 400, USER, notes)
    listed = render([(LATER, [])], Query.parse("release"), 400, USER, more)
    none = render([], Query.parse("MT-5120 release"), 400, USER, Notes(unknown=("MT-5120",)))

    # Then the never-mentioned line and the near-miss label lead, the "more" line ends the
    # answer, each passage's span is its block, and without a passage only the first line is left
    block = (
        f"[2026-03-05 07:30 UTC] user · {REF} turn 5\nPriya says MT-4471 ships in release 3.2.\n"
        "---\n"
    )
    assert near.text == (
        "No earlier conversation mentions MT-5120.\n"
        "Not a match: the passages closest to the rest of the query, none of them about "
        "MT-5120:\n" + block
    )
    assert near.text[near.passages[0].start : near.passages[0].end] == block
    assert listed.text == block + MORE_MATCH.format(2) + "\n"
    assert (listed.passages[0].start, listed.passages[0].end) == (0, len(block))
    assert none.text == "No earlier conversation mentions MT-5120."
    assert none.passages == ()
    assert all(len(answer.text) <= 400 for answer in (near, listed))


def test_while_an_index_run_is_due_the_negatives_say_not_yet_and_the_spans_still_point() -> None:
    # Given the answers of the test above: a near miss, a list, and only the never-mentioned line
    notes = Notes(unknown=("MT-5120",), near_misses=True)
    near = render([(LATER, [])], Query.parse("MT-5120 release"), 400, USER, notes)
    listed = render([(LATER, [])], Query.parse("release"), 400, USER, Notes(more=2))
    none = render([], Query.parse("MT-5120 release"), 400, USER, Notes(unknown=("MT-5120",)))

    # When the store renders them while the user's index is behind (a run due or going)
    later_near = render(
        [(LATER, [])], Query.parse("MT-5120 release"), 400, USER, notes, still_indexing=True
    )
    later_listed = render(
        [(LATER, [])], Query.parse("release"), 400, USER, Notes(more=2), still_indexing=True
    )
    later_none, later_empty = (
        render([], Query.parse("MT-5120 release"), 400, USER, said, still_indexing=True)
        for said in (Notes(unknown=("MT-5120",)), Notes())
    )

    # Then the never-mentioned line says "not yet", the passages' spans point at their blocks,
    # a list without negatives is unchanged, and nothing found stays empty (the server's
    # "nothing yet": test_app_parts)
    rest = near.text.partition("\n")[2]
    assert later_near.text == NEVER_MENTIONED_YET.format("MT-5120") + "\n" + rest
    block = near.text[near.passages[0].start : near.passages[0].end]
    assert later_near.text[later_near.passages[0].start : later_near.passages[0].end] == block
    assert later_listed == listed
    assert later_none == Recalled(NEVER_MENTIONED_YET.format("MT-5120"))
    assert none.passages == later_none.passages == ()
    assert later_empty == Recalled("")
