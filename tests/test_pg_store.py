"""PgStore over a real PostgreSQL: the write path, tombstones, forget, erase, receipts, the audit
and retention, as tests/test_lifecycle.py and tests/test_ingest.py prove them for the files store;
and the locks that make replicas (two PgStore instances on one database) behave as one server."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import conversation, turn
from pg import PgDatabase

from recall.domain.conversation import parse_conversation, user_dir_name
from recall.domain.errors import Forgotten, NotDue, NotFound, StoreUnavailable
from recall.domain.forgetting import expired, turn_digest
from recall.embedder import Embedder
from recall.models import load_embedder
from recall.pg.database import Database
from recall.pg.index import IndexRunner, index_lock
from recall.pg.schema import key_id
from recall.pg.search import PgSearch
from recall.pg.store import PgStore, conversation_lock
from recall.settings import ConfigError

SECRET = "zephyrquartz"  # a word only the conversation to forget holds
KEPT = "marigoldvector"  # a word only the conversation that stays holds
ALICE = user_dir_name("alice")
BOB = user_dir_name("bob")


def later(minutes: int = 1) -> str:
    """A turn stamp after anything the store did so far."""
    return (datetime.now(UTC) + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
async def replicas(pg_database: PgDatabase) -> AsyncIterator[tuple[PgStore, PgStore]]:
    """Two stores on one database: two replicas of the server."""
    stores = (PgStore(Database(pg_database.app_url, 4), 0.1) for _ in range(2))
    opened = []
    for store in stores:
        await store.start()
        opened.append(store)
    yield opened[0], opened[1]
    for store in opened:
        await store.close()


@pytest.fixture
def store(replicas: tuple[PgStore, PgStore]) -> PgStore:
    return replicas[0]


@pytest.fixture
async def owner(pg_database: PgDatabase) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection as the tables' owner (autocommit): what the database holds, whatever RLS."""
    async with await psycopg.AsyncConnection.connect(pg_database.owner_url, autocommit=True) as c:
        yield c


async def rows(conn: psycopg.AsyncConnection[Any], query: str, *params: Any) -> list[Any]:
    return await (await conn.execute(query, params)).fetchall()


async def put(store: PgStore, body: dict[str, Any]) -> bool:
    return await store.put(user_dir_name(body["user"]), parse_conversation(body))


async def stored(store: PgStore, user: str, cid: str) -> list[tuple[int, str]] | None:
    """(seq, text) of each stored turn of a conversation; None when none is stored."""
    turns = await store.turns(user_dir_name(user), cid)
    return None if turns is None else [(t["seq"], t["blocks"][0]["text"]) for t in turns]


async def user_row(owner: psycopg.AsyncConnection[Any], user_hash: str) -> dict[str, Any] | None:
    cursor = await owner.execute(
        "SELECT changes, forgets, erasures, due_at FROM users WHERE user_hash = %s", (user_hash,)
    )
    row = await cursor.fetchone()
    return (
        None
        if row is None
        else dict(zip(("changes", "forgets", "erasures", "due"), row, strict=True))
    )


async def seed(store: PgStore, user: str = "alice") -> None:
    """Two conversations: `secret` (to forget) and `kept`."""
    assert await put(store, conversation(user, "secret", f"The vault code is {SECRET}.", "Noted."))
    assert await put(store, conversation(user, "kept", f"The plan is {KEPT}.", "Ok.", day=9))


async def waiting_on_locks(owner: psycopg.AsyncConnection[Any], count: int) -> None:
    """Until ``count`` transactions wait for a lock (a row's, or an advisory one)."""
    for _ in range(200):
        (waiting,) = (
            await rows(owner, "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted")
        )[0]
        if waiting >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} lock waits not seen")


# --- the write path ----------------------------------------------------------------------------


