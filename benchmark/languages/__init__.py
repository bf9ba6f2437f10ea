"""Synthetic histories in other languages than English (issues 24, 34): German, Spanish, Chinese
twice (property management, ``zh.py``; a school in other phrasing, ``zh_school.py``), Japanese
(a logistics depot, ``ja.py``).

Written before anything was tuned for other languages, and blind to the ranking. One generator,
one module of text per language (``de.py``, ``es.py``, ``zh.py``): the phrasing is each
language's own, written for it, not the English generators' sentences translated.

The domain of de, es and zh is property management (a housing company's office and its
caretakers): buildings named by their street address (in German and Spanish; a residential estate
and block in Chinese), caretakers and office staff, outside contractors; zh_school and ja put
classes or warehouses where the buildings are. The shape is ``history.py``'s:

1. **Fact kinds**, one of each per block of four conversations: a *ticket* (a repair order id
   for a defect at a building), an *owner* (which contractor does a routine task at a building),
   an *amount* (what a quote for a routine task at a building comes to) and a *date* (when a
   routine task at a building is booked).
2. **Near-identical facts** in clusters of three: the same task or defect at three buildings, so
   only the building tells them apart.
3. **Recurrence.** Each conversation mentions a home building (its opener), the fact's building,
   half the time another building in small talk, and half the time a routine task by its usual
   name; buildings are dealt so each occurs in about six conversations (``history._deal``).
4. **Uniqueness.** The key a question asks about (building + task or defect) is unique within its
   kind; ticket ids, contractors, amounts and dates are drawn without replacement and never occur
   in small talk, so every answer string occurs in exactly one conversation (``generate`` raises
   otherwise).
5. **Questions**: the long form names the task or defect by other words (a paraphrase with other
   words, other word order, another compound or a description), plus the building; it shares no
   content word with the fact but names (``content_words`` per language; ``generate`` raises).
   The short form is what an agent types: the building and the usual term for tickets and
   amounts, the building and a short paraphrase for owners and dates (no id to go on).

Deterministic: one ``random.Random(seed)``, no iteration over sets.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from benchmark.history import CLUSTER, Fact, History, Question, _check, _deal, _ids, _start_times

USER = "bench-user"
KINDS = ("ticket", "owner", "amount", "date")
OTHER_PLACE_SHARE = 0.5  # share of conversations that mention another building in small talk
TASK_TALK_SHARE = 0.5  # share that mention a routine task by its usual name in small talk
DEFAULT_QUESTIONS = 60
Forms = dict[str, str]


@dataclass(frozen=True)
class Language:
    """Everything a history in one language is written from. Templates are ``str.format``
    strings over: ``place``/``home``/``other`` (a building's forms, e.g. ``{place[in]}``),
    ``task``/``defect`` (a term's forms), ``answer``, ``person``, ``person2``, ``day``."""

    code: str
    name: str
    people: tuple[str, ...]
    days: tuple[str, ...]
    months: tuple[str, ...]
    places: Callable[[random.Random, int], list[Forms]]  # ``count`` buildings, names unique
    tasks: tuple[Forms, ...]  # fact / asked / short forms (keys per language)
    defects: tuple[Forms, ...]
    contractors: Callable[[random.Random, int], list[str]]  # owner answers, unique
    ticket_prefix: str
    amount: Callable[[int], str]  # euros or yuan -> the text the fact carries
    date: Callable[[int, int, int, int], str]  # month, day, hour, minute -> the fact's text
    openers: tuple[str, ...]
    talk: dict[tuple[str, str], tuple[str, ...]]  # (role, "place" | "task" | "day") -> templates
    ask_before_lookup: tuple[str, ...]
    leads: dict[str, tuple[str, ...]]
    facts: dict[str, tuple[str, ...]]
    question_context: tuple[str, ...]  # may use {month}, {person}, {home}
    questions: dict[str, tuple[str, ...]]
    short_queries: dict[str, str]
    fillers: dict[str, tuple[str, ...]]
    content_words: Callable[[str], list[str]]  # the paraphrase rule's units (names removed)
    capitalise: bool = True  # first letter of a message upper-case (not for Chinese)
    ticket_digits: int = 5  # a ticket id's width ("BX-20417"; a school's "K-039": 3)
    # Questions about what the history never touches (a pet, a passport): a search should find
    # nothing; benchmark/languages/stages.py counts those answered with passages.
    never_mentioned: tuple[str, ...] = ()


def _deal_plans(rng: random.Random, n: int) -> list[dict[str, Any]]:
    kinds: list[str] = []
    while len(kinds) < n:
        block = list(KINDS)
        rng.shuffle(block)  # one of each kind per four conversations keeps any stretch balanced
        kinds.extend(block)
    plans: list[dict[str, Any]] = [{"kind": kind, "other": -1} for kind in kinds[:n]]
    owners: list[int] = []
    slots: list[tuple[int, str]] = []
    for i, plan in enumerate(plans):
        wanted = ["home", "place"]
        if rng.random() < OTHER_PLACE_SHARE:
            wanted.append("other")
        plan["talks_task"] = rng.random() < TASK_TALK_SHARE
        for name in wanted:
            owners.append(i)
            slots.append((i, name))
    for (i, name), entity in zip(slots, _deal(rng, owners, minimum=3), strict=True):
        plans[i][name] = entity
    return plans


def _cluster_details(rng: random.Random, plans: list[dict[str, Any]], lang: Language) -> None:
    """Clusters of three facts of one kind share a task or defect when their buildings allow."""
    taken: dict[str, list[tuple[int, int]]] = {kind: [] for kind in KINDS}
    for kind in KINDS:
        count = len(lang.defects if kind == "ticket" else lang.tasks)
        members = [i for i, plan in enumerate(plans) if plan["kind"] == kind]
        rng.shuffle(members)  # spread each cluster over the whole history
        for start in range(0, len(members), CLUSTER):
            group = members[start : start + CLUSTER]
            options = list(range(count))
            rng.shuffle(options)

            def free(detail: int, group_: list[int], kind_: str = kind) -> bool:
                keys = [(plans[i]["place"], detail) for i in group_]
                return len(set(keys)) == len(keys) and not any(k in taken[kind_] for k in keys)

            shared = next((d for d in options if free(d, group)), None)
            for i in group:
                detail = shared if shared is not None else next(d for d in options if free(d, [i]))
                plans[i]["detail"] = detail
                taken[kind].append((plans[i]["place"], detail))


def _answers(rng: random.Random, lang: Language, plans: list[dict[str, Any]]) -> list[str]:
    counts = Counter(plan["kind"] for plan in plans)
    tickets = _ids(rng, lang.ticket_prefix, lang.ticket_digits, counts["ticket"])
    owners = lang.contractors(rng, counts["owner"])
    # Amounts of four digits (1,200 to 9,890 in tens), so no amount is inside another.
    amounts = [lang.amount(10 * v) for v in rng.sample(range(120, 990), counts["amount"])]
    # Months from March (no "1月" inside "11月"), two-digit days, on the hour or half past.
    slots = [(m, d, h, mi) for m in range(3, 13) for d in range(10, 29) for h in range(8, 18)
             for mi in (0, 30)]  # fmt: skip
    dates: list[str] = []
    for slot in rng.sample(slots, len(slots)):
        if len(dates) == counts["date"]:
            break
        text = lang.date(*slot)  # "8点" is inside "8点半": neither goes with the other
        if not any(text in other or other in text for other in dates):
            dates.append(text)
    pools = {"ticket": tickets, "owner": owners, "amount": amounts, "date": dates}
    return [pools[plan["kind"]].pop() for plan in plans]


def _fill(rng: random.Random, lang: Language, template: str, **values: Any) -> str:
    """Fill a template; people, days and a task for small talk are drawn fresh when unnamed."""
    if "{person" in template:
        values.setdefault("person", rng.choice(lang.people))
        if "{person2}" in template:
            values["person2"] = rng.choice([p for p in lang.people if p != values["person"]])
    if "{day}" in template:
        values.setdefault("day", rng.choice(lang.days))
    if "{task" in template:
        values.setdefault("task", rng.choice(lang.tasks))
    text = template.format(**values)
    return text[0].upper() + text[1:] if lang.capitalise else text


def _write_conversation(
    rng: random.Random,
    lang: Language,
    cid: str,
    plan: dict[str, Any],
    places: list[Forms],
    answer: str,
    start: datetime,
) -> tuple[dict[str, Any], Fact]:
    roles = ["user", "assistant"] * 3
    parts: list[list[str]] = [[] for _ in roles]
    place = places[plan["place"]]
    term = (lang.defects if plan["kind"] == "ticket" else lang.tasks)[plan["detail"]]
    parts[0].append(_fill(rng, lang, rng.choice(lang.openers), home=places[plan["home"]]))

    # Never the opening or closing turn: the answer stays near the start of its message.
    fact_turn = rng.randrange(1, 5)
    role = roles[fact_turn]
    template = rng.choice(lang.leads[role]) + rng.choice(lang.facts[plan["kind"]])
    sentence = _fill(rng, lang, template, place=place, task=term, defect=term, answer=answer)
    parts[fact_turn].append(sentence)
    if role == "assistant":  # a reported fact answers a lookup request
        ask = _fill(rng, lang, rng.choice(lang.ask_before_lookup), place=place)
        parts[fact_turn - 1].append(ask)

    pieces: list[tuple[str, dict[str, Any]]] = [("day", {})]
    if plan["other"] >= 0:
        pieces.append(("place", {"place": places[plan["other"]]}))
    if plan["talks_task"]:
        pieces.append(("task", {"place": places[plan["home"]]}))
    free_turns = [t for t in range(len(roles)) if t not in (fact_turn, fact_turn - 1)]
    rng.shuffle(free_turns)
    for (what, values), turn in zip(pieces, free_turns, strict=False):
        parts[turn].append(_fill(rng, lang, rng.choice(lang.talk[roles[turn], what]), **values))
    for turn, who in enumerate(roles):
        if not parts[turn]:
            parts[turn].append(rng.choice(lang.fillers[who]))

    joiner = "" if not lang.capitalise else " "
    turns, moment = [], start
    for turn, who in enumerate(roles):
        text = joiner.join(parts[turn])
        turns.append({"id": f"{cid}-t{turn}", "role": who, "text": text,
                      "ts": moment.strftime("%Y-%m-%dT%H:%M:%SZ")})  # fmt: skip
        moment += timedelta(seconds=rng.randrange(15, 240))
    body = {"user": USER, "conversation_id": cid, "turns": turns}
    return body, Fact(cid, plan["kind"], answer, sentence, place["name"], term["fact"])


def _pick_questions(plans: list[dict[str, Any]], count: int) -> list[int]:
    """Conversations spread evenly over the history, the kinds in turn (as history_clinic)."""
    n, picked, taken = len(plans), [], [False] * len(plans)
    for j in range(count):
        centre = (2 * j + 1) * n // (2 * count)
        wanted = KINDS[j % len(KINDS)]
        free = [i for i in range(n) if not taken[i]]
        of_kind = [i for i in free if plans[i]["kind"] == wanted]
        best = min(of_kind or free, key=lambda i: (abs(i - centre), i))
        taken[best] = True
        picked.append(best)
    return picked


def _question(
    rng: random.Random,
    lang: Language,
    fact: Fact,
    plan: dict[str, Any],
    places: list[Forms],
    start: datetime,
) -> Question:
    kind, place = plan["kind"], places[plan["place"]]
    term = (lang.defects if kind == "ticket" else lang.tasks)[plan["detail"]]
    # A date question names no month: the month is part of the answer.
    contexts = [c for c in lang.question_context if kind != "date" or "{month}" not in c]
    context = rng.choice(contexts).format(
        month=lang.months[start.month - 1],
        person=rng.choice(lang.people),
        home=places[plan["home"]],
    )
    core = _fill(rng, lang, rng.choice(lang.questions[kind]), place=place, task=term, defect=term)
    short = lang.short_queries[kind].format(place=place, task=term, defect=term)
    return Question(context + core, short, fact.answer, fact.conversation_id, kind)


def shared_words(lang: Language, question: str, fact: str, names: list[str]) -> list[str]:
    """The question's content units (``lang.content_words``) that its fact has too, once the
    names (buildings, people) are taken out of both."""
    for name in sorted(names, key=len, reverse=True):
        question, fact = question.replace(name, " "), fact.replace(name, " ")
    in_fact = set(lang.content_words(fact))
    return [word for word in lang.content_words(question) if word in in_fact]


def names_of(lang: Language, places: list[Forms]) -> list[str]:
    """Every name a question may share with its fact: each building's forms, and the staff."""
    return [*(form for place in places for form in place.values()), *lang.people]


def _check_language(
    lang: Language,
    conversations: list[dict[str, Any]],
    facts: list[Fact],
    qs: list[Question],
    places: list[Forms],
) -> None:
    """history.py's checks, plus: keys unique per kind, and the paraphrase rule (raises)."""
    ids = rf"(?<![A-Za-z]){lang.ticket_prefix}-\d+(?!\d)"
    _check(conversations, facts, qs, ids, ("ticket",))
    texts = ["\n".join(turn["text"] for turn in body["turns"]) for body in conversations]
    for fact in facts:  # every fact's, not only the asked ones: a miss analysis needs them too
        found = [body["conversation_id"] for body, text in zip(conversations, texts, strict=True)
                 if fact.answer in text]  # fmt: skip
        if found != [fact.conversation_id]:
            raise RuntimeError(f"answer {fact.answer!r} is not unique to {fact.conversation_id}")
    keys = Counter((fact.kind, fact.equipment, fact.detail) for fact in facts)
    for key, count in keys.items():
        if count > 1:
            raise RuntimeError(f"{count} facts share the key {key}")
    by_id = {fact.conversation_id: fact for fact in facts}
    names = names_of(lang, places)
    for q in qs:
        shared = shared_words(lang, q.question, by_id[q.conversation_id].sentence, names)
        if shared:
            raise RuntimeError(f"question for {q.conversation_id} repeats the fact's {shared}")


def generate(code: str, n: int, seed: int = 7, questions: int = DEFAULT_QUESTIONS) -> History:
    """A history in language ``code`` of ``n`` conversations and ``min(questions, n)`` questions."""
    if n < 1:
        raise ValueError("n must be at least 1")
    lang = LANGUAGES[code]()
    rng = random.Random(f"{code}-{seed}")
    plans = _deal_plans(rng, n)
    _cluster_details(rng, plans, lang)
    places = lang.places(rng, max(max(p["home"], p["place"], p["other"]) for p in plans) + 1)
    answers = _answers(rng, lang, plans)
    starts = _start_times(rng, n)
    width = max(5, len(str(n)))
    conversations, facts = [], []
    for i, plan in enumerate(plans):
        body, fact = _write_conversation(
            rng, lang, f"c{i + 1:0{width}d}", plan, places, answers[i], starts[i]
        )
        conversations.append(body)
        facts.append(fact)
    picked = _pick_questions(plans, min(questions, n))
    qs = [_question(rng, lang, facts[i], plans[i], places, starts[i]) for i in picked]
    _check_language(lang, conversations, facts, qs, places)
    return History(conversations=conversations, questions=qs, facts=facts)


def _load(code: str) -> Language:
    from importlib import import_module

    return import_module(f"benchmark.languages.{code}").LANGUAGE


LANGUAGES: dict[str, Callable[[], Language]] = {
    code: partial(_load, code) for code in ("de", "es", "zh", "zh_school", "ja")
}


def generator(code: str) -> Callable[..., History]:
    """``generate`` for one language, with ``history.generate``'s signature (for run.py)."""
    return partial(generate, code)


def latin_words(stopwords: frozenset[str], endings: tuple[str, ...]) -> Callable[[str], list[str]]:
    """Content words of a Latin-script text: lower-cased whole words (a compound stays one word,
    as a word tokenizer keeps it), stopwords out, one inflectional ending cut (longest first)."""

    def words(text: str) -> list[str]:
        out = []
        for word in re.findall(r"[^\W\d_]+", text.lower()):
            if len(word) < 3 or word in stopwords:
                continue
            for ending in endings:
                if word.endswith(ending) and len(word) - len(ending) >= 4:
                    word = word[: -len(ending)]
                    break
            out.append(word)
        return out

    return words


def han_words(stop_bigrams: frozenset[str]) -> Callable[[str], list[str]]:
    """Content words of a Chinese text: character bigrams of each run of Han characters, without
    ``stop_bigrams`` and those across the particle 的 (which joins words: "院子里的树")."""

    def words(text: str) -> list[str]:
        runs = re.findall(r"[\u4e00-\u9fff]+", text)
        grams = [run[i : i + 2] for run in runs for i in range(len(run) - 1)]
        return [gram for gram in grams if gram not in stop_bigrams and "的" not in gram]

    return words


def firms(names: tuple[str, ...], kinds: tuple[str, ...]) -> Callable[..., list[str]]:
    """A language's ``contractors``: ``count`` distinct names, each with a kind of firm."""

    def contractors(rng: random.Random, count: int) -> list[str]:
        if count > len(names):
            raise ValueError(f"too many conversations: {count} contractors needed")
        return [name + rng.choice(kinds) for name in rng.sample(names, count)]

    return contractors


def term_table(table: str) -> tuple[Forms, ...]:
    """Rows of ``usual words | paraphrase | short paraphrase (an agent's words)``."""
    rows = (tuple(part.strip() for part in row.split("|")) for row in table.strip().splitlines())
    return tuple({"fact": fact, "asked": asked, "q_short": short} for fact, asked, short in rows)
