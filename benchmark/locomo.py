"""LoCoMo: real, very long two-person histories, asked through the tool (issue 9).

    python -m benchmark.run --locomo ../shared/data/locomo-dev.json   # the recorded run
    python -m benchmark.locomo --fast ../shared/data/locomo-dev.json   # in-process, minutes
    python -m benchmark.locomo --fast --store postgres ...  # both stores in one run, compared

LoCoMo (Maharana et al., ACL 2024, github.com/snap-research/locomo) is research data with its own
terms: it stays out of the repository. Only figures are committed (results/locomo-<engine>.json);
the misses, which quote questions and turns, go to results/*.local.json, which git ignores.

Loading, fixed so that figures compare across runs and with the held-out histories:
- each history is one user (its `sample_id`); each `session_N` one conversation `session-N`;
- a turn is `"<speaker>: <text>"`, role `user` for `speaker_a` and `assistant` for `speaker_b`,
  `ts` the session's `session_N_date_time` in UTC (every turn of a session the same), id the
  `dia_id` with `:` as `-`. Shared images count by their `text` only (no caption);
- the questions: every `qa` entry of category 1-4 with a non-empty `evidence` list, asked as is.

Metrics, per category and overall:
- hit@k: the tool's answer contains, lower-cased with whitespace collapsed, the first 60
  characters of the text (without the speaker) of at least one of the question's evidence turns;
- evidence recall@k: per question, the share of its evidence turns found by the same rule,
  averaged over the questions (the LoCoMo paper's retrieval recall, task_eval/evaluation_stats.py);
- the field's metrics, from the passages the server served in rank order (the recall audit's
  `served`: each passage's own conversation and turn, never its neighbours), at RANKED's
  settings (k=10, no passage cut): turn-level R@5 and R@10 as the LoCoMo paper computes them
  (per question, the share of its evidence turns among the top k ranked turns, averaged),
  turn-level NDCG@10 (binary relevance on the evidence turns) and session-level hit@1 and
  hit@5 (the first k distinct sessions in rank order hold an evidence turn's session). The
  hit@k above reads the answer's text, neighbours included, and reads higher (docs: the shared
  pitfalls, 30);
- false positives: the share of queries with nothing to find that still got passages presented as
  a match (not "Nothing relevant found ...", nor only "No earlier conversation mentions ..."):
  each history's category-5 (adversarial) questions, and questions about things the history
  never mentions (OFF_TOPIC, kept only where none of their terms occur);
- near misses: the share of those queries answered with passages under the near-miss label
  (recall.domain.answers.NEAR_MISSES: the query's identifiers are in no conversation, the
  passages are the closest to the rest of it), counted apart: they are not presented as a match.

k=3 uses the default settings, k=8 the issue's (RECALL_CANDIDATES 32, MAX_RESULT_CHARS 8000),
k=10 the field's metrics' (RECALL_CANDIDATES 32, a character cap no answer reaches).

Through a server (not --fast), `--store postgres` runs the server on STORE=postgres (a
PostgreSQL of its own, loaded by POST /turns) and `--server-tree PATH` starts the server of
another checkout (its .venv), so one version's metrics measure another version's ranking;
`--out F` writes the figures to F and each answer's SHA-256 (with its served passages) to
F.answers.local.json, for benchmark/compare.py. The model: this process's EMBED_MODEL, which the
servers inherit (`EMBED_MODEL=multilingual-e5-small python -m benchmark.locomo ...`); the
figures name it (`embed_model`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastmcp import Client

from benchmark.common import (
    INDEX_TIMEOUT,
    answer_record,
    load_by_backfill,
    machine,
    postgres,
    timing,
    write_out,
)
from devtools.testing import ROOT, LocalServer, make_server, server_command
from recall.app.answers import MAX_QUERY_CHARS
from recall.domain.answers import (
    MORE_MATCH,
    NEAR_MISSES,
    NEVER_MENTIONED,
    NO_MEMORY,
    NOT_YET,
    NOTHING_FOUND,
    UNAVAILABLE,
    Recalled,
)
from recall.domain.conversation import parse_conversation, user_dir_name
from recall.embedder import PACKAGED
from recall.files.engines.base import Engine
from recall.files.layout import write_conversation

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
RESULTS = ROOT / "benchmark" / "results"

# LoCoMo's category numbers, in the order the table shows them.
CATEGORIES = {4: "single-hop", 2: "temporal", 1: "multi-hop", 3: "open-domain"}
ADVERSARIAL = 5
KEY_CHARS = 60  # an evidence turn counts as returned when its first 60 characters are
KS = (3, 8)
# Each k's settings, as environment variables (the server) and engine arguments (in-process).
SETTINGS_AT = {
    3: {"RECALL_K": "3", "RECALL_CANDIDATES": "8", "MAX_RESULT_CHARS": "4000"},
    8: {"RECALL_K": "8", "RECALL_CANDIDATES": "32", "MAX_RESULT_CHARS": "8000"},
    10: {"RECALL_K": "10", "RECALL_CANDIDATES": "32", "MAX_RESULT_CHARS": "200000"},
}
# The ranked list the field's metrics read: the served passages of the k=10 run, in rank order.
RANKED = 10
TURN_RECALL_AT = (5, 10)  # turn-level R@k
NDCG_AT = 10  # turn-level NDCG@k, binary relevance on the evidence turns
SESSION_HIT_AT = (1, 5)  # session-level hit@k
MISS_EXAMPLES = 5  # per category, printed

SESSION_KEY = re.compile(r"session_(\d+)")
DATE_FORMAT = "%I:%M %p on %d %B, %Y"  # 1:56 pm on 8 May, 2023
# A dia_id as annotated, tolerating slips: "D8:6; D9:17" (two in one), "D 10:3", "D:10:3",
# "D1:3:5" (read as D1:3).
EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")

# Things a user might ask about that these chit-chat histories are unlikely to mention. Each with
# the terms that make it off-topic (matched at word starts, lower-cased): a query is used for a
# history only when none of its terms occurs in any of that history's turns.
OFF_TOPIC: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What did we decide about the Kubernetes cluster migration?", ("kubernetes", "cluster")),
    ("Which plumber fixed the boiler leak?", ("plumber", "boiler")),
    ("invoice INV-20931 payment status", ("invoice", "inv-20931")),
    ("When is my appointment with the orthodontist?", ("orthodont",)),
    ("What was the VPN error on the office laptop?", ("vpn",)),
    ("Lisbon apartment lease terms", ("lisbon", "lease")),
    ("How much did the transmission repair on the Subaru cost?", ("transmission", "subaru")),
    ("What did the accountant say about the quarterly VAT return?", ("accountant", "vat")),
    ("What is the warranty number for the dishwasher?", ("warranty", "dishwasher")),
    ("ticket MT-4471 status", ("mt-4471", "ticket")),
    ("What did we say about the Zanzibar ferry schedule?", ("zanzibar", "ferry")),
    ("Who is the landlord's lawyer in the deposit dispute?", ("landlord", "lawyer")),
    ("chess opening repertoire, Sicilian defence", ("chess", "sicilian")),
    ("What was the cholesterol result from the blood test?", ("cholesterol",)),
    ("Which crypto exchange did I open an account with?", ("crypto",)),
    ("What did the vet say about the parrot's feathers?", ("parrot",)),
    ("Terraform state file migration plan", ("terraform",)),
    ("What's the gate code for the storage unit?", ("gate code", "storage unit")),
    ("Which supplier did we order the beehive from?", ("beehive", "beekeep")),
    ("mortgage refinancing rate the bank offered", ("mortgage", "refinanc")),
)


# --- loading ----------------------------------------------------------------------------------


def normalise(text: str) -> str:
    """Lower-cased, whitespace collapsed: how answers and evidence are compared."""
    return " ".join(text.lower().split())


def evidence_key(turn_text: str) -> str:
    """What must appear in an answer for an evidence turn to count as returned."""
    return normalise(turn_text)[:KEY_CHARS]


def session_ts(date_time: str) -> str:
    """`1:56 pm on 8 May, 2023` -> `2023-05-08T13:56:00Z` (the dataset gives no zone: UTC)."""
    moment = datetime.strptime(date_time.strip(), DATE_FORMAT).replace(tzinfo=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def sessions(sample: dict[str, Any]) -> list[tuple[int, list[dict[str, Any]]]]:
    """(N, turns) of every non-empty `session_N`, in session order."""
    found = []
    for key, turns in sample.items():
        match = SESSION_KEY.fullmatch(key)
        if match and isinstance(turns, list) and turns:
            found.append((int(match.group(1)), turns))
    return sorted(found, key=lambda item: item[0])


def to_bodies(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """One `POST /turns` body per session: the fixed conversion (see the module docstring)."""
    user, speaker_a = sample["sample_id"], sample["speaker_a"]
    bodies = []
    for number, turns in sessions(sample):
        ts = session_ts(sample[f"session_{number}_date_time"])
        body_turns = [
            {
                "id": turn["dia_id"].replace(":", "-"),
                "role": "user" if turn["speaker"] == speaker_a else "assistant",
                "text": f"{turn['speaker']}: {turn['text']}",
                "ts": ts,
            }
            for turn in turns
        ]
        bodies.append({"user": user, "conversation_id": f"session-{number}", "turns": body_turns})
    return bodies


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    keys: tuple[str, ...]  # evidence_key of each resolved evidence turn; empty: always a miss
    # Every evidence turn shares a photo: the answer may be in the caption, which is not loaded.
    photo_evidence: bool = False
    # (conversation id, turn id) of each resolved evidence turn, as the server stores them
    turns: tuple[tuple[str, str], ...] = ()


@dataclass
class EvidenceCount:
    references: int = 0  # dia_ids as annotated, after splitting "D8:6; D9:17"
    normalised: int = 0  # resolved only after splitting or respelling them
    unresolved: int = 0  # name no turn of the history
    questions_without_evidence: int = 0  # none of their references resolved: always a miss

    def add(self, other: EvidenceCount) -> None:
        self.references += other.references
        self.normalised += other.normalised
        self.unresolved += other.unresolved
        self.questions_without_evidence += other.questions_without_evidence


@dataclass
class LocomoHistory:
    user: str
    bodies: list[dict[str, Any]]
    questions: list[Question]
    adversarial: list[str]  # category-5 questions: no answer in the history
    off_topic: list[str]  # OFF_TOPIC questions whose terms this history never uses
    evidence: EvidenceCount = field(default_factory=EvidenceCount)
    turns: int = 0
    turns_with_images: int = 0


def resolve_evidence(raw: list[Any], texts: dict[str, str], count: EvidenceCount) -> list[str]:
    """The dia_ids these annotations name, in order, without repeats; counts what it had to fix."""
    resolved: list[str] = []
    for entry in raw:
        pieces = re.split(r"[;,]", str(entry))
        for piece in pieces:
            compact = re.sub(r"\s+", "", piece)
            if not compact:
                continue
            count.references += 1
            match = EVIDENCE_ID.match(compact)
            dia_id = f"D{match.group(1)}:{match.group(2)}" if match else compact
            if dia_id not in texts:
                count.unresolved += 1
                continue
            if len(pieces) > 1 or dia_id != piece.strip():
                count.normalised += 1
            if dia_id not in resolved:
                resolved.append(dia_id)
    return resolved


def never_mentioned(terms: tuple[str, ...], corpus: str) -> bool:
    return not any(re.search(rf"\b{re.escape(term)}", corpus) for term in terms)


def to_history(sample: dict[str, Any]) -> LocomoHistory:
    turns = [turn for _, session in sessions(sample) for turn in session]
    where = {
        turn["dia_id"]: (f"session-{number}", turn["dia_id"].replace(":", "-"))
        for number, session in sessions(sample)
        for turn in session
    }
    texts = {turn["dia_id"]: turn["text"] for turn in turns}
    photos = {turn["dia_id"] for turn in turns if turn.get("img_url") or turn.get("blip_caption")}
    corpus = "\n".join(texts.values()).lower()
    evidence = EvidenceCount()
    questions, adversarial = [], []
    for qa in sample.get("qa", []):
        category = qa.get("category")
        if category == ADVERSARIAL:
            adversarial.append(qa["question"])
        elif category in CATEGORIES and qa.get("evidence"):
            resolved = resolve_evidence(qa["evidence"], texts, evidence)
            if not resolved:
                evidence.questions_without_evidence += 1
            keys = tuple(evidence_key(texts[dia_id]) for dia_id in resolved)
            on_photos = bool(resolved) and all(dia_id in photos for dia_id in resolved)
            stored = tuple(where[dia_id] for dia_id in resolved)
            questions.append(Question(qa["question"], category, keys, on_photos, turns=stored))
    return LocomoHistory(
        user=sample["sample_id"],
        bodies=to_bodies(sample),
        questions=questions,
        adversarial=adversarial,
        off_topic=[query for query, terms in OFF_TOPIC if never_mentioned(terms, corpus)],
        evidence=evidence,
        turns=len(turns),
        turns_with_images=len(photos),
    )


def load_locomo(path: Path) -> list[LocomoHistory]:
    return [to_history(sample) for sample in json.loads(path.read_text(encoding="utf-8"))]


# --- asking -----------------------------------------------------------------------------------


@dataclass
class Answers:
    """One history's answers at one k, in query order: questions, adversarial, off-topic."""

    texts: list[str]
    latencies_ms: list[float]
    # per query, (conversation id, turn id) of each served passage in rank order (the audit's)
    served: list[list[tuple[str, str]]] = field(default_factory=list)


