"""Where each missed question is lost (issue 34): a history's questions through the embedded
engine in this process, stage by stage as ``recall.ranking.pipeline.rank`` runs them, so a
setting that loses a language can be told apart from one whose floor empties its answers.

    python -m benchmark.languages.stages                              # every language, default
    python -m benchmark.languages.stages --history zh --env EMBED_MODEL=multilingual-e5-small

Per k (3 and 8, the benchmark servers' settings) a missed question counts at its first failing
stage: *nothing found* (the similarity floor and the covered share: ``nothing_relevant``),
*neither leg* (its passage in neither the BM25 pool nor the dense leg's top candidates), *pool
order* (in the BM25 pool, cut from the lexical leg by the pool's order, covered share + meaning x
cosine, and not in the dense leg), *fusion* (in a leg, not in the top k). "Its passage" is any
indexed piece holding the answer. *No vector* counts those pieces indexed without one (a text the
engine died on alone: cosine 0 in every leg). The best cosine's median shows the model's scale.
*Never-mentioned shown*: of the language's questions about what its history never touches
(``Language.never_mentioned``), those answered with passages presented as a match.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmark.history import History
from benchmark.languages import LANGUAGES
from benchmark.locomo import returned_passages
from benchmark.run import CAP, HISTORIES, env_setting
from recall.domain.answers import NOTHING_FOUND
from recall.domain.conversation import parse_conversation, user_dir_name
from recall.files.engines.embedded.engine import EmbeddedEngine
from recall.files.engines.embedded.source import SqliteSource
from recall.files.engines.embedded.store import connect, db_path
from recall.files.layout import write_conversation
from recall.indexing.configured import configured_reranker
from recall.models import load_embedder
from recall.ranking.pipeline import lexical_leg, run_blocking
from recall.ranking.search import LEXICAL_POOL, Lexical, dense, nothing_relevant, order_pool
from recall.ranking.text import Query
from recall.settings import Settings

KS = (3, 8)
STAGES = ("nothing found", "neither leg", "pool order", "fusion")
USER = "bench-user"


def engines() -> dict[int, EmbeddedEngine]:
    """The embedded engine at each k, as the benchmark servers run it (EMBED_MODEL,
    RECALL_MIN_SIMILARITY and RECALL_RERANK from the environment), sharing one model."""
    settings = Settings(engine="embedded")
    embedder = load_embedder(None, model=settings.embed_model)
    reranker = configured_reranker(settings)  # RECALL_RERANK
    return {
        k: EmbeddedEngine(
            embedder,
            k=k,
            candidates=settings.recall_candidates,
            max_chars=CAP[k],
            min_similarity=settings.min_similarity(),
            reranker=reranker,
        )
        for k in KS
    }


def stage(engine: EmbeddedEngine, home: Path, query_text: str, answer: str) -> dict[str, Any]:
    """Where ``answer``'s passages stand at each stage of one recall (no verdict yet)."""
    path = db_path(home)
    con = connect(path, create=False)
    try:
        right = {
            rowid
            for (rowid,) in con.execute(
                "SELECT id FROM chunks WHERE recalled = 0 AND instr(text, ?) > 0", (answer,)
            )
        }
        unvectored = con.execute(
            "SELECT count(*) FROM chunks WHERE recalled = 0 AND instr(text, ?) > 0 "
            "AND length(vec) > 0 AND vec = zeroblob(length(vec))",
            (answer,),
        ).fetchone()[0]
        query = Query.parse(query_text)
        qvec = engine.embedder.embed_query([query.text])[0]
        # The engine's own matrix (its cache), as its recall reads it.
        source = SqliteSource(con, lambda: engine._vectors(con, str(path)))
        vectors = run_blocking(source.vectors())
        candidates = engine.ranking.candidates
        by_words = (
            run_blocking(lexical_leg(source, query, candidates * LEXICAL_POOL))
            if query.terms
            else Lexical([], [], False)
        )
        similarity = vectors.matrix @ qvec
        by_meaning, best = dense(vectors.ids, similarity, candidates)
        ordered = order_pool(by_words, vectors.ids, similarity, candidates=candidates)
    finally:
        con.close()
    return {
        "nothing": nothing_relevant(by_words, best, engine.ranking.min_similarity),
        "in_pool": bool(right & set(by_words.pool)),
        "in_lexical": bool(right & set(ordered)),
        "in_dense": bool(right & set(by_meaning)),
        "best": best,
        "unvectored": unvectored,
    }