async def test_a_post_is_committed_before_put_returns(
    replicas: tuple[PgStore, PgStore], owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given a conversation posted to one replica
    body = conversation("alice", "c1", "Hello there.", "Hi.")
    written = await put(replicas[0], body)

    # Then as put returns, the other replica and the owner's connection read it whole
    assert written is True
    assert await stored(replicas[1], "alice", "c1") == [(0, "Hello there."), (1, "Hi.")]
    (body_text,) = (
        await rows(owner, "SELECT body FROM conversations WHERE user_hash = %s", ALICE)
    )[0]
    assert body_text == parse_conversation(body).to_jsonl()  # what the files store writes
    # and an index run is due, after the debounce
    row = await user_row(owner, ALICE)
    assert row is not None and row["changes"] == 1 and row["due"] is not None


async def test_a_stale_repost_writes_nothing(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given a stored conversation of three turns
    assert await put(store, conversation("alice", "c1", "One.", "Two.", "Three."))
    before = await rows(owner, "SELECT body, version FROM conversations")
    counted = await user_row(owner, ALICE)

    # When an older snapshot (its first two turns) and the same version again are posted
    shorter = await put(store, conversation("alice", "c1", "One.", "Two."))
    same = await put(store, conversation("alice", "c1", "One.", "Two.", "Three."))

    # Then nothing is written: not the body, not its version, no index run is asked for
    assert shorter is False and same is False
    assert await rows(owner, "SELECT body, version FROM conversations") == before
    assert await user_row(owner, ALICE) == counted
    # while a shorter post that differs is a new version
    assert await put(store, conversation("alice", "c1", "One.", "Two, edited."))
    assert await stored(store, "alice", "c1") == [(0, "One."), (1, "Two, edited.")]


async def test_two_replicas_posting_one_conversation_end_with_one_whole_version(
    replicas: tuple[PgStore, PgStore],
) -> None:
    # Given two replicas posting at once a conversation and an older snapshot of it, many times
    for n in range(12):
        cid = f"c{n}"
        longer = conversation("alice", cid, "One.", "Two.", "Three.")
        shorter = conversation("alice", cid, "One.", "Two.")
        first, second = (longer, shorter) if n % 2 else (shorter, longer)
        await asyncio.gather(put(replicas[0], first), put(replicas[1], second))

        # Then the longer version is stored, whole, whichever came first
        assert await stored(replicas[0], "alice", cid) == [(0, "One."), (1, "Two."), (2, "Three.")]

    # And two different versions posted at once end as exactly one of them
    a = conversation("alice", "fork", "Left.", "Left again.")
    b = conversation("alice", "fork", "Right.", "Right again.", "And more.")
    await asyncio.gather(put(replicas[0], a), put(replicas[1], b))
    assert await replicas[1].turns(ALICE, "fork") in (
        parse_conversation(a).lines,
        parse_conversation(b).lines,
    )


async def test_a_forgotten_turn_never_returns_whatever_its_time_and_a_new_turn_is_kept(
    store: PgStore,
) -> None:
    # Given a conversation stamped ahead of the server's clock, forgotten
    said = f"The vault code is {SECRET}."
    ahead = {
        "user": "alice",
        "conversation_id": "ahead",
        "turns": [turn("user", said, later(2)), turn("assistant", "Noted.", later(2))],
    }
    assert await put(store, ahead)
    await store.forget(ALICE, "ahead", "request")

    # When it is posted again with a new turn, and one of the same text a second later
    ahead["turns"] += [
        turn("user", "And the lunch order is pelicanbrioche.", later(3)),
        turn("user", said, later(4)),
    ]
    assert await put(store, ahead)

    # Then only the forgotten turns are left out, the rest renumbered from 0
    assert await stored(store, "alice", "ahead") == [
        (0, "And the lunch order is pelicanbrioche."),
        (1, said),
    ]


async def test_a_post_whose_every_turn_is_forgotten_is_refused_and_writes_nothing(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given a forgotten conversation
    await seed(store)
    await store.forget(ALICE, "secret", "request")
    counted = await user_row(owner, ALICE)

    # When the same conversation is posted again
    with pytest.raises(Forgotten):
        await put(store, conversation("alice", "secret", f"The vault code is {SECRET}.", "Noted."))

    # Then nothing is written
    assert await store.conversation_ids(ALICE) == ["kept"]
    assert await user_row(owner, ALICE) == counted


async def test_tombstones_made_before_digests_keep_their_time_rule(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given tombstones imported from the files store's earlier format: a conversation's time
    await owner.execute("INSERT INTO users (user_hash) VALUES (%s)", (ALICE,))
    await owner.execute(
        "INSERT INTO tombstone_times VALUES (%s, 'old', '2026-11-01T00:00:00Z')", (ALICE,)
    )
    before = turn("user", f"Before: {SECRET}.", "2026-10-31T23:59:59Z")
    after = turn("user", "After: quillfern.", "2026-11-01T00:00:01Z")

    # Then only what is stamped after that time is stored
    with pytest.raises(Forgotten):
        await put(store, {"user": "alice", "conversation_id": "old", "turns": [before]})
    assert await put(store, {"user": "alice", "conversation_id": "old", "turns": [before, after]})
    assert await stored(store, "alice", "old") == [(0, "After: quillfern.")]
    # and an erasure's time holds for every conversation
    await owner.execute(
        "INSERT INTO tombstone_times VALUES (%s, '*', '2026-11-01T00:00:00Z')", (ALICE,)
    )
    with pytest.raises(Forgotten):
        await put(store, {"user": "alice", "conversation_id": "any", "turns": [before]})


async def test_digests_under_an_imported_key_still_match(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given the files store's own key imported, and a tombstone it made (as `import` copies them)
    files_key = bytes(range(32))
    body = conversation("alice", "secret", f"The vault code is {SECRET}.", "Noted.")
    await owner.execute(
        "INSERT INTO server_keys (key_id, value) VALUES (%s, %s)", (key_id(files_key), files_key)
    )
    await owner.execute("INSERT INTO users (user_hash) VALUES (%s)", (ALICE,))
    first = parse_conversation(body).lines[0]
    await owner.execute(
        "INSERT INTO tombstones VALUES (%s, 'secret', %s, %s)",
        (ALICE, key_id(files_key), turn_digest(files_key, first)),
    )

    # When the conversation is posted
    assert await put(store, body)

    # Then the turn that tombstone names is left out
    assert await stored(store, "alice", "secret") == [(0, "Noted.")]


# --- forget ------------------------------------------------------------------------------------


async def test_forget_removes_the_conversation_and_answers_a_receipt(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    await seed(store)
    counted = await user_row(owner, ALICE)

    receipt = await store.forget(ALICE, "secret", "request")

    assert set(receipt) == {
        "receipt",
        "operation",
        "user",
        "at",
        "reason",
        "conversation_id",
        "removed",
    }
    assert receipt["operation"] == "forget" and receipt["conversation_id"] == "secret"
    assert receipt["user"] == ALICE and receipt["reason"] == "request"
    assert receipt["removed"] == {"conversations": 1, "turns": 2, "index_rows": 0}
    assert receipt["receipt"] and receipt["at"].endswith("Z")
    assert SECRET not in json.dumps(receipt)
    assert await store.conversation_ids(ALICE) == ["kept"]
    assert await store.turns(ALICE, "secret") is None
    assert await store.receipts(ALICE) == [receipt]
    # recalls in flight read again, and an index run follows
    row = await user_row(owner, ALICE)
    assert counted is not None and row is not None
    assert row["forgets"] == counted["forgets"] + 1 and row["changes"] == counted["changes"] + 1


async def test_a_tombstone_holds_keyed_digests_of_the_forgotten_turns_and_no_text(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    body = conversation("alice", "secret", f"The vault code is {SECRET}.", "Noted.")
    assert await put(store, body)
    await store.forget(ALICE, "secret", "request")

    found = await rows(owner, "SELECT key_id, digest FROM tombstones WHERE user_hash = %s", ALICE)
    ((kid, key),) = await rows(owner, "SELECT key_id, value FROM server_keys")

    assert kid == key_id(key) and len(key) == 32
    lines = parse_conversation(body).lines
    assert sorted(d for _, d in found) == sorted(turn_digest(key, t) for t in lines)
    assert {k for k, _ in found} == {kid}
    everything = json.dumps(await rows(owner, "SELECT * FROM tombstones"))
    assert SECRET not in everything and "Noted" not in everything and "alice" not in everything


async def test_replicas_racing_to_make_the_tombstone_key_agree_on_one(
    replicas: tuple[PgStore, PgStore], owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given no tombstone key yet, when two replicas need one at once (forgets of two users)
    a, b = replicas
    await seed(a, "alice")
    await seed(b, "bob")
    await asyncio.gather(a.forget(ALICE, "secret", "request"), b.forget(BOB, "secret", "request"))

    # Then both made their digests under the one key there is
    assert len(await rows(owner, "SELECT key_id FROM server_keys")) == 1
    assert len(await rows(owner, "SELECT DISTINCT key_id FROM tombstones")) == 1


async def test_forget_of_an_unknown_conversation_is_not_found_and_writes_nothing(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # A user never seen: no row is made for them
    with pytest.raises(NotFound):
        await store.forget(BOB, "never-posted", "request")
    assert await user_row(owner, BOB) is None
    # A user with other conversations
    await seed(store)
    with pytest.raises(NotFound):
        await store.forget(ALICE, "never-posted", "request")
    assert await store.receipts(ALICE) == []


async def test_repeating_a_forget_answers_the_same_receipt(store: PgStore) -> None:
    await seed(store)
    first = await store.forget(ALICE, "secret", "request")
    again = await store.forget(ALICE, "secret", "request")
    assert again == first
    assert await store.receipts(ALICE) == [first]


async def test_a_forget_whose_condition_no_longer_holds_removes_nothing(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given a conversation long past a retention, listed by a sweep, then resumed
    cutoff = datetime.now(UTC) - timedelta(days=30)
    old = conversation("alice", "old", f"Long ago {SECRET}.", "Ok.")
    assert await put(store, old)
    old["turns"].append(turn("user", f"Back to it: {KEPT}.", later(0)))
    assert await put(store, old)

    # When the sweep's forget checks its condition under the lock
    with pytest.raises(NotDue):
        await store.forget(ALICE, "old", "retention", functools.partial(expired, cutoff=cutoff))

    # Then the conversation stays whole, with no receipt and no tombstone
    assert [text for _, text in await stored(store, "alice", "old") or []] == [
        f"Long ago {SECRET}.",
        "Ok.",
        f"Back to it: {KEPT}.",
    ]
    assert await store.receipts(ALICE) == []
    assert await rows(owner, "SELECT * FROM tombstones") == []


async def test_a_forget_racing_posts_on_other_replicas_never_lets_the_text_back(
    replicas: tuple[PgStore, PgStore],
) -> None:
    a, b = replicas
    await seed(a)
    body = conversation("alice", "secret", f"The vault code is {SECRET}.", "Noted.")

    results = await asyncio.gather(
        *[put(a, body) for _ in range(6)],
        b.forget(ALICE, "secret", "request"),
        *[put(a, body) for _ in range(6)],
        return_exceptions=True,
    )

    receipt = results[6]
    assert isinstance(receipt, dict) and receipt["operation"] == "forget"
    posts = results[:6] + results[7:]
    assert all(isinstance(r, bool | Forgotten) for r in posts), posts  # no deadlock, no failure
    assert await a.conversation_ids(ALICE) == ["kept"]
    with pytest.raises(Forgotten):
        await put(b, body)


@pytest.mark.parametrize("holder", ["index flush", "users row"])
async def test_a_forget_and_a_post_meeting_another_transaction_of_the_user_do_not_deadlock(
    replicas: tuple[PgStore, PgStore],
    owner: psycopg.AsyncConnection[Any],
    pg_database: PgDatabase,
    holder: str,
) -> None:
    # Given a transaction of the user in progress (an index flush in the middle of its writes,
    # holding the user's index lock; or one holding the user's row FOR NO KEY UPDATE, as a
    # forget or a post's end does), a forget waiting for it, and a post of the same conversation
    # arriving meanwhile, held at its conversation's row
    a, b = replicas
    await seed(a)
    body = conversation("alice", "secret", f"The vault code is {SECRET}.", "Noted.", "More.")
    async with await psycopg.AsyncConnection.connect(pg_database.owner_url) as row_holder:
        await row_holder.execute(
            "SELECT 1 FROM conversations WHERE user_hash = %s FOR UPDATE", (ALICE,)
        )
        async with owner.transaction():
            if holder == "index flush":
                await owner.execute(index_lock(ALICE))
            else:
                await owner.execute(
                    "SELECT 1 FROM users WHERE user_hash = %s FOR NO KEY UPDATE", (ALICE,)
                )
            forgetting = asyncio.create_task(b.forget(ALICE, "secret", "request"))
            await waiting_on_locks(owner, 1)
            posting = asyncio.create_task(put(a, body))
            await waiting_on_locks(owner, 2)
            # When it ends as a flush does (its last statement updates the users row)
            async with asyncio.timeout(5):
                await owner.execute(
                    "UPDATE users SET passages = passages WHERE user_hash = %s", (ALICE,)
                )
        # and commits, then (once the forget took the row) the conversation's row is let go
        await asyncio.sleep(0.3)
        await row_holder.commit()

    # Then both finish: the forget first, and the post meets its tombstones for the old turns
    receipt, posted = await asyncio.gather(forgetting, posting, return_exceptions=True)
    assert isinstance(receipt, dict) and receipt["removed"]["turns"] == 2, receipt
    assert posted is True, posted
    assert await stored(a, "alice", "secret") == [(0, "More.")]


async def test_an_erase_meeting_an_index_flush_waits_for_it_without_deadlock(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given an index flush in the middle of its writes (holding the user's index lock), and an
    # erase of the user arriving meanwhile
    await seed(store)
    async with owner.transaction():
        await owner.execute(index_lock(ALICE))
        erasing = asyncio.create_task(store.erase(ALICE))
        await waiting_on_locks(owner, 1)

        # When the flush ends as a flush does (its last statement updates the users row)
        async with asyncio.timeout(5):
            await owner.execute(
                "UPDATE users SET passages = passages WHERE user_hash = %s", (ALICE,)
            )

    # Then the erase goes on once the flush committed, and erases everything
    receipt = await asyncio.wait_for(erasing, 10)
    assert receipt["removed"]["conversations"] == 2
    assert await store.conversation_ids(ALICE) == []


async def test_a_store_of_one_connection_forgets_and_erases(pg_database: PgDatabase) -> None:
    # Given a replica whose pool holds one connection, and no tombstone key made yet
    store = PgStore(Database(pg_database.app_url, 1), 0.1)
    await store.start()
    try:
        await seed(store)

        # When it forgets and erases (both need the key): no second connection is waited for
        forgot = await asyncio.wait_for(store.forget(ALICE, "secret", "request"), 3)
        erased = await asyncio.wait_for(store.erase(ALICE), 3)

        # Then both are done
        assert [r["receipt"] for r in await store.receipts(ALICE)] == [
            forgot["receipt"],
            erased["receipt"],
        ]
    finally:
        await store.close()


# --- erase and receipts ------------------------------------------------------------------------


async def test_erase_tombstones_every_turn_and_removes_everything_else(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given two conversations, a forget receipt and an audit line
    await seed(store)
    forgot = await store.forget(ALICE, "kept", "request")
    assert await put(store, conversation("alice", "kept2", f"The plan is {KEPT}.", "Ok."))
    await store.append_audit(ALICE, {"at": later(0), "query": KEPT}, await store.mark(ALICE))

    receipt = await store.erase(ALICE)

    assert receipt["operation"] == "erase" and receipt["user"] == ALICE
    assert receipt["removed"]["conversations"] == 2 and receipt["removed"]["turns"] == 4
    assert await store.conversation_ids(ALICE) == []
    assert await store.audit(ALICE) == []
    assert await store.receipts(ALICE) == [forgot, receipt]  # receipts outlive the erase
    (count,) = (await rows(owner, "SELECT count(*) FROM tombstones WHERE user_hash = %s", ALICE))[0]
    assert count == 6  # the forget's 2 and the erase's 4
    # and a later post stores only what was not erased
    old = conversation("alice", "kept2", f"The plan is {KEPT}.", "Ok.")
    with pytest.raises(Forgotten):
        await put(store, old)
    old["turns"].append(turn("user", "New start: quillfern project.", later()))
    assert await put(store, old)
    assert await stored(store, "alice", "kept2") == [(0, "New start: quillfern project.")]


async def test_erase_of_a_user_with_nothing_stored_answers_an_empty_receipt(
    store: PgStore,
) -> None:
    receipt = await store.erase(BOB)
    assert receipt["removed"] == {"conversations": 0, "turns": 0, "index_rows": 0}
    assert await store.receipts(BOB) == [receipt]
    assert await store.conversation_ids(BOB) == []


async def test_an_erase_waits_for_a_post_in_flight_and_a_post_after_it_meets_its_tombstones(
    replicas: tuple[PgStore, PgStore], owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given a post in flight on one replica (held, by another writer, at its conversation's lock)
    a, b = replicas
    await seed(a)
    late = conversation("alice", "late", f"Just now {SECRET}.", "Ok.")
    async with owner.transaction():
        await owner.execute(conversation_lock(ALICE, "late"))
        posting = asyncio.create_task(put(a, late))
        await waiting_on_locks(owner, 1)

        # When an erase comes to the other replica
        erasing = asyncio.create_task(b.erase(ALICE))
        await waiting_on_locks(owner, 2)
        await asyncio.sleep(0.2)
        assert not erasing.done()  # it waits for the post
    assert await posting is True
    receipt = await erasing

    # Then the erase took the post with it, and a post after it meets its tombstones
    assert receipt["removed"]["conversations"] == 3
    assert await a.conversation_ids(ALICE) == []
    with pytest.raises(Forgotten):
        await put(a, late)


async def test_receipts_list_every_forget_and_erase_without_text(store: PgStore) -> None:
    await seed(store)
    forgot = await store.forget(ALICE, "secret", "request")
    erased = await store.erase(ALICE)

    listed = await store.receipts(ALICE)

    assert [r["receipt"] for r in listed] == [forgot["receipt"], erased["receipt"]]
    assert all(r["user"] == ALICE for r in listed)
    text = json.dumps(listed)
    assert SECRET not in text and KEPT not in text and "alice" not in text
    assert await store.receipts(BOB) == []


# --- the audit ---------------------------------------------------------------------------------


def line(at: str, query: str = "q") -> dict[str, Any]:
    return {"at": at, "client": "c", "query": query, "outcome": "passages", "served": []}


async def test_an_audit_line_is_kept_unless_the_user_was_erased_since_the_mark(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # A user with no data: no line, and no row made for them
    await store.append_audit(BOB, line(later(0)), await store.mark(BOB))
    assert await store.audit(BOB) == [] and await user_row(owner, BOB) is None

    # A user with data: the line is kept
    await seed(store)
    mark = await store.mark(ALICE)
    await store.append_audit(ALICE, line(later(0), "first"), mark)
    assert [e["query"] for e in await store.audit(ALICE)] == ["first"]

    # A recall that overlapped an erase: it knows, and leaves no line
    await store.erase(ALICE)
    assert await store.erased_since(ALICE, mark) is True
    await store.append_audit(ALICE, line(later(0), "overlapped"), mark)
    assert await store.audit(ALICE) == []
    assert await store.erased_since(ALICE, await store.mark(ALICE)) is False


async def test_an_audit_line_waits_for_an_erase_in_flight_and_is_then_dropped(
    store: PgStore, owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given a recall's mark, then an erase in flight (its row lock and count, not yet committed)
    await seed(store)
    mark = await store.mark(ALICE)
    async with owner.transaction():
        await owner.execute("SELECT 1 FROM users WHERE user_hash = %s FOR UPDATE", (ALICE,))
        await owner.execute(
            "UPDATE users SET erasures = erasures + 1 WHERE user_hash = %s", (ALICE,)
        )
        # When the recall's audit line is appended meanwhile
        appending = asyncio.create_task(store.append_audit(ALICE, line(later(0)), mark))
        await waiting_on_locks(owner, 1)
    await appending

    # Then it waited for the erase, saw it, and wrote nothing
    assert await store.audit(ALICE) == []


async def test_the_audit_reads_since_a_time_and_pages_newest_first(store: PgStore) -> None:
    await seed(store)
    mark = await store.mark(ALICE)
    stamps = [f"2026-11-0{n}T10:00:00Z" for n in range(1, 6)]
    for n, at in enumerate(stamps):
        await store.append_audit(ALICE, line(at, f"q{n}"), mark)

    assert [e["query"] for e in await store.audit(ALICE)] == ["q0", "q1", "q2", "q3", "q4"]
    assert [e["query"] for e in await store.audit(ALICE, "2026-11-03T10:00:00Z")] == [
        "q2",
        "q3",
        "q4",
    ]
    first, cursor = await store.audit_page(ALICE, 2)
    second, cursor2 = await store.audit_page(ALICE, 2, cursor)
    third, end = await store.audit_page(ALICE, 2, cursor2)
    assert [e["query"] for e in first + second + third] == ["q4", "q3", "q2", "q1", "q0"]
    assert cursor is not None and cursor2 is not None and end is None
    whole, more = await store.audit_page(ALICE, 5)  # exactly the rest: no next page
    assert len(whole) == 5 and more is None
    assert await store.audit_page(BOB, 5) == ([], None)


async def test_an_audit_line_quoting_a_nul_character_is_kept(store: PgStore) -> None:
    await seed(store)
    await store.append_audit(ALICE, line(later(0), "a\x00b"), await store.mark(ALICE))
    assert [e["query"] for e in await store.audit(ALICE)] == ["a\ufffdb"]


# --- retention ---------------------------------------------------------------------------------


async def test_a_sweep_forgets_expired_conversations_and_prunes_old_audit_lines(
    replicas: tuple[PgStore, PgStore],
) -> None:
    a, b = replicas
    old = conversation("alice", "old", f"Long ago {SECRET}.", "Ok.")
    recent = {"user": "alice", "conversation_id": "recent", "turns": [turn("user", KEPT, later(0))]}
    for body in (old, recent, conversation("bob", "bobs", "Bob's old one.", day=1)):
        assert await put(a, body)
    mark = await a.mark(ALICE)
    await a.append_audit(ALICE, line("2020-01-01T00:00:00Z", SECRET), mark)
    await a.append_audit(ALICE, line(later(0), KEPT), mark)

    assert await b.sweep(30) == 2

    assert await a.conversation_ids(ALICE) == ["recent"] and await a.conversation_ids(BOB) == []
    assert [(r["conversation_id"], r["reason"]) for r in await a.receipts(ALICE)] == [
        ("old", "retention")
    ]
    assert [e["query"] for e in await a.audit(ALICE)] == [KEPT]
    with pytest.raises(Forgotten):
        await put(a, old)  # the same tombstone rule
    assert await b.sweep(30) == 0


# --- with the index ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder(int8=True)  # the tests' shared model cache (conftest.py)


@pytest.fixture
async def indexed_replicas(
    pg_database: PgDatabase, embedder: Embedder
) -> AsyncIterator[tuple[PgStore, PgStore]]:
    """Two replicas with their index runs and recall (recall/pg/index.py, search.py)."""
    opened = []
    for _ in range(2):
        database = Database(pg_database.app_url, 4)
        runner = IndexRunner(database, embedder, debounce=0.1, concurrency=1, timeout=120)
        store = PgStore(database, 0.1, runner, PgSearch(database, embedder))
        await store.start()
        opened.append(store)
    yield opened[0], opened[1]
    for store in opened:
        await store.close()


async def indexed(store: PgStore, user: str) -> None:
    for _ in range(1200):
        if await store.indexing() == 0 and await store.state(user) == "ready":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not indexed in time")


async def test_a_forget_on_one_replica_removes_the_index_rows_every_replica_recalls_from(
    indexed_replicas: tuple[PgStore, PgStore], owner: psycopg.AsyncConnection[Any]
) -> None:
    # Given two conversations, indexed
    a, b = indexed_replicas
    await seed(a)
    await indexed(a, ALICE)
    assert SECRET in (await b.recall(ALICE, SECRET)).text
    counted = "SELECT count(*) FROM chunks WHERE user_hash = %s AND conversation_id = %s"
    ((chunks,),) = await rows(owner, counted, ALICE, "secret")

    # When one replica forgets one of them
    receipt = await a.forget(ALICE, "secret", "request")

    # Then its receipt counts its index rows, none is left, and the other replica recalls none
    assert chunks > 0 and receipt["removed"]["index_rows"] == chunks
    assert await rows(owner, counted, ALICE, "secret") == [(0,)]
    assert SECRET not in (await b.recall(ALICE, SECRET)).text
    assert KEPT in (await b.recall(ALICE, KEPT)).text
    # and an erase counts the rest
    ((rest,),) = await rows(owner, "SELECT count(*) FROM chunks WHERE user_hash = %s", ALICE)
    assert (await b.erase(ALICE))["removed"]["index_rows"] == rest > 0
    assert await a.state(ALICE) == "none"


async def test_recalls_asking_for_repair_while_a_run_is_due_let_it_finish(
    indexed_replicas: tuple[PgStore, PgStore],
) -> None:
    # Given conversations posted, their index run (long enough to be asked about) due
    a, b = indexed_replicas
    await seed(a)
    words = " ".join(f"word{n}" for n in range(60))
    for n in range(60):
        assert await put(a, conversation("alice", f"bulk{n}", f"Note {n}: {words}.", "Ok."))

    # When recalls on the other replica keep finding no index yet, and ask for a repair each
    # time (as the server does on "unindexed")
    async def recall_until_ready() -> None:
        while await b.state(ALICE) != "ready":
            b.repair(ALICE)
            await asyncio.sleep(0.05)

    # Then the run is not restarted under them: the index gets ready, and recalls find it
    await asyncio.wait_for(recall_until_ready(), 60)
    assert SECRET in (await b.recall(ALICE, SECRET)).text


# --- the store's faults ------------------------------------------------------------------------


async def test_a_store_starts_while_the_database_is_down_and_fails_its_calls_as_unavailable() -> (
    None
):
    store = PgStore(Database("postgresql://recall_app:x@127.0.0.1:9/recall", 1), 0.1)
    await store.start()  # a replica starts; /readyz says why it is not ready
    try:
        assert await store.ready() == "database"
        with pytest.raises(StoreUnavailable):
            await put(store, conversation("alice", "c1", "Hello."))
    finally:
        await store.close()


async def test_a_store_refuses_to_start_as_the_tables_owner(pg_database: PgDatabase) -> None:
    store = PgStore(Database(pg_database.owner_url, 1), 0.1)
    try:
        with pytest.raises(ConfigError, match="owns the tables"):
            await store.start()
    finally:
        await store.close()


async def test_a_started_store_is_ready(store: PgStore) -> None:
    assert await store.ready() is None
    assert await store.indexing() == 0 and await store.index_lag() == (0, 0.0)
    await seed(store)
    assert await store.indexing() == 1 and (await store.index_lag())[0] == 1