def queries(history: LocomoHistory) -> list[str]:
    return [q.text for q in history.questions] + history.adversarial + history.off_topic


def is_hit(answer: str, key: str) -> bool:
    return bool(key) and key in normalise(answer)


def presented(answer: str) -> str:
    """How an answer presents what it returns: "nothing" (a fail-soft or nothing-found answer, or
    only the note that no conversation mentions the query's identifiers), "near_miss" (passages
    under the near-miss label) or "match"."""
    if answer in (NOTHING_FOUND, NO_MEMORY, UNAVAILABLE, NOT_YET):
        return "nothing"
    note, _, rest = answer.partition("\n")
    if note.startswith(NEVER_MENTIONED.split("{")[0]):
        if not rest.strip():
            return "nothing"
        if rest.startswith(NEAR_MISSES.split("{")[0]):
            return "near_miss"
    return "match"


def says_more(answer: str) -> bool:
    """Whether the answer's last line says more passages match than it shows."""
    return answer.rstrip("\n").rsplit("\n", 1)[-1].startswith(MORE_MATCH.split("{")[0])


def returned_passages(answer: str) -> bool:
    """Passages presented as a match: what a false positive is."""
    return presented(answer) == "match"


def first_returned(answer: str) -> str:
    """The first passage's date, role and opening, on one line."""
    lines = [line for line in answer.split("\n---")[0].splitlines() if line.strip()]
    return " ".join(lines[:2])[:160]


