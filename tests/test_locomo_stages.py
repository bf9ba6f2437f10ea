"""benchmark/locomo_stages.py: each evidence turn missing from the ranked list is laid to the
first stage that held it, on hand-made lists."""

from __future__ import annotations

from benchmark.locomo_stages import Lists, lost_at, next_to_hit

# Hits at turns 5 and 9 of session-1; rows 1-6 are pieces of other turns, each in one list.
LISTS = Lists(
    hits={("session-1", "D1-5"), ("session-1", "D1-9")},
    places={("session-1", 5), ("session-1", 9)},
    read_before={("session-1", "D1-5"), ("session-1", "D1-6"), ("session-1", "D1-9")},
    fused={1, 2},
    widened={3},
    pool={4},
    dense_rank={1: 3, 2: 9, 3: 12, 4: 60, 5: 140, 6: 700},
)


def test_a_missing_evidence_turn_counts_at_the_first_stage_that_held_it() -> None:
    # Given evidence turns: a hit, one next to a hit ranked before the tenth (row 1), one
    # fused (row 2), one in the dense rows appended (3), one in the BM25 pool only (4), one
    # in no list (5), and one next to a hit but ranked past the tenth (6)
    turns = {
        ("session-1", "D1-5"): {10: 5},
        ("session-1", "D1-6"): {1: 6},
        ("session-2", "D2-1"): {2: 1},
        ("session-2", "D2-3"): {3: 3},
        ("session-2", "D2-5"): {4: 5},
        ("session-3", "D3-1"): {5: 1},
        ("session-1", "D1-8"): {6: 8},
    }

    # When each is laid to its stage
    stages = [lost_at(turn, pieces, LISTS) for turn, pieces in turns.items()]

    # Then the hit is not lost, and the rest are each at their own stage; the last, next to a
    # hit but never ranked before the tenth, is nowhere (its dense rank given)
    assert stages == [
        None,
        ("skipped", None),
        ("fused, past 10", None),
        ("dense only, past fused", None),
        ("BM25 pool only", None),
        ("nowhere", 140),
        ("nowhere", 700),
    ]


def test_a_turn_counts_as_next_to_a_hit_only_in_the_hits_conversation() -> None:
    assert next_to_hit(("session-1", "D1-4"), {7: 4}, LISTS)
    assert next_to_hit(("session-1", "D1-10"), {8: 10}, LISTS)
    assert not next_to_hit(("session-2", "D2-4"), {9: 4}, LISTS)
    assert not next_to_hit(("session-1", "D1-7"), {11: 7}, LISTS)