def verdict(found: dict[str, Any], hit: bool) -> str:
    """The first failing stage of a missed question ("hit" when it was found)."""
    if hit:
        return "hit"
    if found["nothing"]:
        return "nothing found"
    if not (found["in_pool"] or found["in_dense"]):
        return "neither leg"
    if found["in_pool"] and not found["in_lexical"] and not found["in_dense"]:
        return "pool order"
    return "fusion"


async def measure(
    history: History,
    workdir: Path,
    by_k: dict[int, EmbeddedEngine],
    never: tuple[str, ...] = (),
) -> list[dict]:
    """Every question, long and short, at each k: its verdict and what the stages saw; and each
    ``never``-mentioned question at each k: whether passages were shown as a match."""
    home = workdir / user_dir_name(USER)
    for body in history.conversations:
        write_conversation(home, parse_conversation(body))
    await by_k[KS[0]].index(home)  # one index for every k
    rows = []
    for mode in ("long", "short"):
        for q in history.questions:
            text = q.question if mode == "long" else q.short_query
            for k, engine in by_k.items():
                hit = q.answer in (await engine.recall(home, text)).text
                found = stage(engine, home, text, q.answer)
                rows.append({"k": k, "mode": mode, "verdict": verdict(found, hit), **found})
    for text in never:
        for k, engine in by_k.items():
            answer = (await engine.recall(home, text)).text or NOTHING_FOUND
            rows.append({"k": k, "mode": "never", "shown": returned_passages(answer)})
    return rows


def summary(name: str, rows: list[dict[str, Any]]) -> list[str]:
    """One table row per k: hits long / short, then the misses by stage."""
    out = []
    for k in KS:
        never = [r["shown"] for r in rows if r["k"] == k and r["mode"] == "never"]
        at_k = [r for r in rows if r["k"] == k and r["mode"] != "never"]
        counts = Counter(r["verdict"] for r in at_k)
        hits = [
            sum(r["verdict"] == "hit" for r in at_k if r["mode"] == m) for m in ("long", "short")
        ]
        per_mode = len(at_k) // 2
        best = statistics.median(r["best"] for r in at_k)
        unvectored = sum(r["unvectored"] > 0 for r in at_k)
        out.append(
            f"| {name} | {k} | {hits[0]} / {hits[1]} of {per_mode} | "
            + " | ".join(str(counts[s]) for s in STAGES)
            + f" | {unvectored} | {best:.3f} | {sum(never)} of {len(never)} |"
        )
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", nargs="+", default=list(LANGUAGES), choices=sorted(HISTORIES))
    parser.add_argument("--size", type=int, default=80)
    parser.add_argument("--env", action="append", default=[], type=env_setting, metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    os.environ.update(dict(args.env))
    by_k = engines()
    lines = [
        f"Settings: {', '.join(f'{k}={v}' for k, v in args.env) or 'defaults'}",
        "",
        "| history | k | hits long / short | " + " | ".join(STAGES) + " | no vector | best cosine "
        "| never-mentioned shown |",
        "| --- | --- | --- | " + " | ".join("---" for _ in STAGES) + " | --- | --- | --- |",
    ]
    for name in args.history:
        make, questions = HISTORIES[name]
        history = make(args.size, seed=7, questions=questions)
        with tempfile.TemporaryDirectory(prefix="bench-stages-") as tmp:
            never = LANGUAGES[name]().never_mentioned if name in LANGUAGES else ()
            lines += summary(name, asyncio.run(measure(history, Path(tmp), by_k, never)))
        print(lines[-1], file=sys.stderr, flush=True)  # progress: a run takes minutes
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