Where = tuple[str, str]  # a turn as the server stores it: (conversation id, turn id)


def turn_recall(ranked: list[Where], evidence: tuple[Where, ...], k: int) -> float:
    """Turn-level R@k as the LoCoMo paper computes it: the share of the evidence turns among the
    top ``k`` ranked turns (0 when no evidence resolved)."""
    top = set(ranked[:k])
    return sum(turn in top for turn in evidence) / len(evidence) if evidence else 0.0


def turn_ndcg(ranked: list[Where], evidence: tuple[Where, ...], k: int) -> float:
    """Turn-level NDCG@k with binary relevance: each evidence turn among the top ``k`` ranked
    turns gains 1 / log2(rank + 1), counted once; divided by the gain of a list that ranks the
    evidence first (0 when no evidence resolved)."""
    wanted, seen, gain = set(evidence), set(), 0.0
    for rank, turn in enumerate(ranked[:k], start=1):
        if turn in wanted and turn not in seen:
            seen.add(turn)
            gain += 1 / math.log2(rank + 1)
    ideal = sum(1 / math.log2(rank + 1) for rank in range(1, min(len(wanted), k) + 1))
    return gain / ideal if ideal else 0.0


def session_hit(ranked: list[Where], evidence: tuple[Where, ...], k: int) -> bool:
    """Session-level hit@k: an evidence turn's session is among the first ``k`` distinct
    sessions of the ranked turns, in rank order."""
    distinct = list(dict.fromkeys(conversation for conversation, _ in ranked))
    return bool({conversation for conversation, _ in evidence} & set(distinct[:k]))


