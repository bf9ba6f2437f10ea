"""Where LoCoMo's evidence turns are lost in the ranked list at k=10 (issue 34): every question
through the embedded engine in this process, stage by stage as ``recall.ranking.pipeline.rank``
runs them at the field's settings (RECALL_K 10, RECALL_CANDIDATES 32).

    python -m benchmark.locomo_stages ../shared/data/locomo-dev.json

Each evidence turn not among the ten ranked hits' own turns is counted at the first stage that
holds it (a turn is held when one of its pieces is):

- *skipped*: ranked before the tenth hit, but right next to a hit (``search.choose`` shows it
  as that hit's neighbour; the field's metrics count only hits' own turns);
- *fused, past 10*: in the fused list (the 8-deep dense and lexical legs), ranked after it;
- *dense only, past the fused part*: in the dense leg's top RECALL_CANDIDATES only (appended
  after the fused rows in cosine order), ranked after the tenth hit;
- *BM25 pool only*: in the BM25 pool (LEXICAL_DEPTH x LEXICAL_POOL rows), not the lexical leg's
  top LEXICAL_DEPTH, not the dense leg's top RECALL_CANDIDATES;
- *nowhere*: in none of these; its rank in the whole dense leg is given in buckets.

Beside them, on the same questions: R@10 of each leg alone (its first 10 distinct turns) and of
the ranked list, and the ranked list's R@10 counting a turn next to a hit as found (what the
agent reads, neighbours included). No data text is printed: counts only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from benchmark.locomo import DEFAULT_DATA, SETTINGS_AT, LocomoHistory, Question, load_locomo
from recall.domain.conversation import parse_conversation, user_dir_name
from recall.files.engines.embedded.engine import EmbeddedEngine
from recall.files.engines.embedded.source import SqliteSource
from recall.files.engines.embedded.store import connect, db_path
from recall.files.layout import write_conversation
from recall.models import load_embedder
from recall.ranking.pipeline import fused_legs, lexical_leg, run_blocking
from recall.ranking.search import (
    LEXICAL_DEPTH,
    LEXICAL_POOL,
    Lexical,
    choose,
    order_pool,
    ranked_hits,
)
from recall.ranking.text import Query
from recall.settings import MODEL_MIN_SIMILARITY

K = 10
STAGES = ("skipped", "fused, past 10", "dense only, past fused", "BM25 pool only", "nowhere")
LISTS = ("R@10", "R@10 neighbours", "fused R@10", "dense R@10", "lexical R@10", "bm25 R@10")
DENSE_BUCKETS = (64, 128, 256, 512)  # "nowhere" turns by their rank in the whole dense leg

Turn = tuple[str, str]  # (conversation, turn id), as the server stores them


def engine_at_k10() -> EmbeddedEngine:
    from recall.embedder import PACKAGED

    settings = SETTINGS_AT[K]
    return EmbeddedEngine(
        load_embedder(None, model=PACKAGED),
        min_similarity=MODEL_MIN_SIMILARITY[PACKAGED],
        k=int(settings["RECALL_K"]),
        candidates=int(settings["RECALL_CANDIDATES"]),
        max_chars=int(settings["MAX_RESULT_CHARS"]),
    )


def distinct_turns(rowids: Iterable[int], where: dict[int, Turn], k: int = K) -> list[Turn]:
    """The first ``k`` distinct turns of ``rowids`` in order."""
    return list(dict.fromkeys(where[r] for r in rowids))[:k]


def recall_at(ranked: Sequence[Turn], evidence: Sequence[Turn]) -> float:
    top = set(ranked)
    return sum(turn in top for turn in evidence) / len(evidence) if evidence else 0.0


class Lists(NamedTuple):
    """One recall's lists, as the stages read them."""

    hits: set[Turn]  # the ranked hits' own turns
    places: set[tuple[str, int]]  # (conversation, seq) of each hit
    read_before: set[Turn]  # the turns ranked up to the tenth hit (skips included)
    fused: set[int]  # rowids of the fused list (8 + 8 legs)
    widened: set[int]  # the dense leg's rows appended after the fused ones
    pool: set[int]  # the BM25 pool
    dense_rank: dict[int, int]  # each rowid's rank in the whole dense leg, from 1


def next_to_hit(turn: Turn, pieces: dict[int, int], lists: Lists) -> bool:
    """Whether ``turn`` (its pieces: rowid -> seq) is right next to a hit's."""
    return any((turn[0], seq + d) in lists.places for seq in pieces.values() for d in (-1, 1))


def lost_at(turn: Turn, pieces: dict[int, int], lists: Lists) -> tuple[str, int | None] | None:
    """The first stage holding ``turn`` when it is no hit (with its dense rank when nowhere),
    None when it is one."""
    if turn in lists.hits:
        return None
    rows = set(pieces)
    if next_to_hit(turn, pieces, lists) and turn in lists.read_before:
        return ("skipped", None)
    for stage, held in (
        ("fused, past 10", lists.fused),
        ("dense only, past fused", lists.widened),
        ("BM25 pool only", lists.pool),
    ):
        if rows & held:
            return (stage, None)
    return ("nowhere", min((lists.dense_rank[r] for r in rows), default=None))


