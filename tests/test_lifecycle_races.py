"""A forget racing other work, over real HTTP on the same stores and engines as
tests/test_lifecycle.py (its module's servers, fixtures and helpers): posts of the same
conversation, an index run that has read the conversation. The forgotten text never comes back.

A module of its own so that `--dist loadscope` runs these two long tests beside the rest of the
lifecycle suite, in another worker, not after it.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import test_lifecycle
from conftest import Server, conversation, turn, wait_for
from test_lifecycle import KEPT, SECRET, forget, index_bytes, is_stored, recall, seed

# The lifecycle suite's fixtures, here with servers of this module's own (module-scoped)
server = test_lifecycle.server
user = test_lifecycle.user


async def test_a_forget_racing_posts_of_the_same_conversation_never_lets_the_text_back(
    server: Server, user: str
) -> None:
    seed(server, user)
    body = conversation(user, "secret", f"The vault code word is {SECRET}.", "Noted.")
    statuses: list[int] = []
    with ThreadPoolExecutor(6) as pool:
        posts = [pool.submit(server.post, body) for _ in range(10)]
        forgot = pool.submit(forget, server, user, "secret")
        posts += [pool.submit(server.post, body) for _ in range(10)]
        statuses = [p.result()[0] for p in posts]
    assert forgot.result()[0] == 200
    assert set(statuses) <= {202, 410}

    assert not is_stored(server, user, "secret")
    server.wait_indexed(user)
    assert SECRET not in await recall(server, user, SECRET)
    assert SECRET.encode() not in index_bytes(server, user)


async def test_a_forget_racing_an_index_run_never_lets_the_text_back(
    server: Server, user: str
) -> None:
    seed(server, user)
    # Given an index run that has read a new conversation holding the word and is still busy
    # (embedding) when the forget arrives: funes' stand-in waits between reading and writing;
    # the embedded engine reads "a-fresh" first, then embeds it with a long "b-bulk".
    if server.env["ENGINE"] == "funes":
        server.fake_funes.control(index_write_sleep=2)  # type: ignore[attr-defined]
    bulk_text = " ".join(f"word{j % 997}" for j in range(140))
    bulk = {
        "user": user,
        "conversation_id": "b-bulk",
        "turns": [
            # 20 pieces of 1,000 characters: embedding them outlasts the forget's 0.8 s tenfold
            # here (0.3 s a piece), and still on a machine five times faster
            turn("user", f"{n} {bulk_text}", f"2026-10-10T09:{n:02d}:00Z")
            for n in range(20)
        ],
    }
    fresh = conversation(user, "a-fresh", f"Again {SECRET} here.", "Ok.", day=10)
    try:
        assert server.post(bulk)[0] == 202
        assert server.post(fresh)[0] == 202
        time.sleep(0.8)  # past the debounce: the run has started and read the sources

        # When the conversation is forgotten meanwhile
        assert forget(server, user, "a-fresh")[0] == 200
        assert forget(server, user, "secret")[0] == 200
    finally:
        if server.env["ENGINE"] == "funes":
            server.fake_funes.control()  # type: ignore[attr-defined]

    # Then once every run is over, neither recall nor the index holds the word
    server.wait_indexed(user)
    wait_for(lambda: server.health()["indexing"] == 0, timeout=120)
    assert SECRET not in await recall(server, user, SECRET)
    assert SECRET.encode() not in index_bytes(server, user)
    assert KEPT in await recall(server, user, KEPT)