def field_metrics(histories: list[LocomoHistory], ranked: dict[str, Answers]) -> dict[str, dict]:
    """The field's metrics per category and overall, from the served passages in rank order."""
    sums: dict[str, dict[str, float]] = {}
    for history in histories:
        for question, served in zip(history.questions, ranked[history.user].served, strict=False):
            name = CATEGORIES[question.category]
            for bucket in (name, "overall"):
                row = sums.setdefault(bucket, {"questions": 0})
                row["questions"] += 1
                for k in TURN_RECALL_AT:
                    row[f"R@{k}"] = row.get(f"R@{k}", 0.0) + turn_recall(served, question.turns, k)
                ndcg = turn_ndcg(served, question.turns, NDCG_AT)
                row[f"NDCG@{NDCG_AT}"] = row.get(f"NDCG@{NDCG_AT}", 0.0) + ndcg
                for k in SESSION_HIT_AT:
                    hit = session_hit(served, question.turns, k)
                    row[f"session_hit@{k}"] = row.get(f"session_hit@{k}", 0.0) + hit
    return {
        bucket: {
            name: share(value, int(sums[bucket]["questions"]))
            for name, value in sums[bucket].items()
            if name != "questions"
        }
        for bucket in [*CATEGORIES.values(), "overall"]
        if bucket in sums
    }