def stages(engine: EmbeddedEngine, home: Path, question: Question) -> dict[str, Any]:
    """Where each evidence turn of ``question`` stands in one recall at k=10."""
    path = db_path(home)
    con = connect(path, create=False)
    try:
        where: dict[int, Turn] = {}
        seq_of: dict[int, int] = {}
        for rowid, conv, turn, seq in con.execute(
            "SELECT id, conv, turn, seq FROM chunks WHERE recalled = 0"
        ):
            where[rowid], seq_of[rowid] = (conv, turn), seq
        query = Query.parse(question.text)
        qvec = engine.embedder.embed_query([query.text])[0]
        source = SqliteSource(con, lambda: engine._vectors(con, str(path)))
        vectors = run_blocking(source.vectors())
        by_words = (
            run_blocking(lexical_leg(source, query, LEXICAL_DEPTH * LEXICAL_POOL))
            if query.terms
            else Lexical([], [], False)
        )
        similarity = vectors.matrix @ qvec
        legs = fused_legs(by_words, vectors.ids, similarity, engine.ranking)
        if legs is None:
            return {"nothing": True}
        fused, widened = legs
        rows = run_blocking(source.candidates([*fused, *widened]))
        ranking = ranked_hits(
            rows,
            fused,
            newest=vectors.newest,
            half_life_days=engine.ranking.half_life_days,
            months=query.months,
            ids=query.ids,
            after=widened,
        )
        chosen = choose(ranking, K)
        ranked = ranking.all()
        whole_dense = [int(vectors.ids[i]) for i in np.argsort(-similarity, kind="stable")]
        whole_lexical = order_pool(by_words, vectors.ids, similarity, candidates=len(by_words.pool))
    finally:
        con.close()
    hit_turns = [(h.conv, h.turn) for h in chosen]
    # Where the tenth hit stood in the ranked list: what ranks before it was read for the list.
    last = ranked.index(chosen[-1]) if len(chosen) == K else len(ranked) - 1
    lists = Lists(
        hits=set(hit_turns),
        places={(h.conv, h.seq) for h in chosen},
        read_before={where[h.id] for h in ranked[: last + 1]},
        fused=set(fused),
        widened=set(widened),
        pool=set(by_words.pool),
        dense_rank={rowid: n for n, rowid in enumerate(whole_dense, start=1)},
    )
    pieces = {
        turn: {r: seq_of[r] for r, t in where.items() if t == turn} for turn in question.turns
    }
    lost = [
        stage
        for turn in question.turns
        if (stage := lost_at(turn, pieces[turn], lists)) is not None
    ]
    adjacent_found = sum(
        turn in lists.hits or next_to_hit(turn, pieces[turn], lists) for turn in question.turns
    )
    evidence = question.turns
    return {
        "nothing": False,
        "lost": lost,
        "evidence": len(evidence),
        "R@10": recall_at(hit_turns, evidence),
        "R@10 neighbours": adjacent_found / len(evidence) if evidence else 0.0,
        "dense R@10": recall_at(distinct_turns(whole_dense, where), evidence),
        "lexical R@10": recall_at(distinct_turns(whole_lexical, where), evidence),
        "bm25 R@10": recall_at(distinct_turns(by_words.pool, where), evidence),
        "fused R@10": recall_at(
            distinct_turns(sorted(fused, key=lambda r: (-fused[r], r)), where), evidence
        ),
    }


async def measure(histories: list[LocomoHistory], workdir: Path) -> list[dict[str, Any]]:
    engine = engine_at_k10()
    rows = []
    for history in histories:
        home = workdir / user_dir_name(history.user)
        for body in history.bodies:
            write_conversation(home, parse_conversation(body))
        await engine.index(home)
        for question in history.questions:
            rows.append(stages(engine, home, question) | {"category": question.category})
        print(f"{history.user}: {len(history.questions)} questions", file=sys.stderr, flush=True)
    return rows


def bucket(rank: int | None) -> str:
    if rank is None:
        return "no piece"
    for top in DENSE_BUCKETS:
        if rank <= top:
            return f"dense rank <= {top}"
    return f"dense rank > {DENSE_BUCKETS[-1]}"


def report(rows: list[dict[str, Any]]) -> str:
    asked = [r for r in rows if not r["nothing"]]
    lost = [entry for r in asked for entry in r["lost"]]
    counts = Counter(stage for stage, _ in lost)
    evidence = sum(r["evidence"] for r in asked)
    lines = [
        f"questions {len(rows)} (nothing found: {len(rows) - len(asked)}), evidence turns "
        f"{evidence}, not among the 10 hits: {len(lost)}",
        "",
        "| stage | evidence turns lost |",
        "| --- | --- |",
        *(f"| {stage} | {counts[stage]} |" for stage in STAGES),
        "",
        "nowhere, by dense rank: "
        + ", ".join(
            f"{name} {n}"
            for name, n in sorted(Counter(bucket(r) for s, r in lost if s == "nowhere").items())
        ),
        "",
        "| list | R@10 (mean over questions) |",
        "| --- | --- |",
    ]
    for name in LISTS:
        mean = sum(r[name] for r in asked) / len(rows)
        lines.append(f"| {name} | {mean:.3f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    histories = load_locomo(args.data)
    with tempfile.TemporaryDirectory(prefix="bench-locomo-stages-") as tmp:
        rows = asyncio.run(measure(histories, Path(tmp)))
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