def share(part: float, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def score(histories: list[LocomoHistory], answers: dict[int, dict[str, Answers]]) -> dict[str, Any]:
    """Figures (committable: no data text) and misses (quoting the data: for local files only)."""
    rows: dict[str, dict[str, float]] = {}
    misses: dict[str, list[dict[str, Any]]] = {name: [] for name in CATEGORIES.values()}
    per_history: dict[str, dict[str, Any]] = {}
    false_positive: dict[str, Any] = {}
    photo_misses = {f"k{k}": 0 for k in KS}
    more_lines = {f"k{k}": 0 for k in KS}
    errors = 0
    for k in KS:
        counts: dict[str, dict[str, float]] = {}
        fp = {"adversarial": [0, 0], "unseen_entities": [0, 0]}
        near = {"adversarial": 0, "unseen_entities": 0}
        for history in histories:
            got = answers[k][history.user].texts
            errors += sum(answer == UNAVAILABLE for answer in got)
            own = per_history.setdefault(history.user, {"questions": len(history.questions)})
            own_hits = 0
            for question, answer in zip(history.questions, got, strict=False):
                more_lines[f"k{k}"] += says_more(answer)
                found = [is_hit(answer, key) for key in question.keys]
                hit = any(found)
                own_hits += hit
                name = CATEGORIES[question.category]
                for bucket in (name, "overall"):
                    row = counts.setdefault(bucket, {"questions": 0, "hits": 0.0, "recall": 0.0})
                    row["questions"] += 1
                    row["hits"] += hit
                    row["recall"] += sum(found) / len(found) if found else 0.0
                if not hit:
                    photo_misses[f"k{k}"] += question.photo_evidence
                    misses[name].append(
                        {"k": k, "history": history.user, "question": question.text}
                        | {"evidence": list(question.keys), "first": first_returned(answer)}
                    )
            own[f"hit@{k}"] = share(own_hits, len(history.questions))
            rest = got[len(history.questions) :]
            adversarial, off_topic = (
                rest[: len(history.adversarial)],
                rest[len(history.adversarial) :],
            )
            for kind, group in (("adversarial", adversarial), ("unseen_entities", off_topic)):
                fp[kind][0] += sum(returned_passages(answer) for answer in group)
                fp[kind][1] += len(group)
                near[kind] += sum(presented(answer) == "near_miss" for answer in group)
        for bucket, row in counts.items():
            shown = rows.setdefault(bucket, {"questions": int(row["questions"])})
            shown[f"hit@{k}"] = share(row["hits"], int(row["questions"]))
            shown[f"evidence_recall@{k}"] = share(row["recall"], int(row["questions"]))
        both = [sum(pair) for pair in zip(*fp.values(), strict=True)]
        near_all = sum(near.values())
        false_positive[f"k{k}"] = {
            kind: {"queries": whole, "rate": share(part, whole)}
            | {"near_miss_rate": share(near.get(kind, near_all), whole)}
            for kind, (part, whole) in (*fp.items(), ("all", both))
        }
    if RANKED in answers:
        for bucket, field_row in field_metrics(histories, answers[RANKED]).items():
            rows[bucket] |= field_row
    ordered = {name: rows[name] for name in [*CATEGORIES.values(), "overall"] if name in rows}
    evidence = total_evidence(histories)
    all_questions = [q for h in histories for q in h.questions]
    figures = {
        "histories": [h.user for h in histories],
        "sessions": sum(len(h.bodies) for h in histories),
        "turns": sum(h.turns for h in histories),
        "turns_with_images": sum(h.turns_with_images for h in histories),
        "questions": sum(len(h.questions) for h in histories),
        "by_category": ordered,
        "false_positive": false_positive,
        "per_history": per_history,
        "evidence": vars(evidence),
        "misses_with_evidence_only_on_photo_turns": photo_misses,
        # questions whose answer ends saying clearly more passages match than it shows
        "more_match_lines": {k: share(n, len(all_questions)) for k, n in more_lines.items()},
        "unavailable_answers": errors,
    }
    figures |= latency_figures(histories, answers)
    return {"figures": figures, "misses": misses}


def total_evidence(histories: list[LocomoHistory]) -> EvidenceCount:
    evidence = EvidenceCount()
    for history in histories:
        evidence.add(history.evidence)
    return evidence


def latency_figures(
    histories: list[LocomoHistory], answers: dict[int, dict[str, Answers]]
) -> dict[str, dict[str, float]]:
    """The tool call's latency at each k asked, over every query of every history."""
    return {
        f"latency_k{k}": timing(
            [ms for history in histories for ms in answers[k][history.user].latencies_ms]
        )
        for k in SETTINGS_AT
        if k in answers
    }


# --- the tool, through a real server ----------------------------------------------------------


def locomo_server(
    workdir: Path,
    engine: str,
    k: int,
    users: list[str],
    *,
    database_url: str | None = None,
    command: tuple[str, ...] | None = None,
) -> LocalServer:
    settings = {"ENGINE": engine, **SETTINGS_AT[k], "LOG_LEVEL": "WARNING"}
    settings["INDEX_TIMEOUT"] = INDEX_TIMEOUT
    if database_url:
        settings |= {"STORE": "postgres", "DATABASE_URL": database_url}
    return make_server(
        workdir, users=users, log_name=f"server-k{k}.log", command=command, **settings
    )


def served_by_audit(live: LocalServer, user: str, asked: int) -> list[list[tuple[str, str]]]:
    """The served passages of the user's last ``asked`` tool calls, in rank order, from the
    recall audit (POST /audit): each passage's own (conversation, turn), never its neighbours.
    Waits a little for the last lines (a store may write them just after answering)."""
    deadline = time.monotonic() + 30
    while True:
        status, body = live.post({"user": user}, route="/audit")
        if status != 200:
            raise RuntimeError(f"POST /audit answered {status}: {body}")
        entries = body["entries"]
        if len(entries) >= asked or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if len(entries) < asked:
        raise RuntimeError(f"the audit holds {len(entries)} lines, {asked} tool calls were made")
    return [
        [(hit["conversation_id"], hit["turn"]) for hit in entry.get("served", [])]
        for entry in entries[-asked:]
    ]


async def ask_tool(live: LocalServer, history: LocomoHistory) -> Answers:
    """Every query of one history through one MCP session with that user's token, then what
    each call served, from the audit."""
    answers = Answers([], [])
    async with Client(f"{live.url}/mcp", auth=live.tokens[history.user]) as client:
        for query in queries(history):
            started = time.perf_counter()
            result = await client.call_tool("recall_my_conversations", {"query": query})
            answers.latencies_ms.append((time.perf_counter() - started) * 1000)
            answers.texts.append(result.content[0].text)  # type: ignore[union-attr]
    answers.served = served_by_audit(live, history.user, len(answers.texts))
    return answers


def load_by_posting(live: LocalServer, histories: list[LocomoHistory]) -> dict[str, Any]:
    started = time.monotonic()
    for history in histories:
        for body in history.bodies:
            status, answer = live.post(body)
            if status != 202:
                raise RuntimeError(f"POST /turns answered {status}: {answer}")
    live.wait_indexed(*(h.user for h in histories), timeout=3_600)
    return {"how": "POST /turns", "load_s": round(time.monotonic() - started, 1)}


def measure_locomo(
    path: Path,
    engine: str = "embedded",
    *,
    post: bool = False,
    store: str = "files",
    server_tree: Path | None = None,
    keep: dict[int, dict[str, Answers]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded run: load through the backfill (or POST /turns), ask through the MCP tool.
    ``store`` "postgres": the server on STORE=postgres with a database of its own, loaded by
    POST /turns; ``server_tree``: the server of that checkout (its .venv), not this one's;
    ``keep``: filled with the answers, to compare two runs answer by answer.

    Returns (figures, misses)."""
    histories = load_locomo(path)
    answers: dict[int, dict[str, Answers]] = {}
    loading: dict[str, Any] = {}
    database_url = postgres().new_database().app_url if store == "postgres" else None
    post = post or database_url is not None
    command = server_command(server_tree) if server_tree else None
    with tempfile.TemporaryDirectory(prefix=f"bench-locomo-{engine}-") as tmp:
        workdir = Path(tmp)
        for k in SETTINGS_AT:
            users = [h.user for h in histories]
            live = locomo_server(
                workdir, engine, k, users, database_url=database_url, command=command
            )
            if k == KS[0] and not post:
                bodies = [body for h in histories for body in h.bodies]
                loading = {"how": "backfill"} | load_by_backfill(live, bodies, workdir)
            with live.start(timeout=120):
                if k == KS[0] and post:
                    loading = load_by_posting(live, histories)
                live.wait_no_index_run()  # else a search may say "still being indexed"

                async def ask_all(live: LocalServer = live) -> dict[str, Answers]:
                    return {h.user: await ask_tool(live, h) for h in histories}

                answers[k] = asyncio.run(ask_all())
    if keep is not None:
        keep.update(answers)
    scored = score(histories, answers)
    figures = {"benchmark": "locomo", "engine": engine, "mode": "MCP tool, real server"}
    figures |= {"store": store, "server": str(server_tree or ROOT), "data": path.name}
    # the servers inherit EMBED_MODEL from this process (devtools.testing.PASSED_THROUGH)
    figures["embed_model"] = live.env.get("EMBED_MODEL", PACKAGED)
    figures |= {"settings": SETTINGS_AT, "load": loading}
    return figures | scored["figures"], scored["misses"]


# --- in-process, for ranking work -------------------------------------------------------------


async def ask(
    recall: Callable[[str], Awaitable[Recalled]], history: LocomoHistory, k: int
) -> Answers:
    """Every query of one history through ``recall``, the tool's query and answer handling
    kept (the query cut as the tool cuts it, the answer at k's character cap)."""
    cap = int(SETTINGS_AT[k]["MAX_RESULT_CHARS"])
    answers = Answers([], [])
    for query in queries(history):
        started = time.perf_counter()
        found = await recall(query.strip()[:MAX_QUERY_CHARS])
        answers.latencies_ms.append((time.perf_counter() - started) * 1000)
        answers.texts.append(found.text[:cap] or NOTHING_FOUND)
        shown = found.cut(cap).passages
        answers.served.append([(passage.conversation_id, passage.turn_id) for passage in shown])
    return answers


async def ask_engines(
    histories: list[LocomoHistory], engines: dict[int, Engine], workdir: Path
) -> dict[int, dict[str, Answers]]:
    """Index each history with the server's own conversion and ask every query of it, once per
    k, through engine objects in this process (no HTTP). `engines` maps k to an engine built
    with SETTINGS_AT[k]."""
    answers: dict[int, dict[str, Answers]] = {k: {} for k in engines}
    for history in histories:
        home = workdir / user_dir_name(history.user)
        for body in history.bodies:
            write_conversation(home, parse_conversation(body))
        for engine in engines.values():
            await engine.index(home)  # the same index for every k: later runs find nothing new
        for k, engine in engines.items():
            answers[k][history.user] = await ask(functools.partial(engine.recall, home), history, k)
    return answers


async def evaluate_engines(
    histories: list[LocomoHistory], engines: dict[int, Engine], workdir: Path
) -> dict[str, Any]:
    """ask_engines, scored: score()'s dict."""
    return score(histories, await ask_engines(histories, engines, workdir))


def embedded_engines(model_dir: Path | None = None) -> dict[int, Engine]:
    """Today's embedded engine at each k's settings, sharing one embedding model."""
    from recall.embedder import PACKAGED
    from recall.files.engines.embedded.engine import EmbeddedEngine
    from recall.indexing.configured import configured_reranker
    from recall.models import load_embedder
    from recall.settings import MODEL_MIN_SIMILARITY, Settings

    model = os.environ.get("EMBED_MODEL", PACKAGED)
    embedder = load_embedder(model_dir, model=model)
    reranker = configured_reranker(Settings(engine="embedded"))  # RECALL_RERANK
    return {
        k: EmbeddedEngine(
            embedder,
            min_similarity=MODEL_MIN_SIMILARITY[model],
            k=int(values["RECALL_K"]),
            candidates=int(values["RECALL_CANDIDATES"]),
            max_chars=int(values["MAX_RESULT_CHARS"]),
            reranker=reranker,
        )
        for k, values in SETTINGS_AT.items()
    }


def measure_in_process(path: Path, model_dir: Path | None = None) -> tuple[dict, dict]:
    histories = load_locomo(path)
    engines = embedded_engines(model_dir)
    with tempfile.TemporaryDirectory(prefix="bench-locomo-fast-") as tmp:
        scored = asyncio.run(evaluate_engines(histories, engines, Path(tmp)))
    figures = {"benchmark": "locomo", "engine": "embedded", "mode": "in-process"}
    return figures | {"data": path.name} | scored["figures"], scored["misses"]


# --- the PostgreSQL store, in-process -----------------------------------------------------------


async def ask_postgres(
    histories: list[LocomoHistory], database_url: str, model_dir: Path | None = None
) -> dict[int, dict[str, Answers]]:
    """As ask_engines, over the PostgreSQL store (STORE=postgres) in this process: each history
    posted through PgStore.put (the write path), all of it before its index run, as the
    backfill loads it (rows are then numbered as the embedded engine numbers them), indexed by
    an IndexRunner, asked through PgSearch at each k's settings."""
    from recall.embedder import PACKAGED
    from recall.indexing.configured import configured_reranker
    from recall.models import load_embedder
    from recall.pg.database import Database
    from recall.pg.index import IndexRunner
    from recall.pg.search import PgSearch
    from recall.pg.store import PgStore
    from recall.settings import MODEL_MIN_SIMILARITY, Settings

    model = os.environ.get("EMBED_MODEL", PACKAGED)
    embedder = load_embedder(model_dir, model=model)
    reranker = configured_reranker(Settings(engine="embedded"))  # RECALL_RERANK
    db = Database(database_url, 4)
    store = PgStore(db, debounce=3600.0)  # no run claims a history before it is all posted
    runner = IndexRunner(db, embedder, debounce=0.0, concurrency=1, timeout=3600.0)
    searches = {
        k: PgSearch(
            db,
            embedder,
            min_similarity=MODEL_MIN_SIMILARITY[model],
            k=int(values["RECALL_K"]),
            candidates=int(values["RECALL_CANDIDATES"]),
            max_chars=int(values["MAX_RESULT_CHARS"]),
            reranker=reranker,
        )
        for k, values in SETTINGS_AT.items()
    }
    answers: dict[int, dict[str, Answers]] = {k: {} for k in searches}
    await store.start()
    await runner.start()
    try:
        for history in histories:
            user = user_dir_name(history.user)
            for body in history.bodies:
                await store.put(user, parse_conversation(body))
            runner.repair(user)  # its run is due now
            while await store.indexing():
                await asyncio.sleep(0.1)
            for k, search in searches.items():
                answers[k][history.user] = await ask(
                    functools.partial(search.recall, user), history, k
                )
    finally:
        await runner.close()
        for search in searches.values():
            await search.close()
        await store.close()
    return answers


def same_answers(
    one: dict[int, dict[str, Answers]], other: dict[int, dict[str, Answers]]
) -> dict[str, int]:
    """How many answers two runs gave alike, to the byte, of how many."""
    pairs = [
        pair
        for k in one
        for user in one[k]
        for pair in zip(one[k][user].texts, other[k][user].texts, strict=True)
    ]
    return {"answers": len(pairs), "identical": sum(a == b for a, b in pairs)}


def measure_both(path: Path, model_dir: Path | None = None) -> list[tuple[dict, dict]]:
    """The embedded engine (files store) and the PostgreSQL store on the same histories in one
    run: (figures, misses) of each, the PostgreSQL figures saying how many answers were the same
    to the byte. The database: DATABASE_URL (the app role, migrated), else a PostgreSQL 18 +
    pgvector started for the run (tests/pg.py, as benchmark/run.py starts it)."""
    histories = load_locomo(path)
    with tempfile.TemporaryDirectory(prefix="bench-locomo-fast-") as tmp:
        files = asyncio.run(ask_engines(histories, embedded_engines(model_dir), Path(tmp)))
    database_url = os.environ.get("DATABASE_URL") or postgres().new_database().app_url
    pg = asyncio.run(ask_postgres(histories, database_url, model_dir))
    figures = {"benchmark": "locomo", "mode": "in-process", "data": path.name}
    runs = []
    for engine, answers in (("embedded", files), ("postgres", pg)):
        scored = score(histories, answers)
        runs.append((figures | {"engine": engine} | scored["figures"], scored["misses"]))
    runs[1][0]["same_as_embedded"] = same_answers(files, pg)
    return runs


# --- output -----------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# The field's metrics, as the table names them (turn-level R@k, session-level hit@k)
FIELD = (
    *(f"R@{k}" for k in TURN_RECALL_AT),
    f"NDCG@{NDCG_AT}",
    *(f"session_hit@{k}" for k in SESSION_HIT_AT),
)


def table(figures: dict[str, Any]) -> str:
    """The per-category table and the false-positive line, as printed and in the README."""
    lines = [
        "| category | questions | hit@3 | hit@8 | evidence recall@3 | evidence recall@8 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in figures["by_category"].items():
        label = f"**{name}**" if name == "overall" else name
        lines.append(
            f"| {label} | {row['questions']} | {_pct(row['hit@3'])} | {_pct(row['hit@8'])} "
            f"| {_pct(row['evidence_recall@3'])} | {_pct(row['evidence_recall@8'])} |"
        )
    if any(FIELD[0] in row for row in figures["by_category"].values()):
        lines += ["", f"| category | {' | '.join(FIELD)} |", "| --- |" + " --- |" * len(FIELD)]
        for name, row in figures["by_category"].items():
            label = f"**{name}**" if name == "overall" else name
            lines.append(f"| {label} | " + " | ".join(_pct(row.get(m)) for m in FIELD) + " |")
    fp = figures["false_positive"]
    lines += [
        "",
        "| false positives (passages as a match) | queries | at k=3 | at k=8 "
        "| labelled near misses at k=3 | at k=8 |",
    ]
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for kind, label in (
        ("adversarial", "category 5 (adversarial)"),
        ("unseen_entities", "never-mentioned things"),
        ("all", "**all**"),
    ):
        lines.append(
            f"| {label} | {fp['k3'][kind]['queries']} | {_pct(fp['k3'][kind]['rate'])} "
            f"| {_pct(fp['k8'][kind]['rate'])} | {_pct(fp['k3'][kind].get('near_miss_rate'))} "
            f"| {_pct(fp['k8'][kind].get('near_miss_rate'))} |"
        )
    return "\n".join(lines)


def print_figures(figures: dict[str, Any], misses: dict[str, list[dict[str, Any]]]) -> None:
    shown = {k: v for k, v in figures.items() if k not in ("by_category", "false_positive")}
    print(json.dumps(shown, indent=1))
    print(table(figures))
    hit_at_8 = {(m["history"], m["question"]) for ms in misses.values() for m in ms if m["k"] == 8}
    for name, found in misses.items():
        at_3 = [m for m in found if m["k"] == 3]
        print(f"\nmisses at k=3, {name}: {len(at_3)} (also missed at k=8: "
              f"{sum((m['history'], m['question']) in hit_at_8 for m in at_3)})")  # fmt: skip
        for miss in at_3[:MISS_EXAMPLES]:
            also = " [also at k=8]" if (miss["history"], miss["question"]) in hit_at_8 else ""
            print(f"  {miss['history']}: {miss['question']!r}{also}")
            print(f"    wants: {miss['evidence'][0] if miss['evidence'] else '(unresolved)'!r}")
            print(f"    first: {miss['first']!r}")


def save(figures: dict[str, Any], misses: dict[str, Any], results: Path = RESULTS) -> Path:
    """Figures to results/locomo-<engine>.json; misses (data text) to an ignored local file."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"locomo-{figures['engine']}.json"
    path.write_text(json.dumps(figures, indent=1) + "\n")
    local = results / f"locomo-{figures['engine']}-misses.local.json"
    local.write_text(json.dumps(misses, indent=1, ensure_ascii=False) + "\n")
    return path


def stamp(figures: dict[str, Any], started: float) -> None:
    """Where, when and how long: the machine is shared, so figures carry their conditions."""
    figures["machine"] = machine()
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    figures["wall_s"] = round(time.monotonic() - started)
    figures["date"] = time.strftime("%Y-%m-%d", time.gmtime())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="LoCoMo retrieval benchmark.")
    parser.add_argument("data", type=Path, nargs="?", default=DEFAULT_DATA)
    parser.add_argument("--fast", action="store_true", help="in-process engines, no server")
    parser.add_argument("--model-dir", type=Path, help="another embedding model (with --fast)")
    parser.add_argument(
        "--store",
        choices=("files", "postgres"),
        default="files",
        help="with --fast: postgres runs the PostgreSQL store too (DATABASE_URL, else one of its "
        "own) and prints both; without: the server on STORE=postgres, a database of its own",
    )
    parser.add_argument(
        "--server-tree",
        type=Path,
        help="through a server: start the server of this checkout (its .venv), e.g. an older "
        "version, and measure it with this checkout's metrics",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="also write the figures (JSON) to this file and, through a server, each answer's "
        "SHA-256 and served passages to OUT.answers.local.json (to compare two runs)",
    )
    args = parser.parse_args(argv)
    if args.server_tree and args.fast:
        parser.error("--server-tree measures a server: leave out --fast")
    started = time.monotonic()
    kept: dict[int, dict[str, Answers]] = {}
    if args.fast and args.store == "postgres":
        runs = measure_both(args.data, args.model_dir)
    elif args.fast:
        runs = [measure_in_process(args.data, args.model_dir)]
    else:
        runs = [
            measure_locomo(args.data, store=args.store, server_tree=args.server_tree, keep=kept)
        ]
    for figures, misses in runs:
        stamp(figures, started)
        print(f"\n=== {figures['engine']} ===")
        print_figures(figures, misses)
    if args.out:
        digests = {
            str(k): {
                user: [
                    answer_record(text, served=served)
                    for text, served in zip(got.texts, got.served, strict=True)
                ]
                for user, got in by_user.items()
            }
            for k, by_user in kept.items()
        }
        write_out(args.out, [figures for figures, _ in runs], digests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
