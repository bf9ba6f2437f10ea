"""A synthetic, seeded conversation history for one user: the recall benchmark's ground truth.

This reproduces the history described in the seed article ("Measurements"): ``n`` conversations
of six messages, each hiding exactly one checkable fact among operations small talk, plus
paraphrased questions whose answer is a string that must appear in what recall returns.

Design, in the order ``generate`` runs it:

1. **Fact kinds.** Every block of four conversations holds one of each kind (ticket, QC reject
   rate, task owner, decision), shuffled, so any stretch of the history is balanced.
2. **Near-identical facts.** Facts of one kind are grouped in clusters of three spread over the
   history; a cluster shares the equipment kind and the detail (symptom, task or product), so the
   same "vibration alarm keeps coming back" sits on three different compressors and only the ID
   tells them apart: the failure mode the article's misses had in common.
3. **Recurrence.** Each conversation has three equipment slots (the fact's and two in small talk)
   and one or two site slots. Slots are dealt from a pool where every entity occurs six times, so
   every site and piece of equipment appears in five or six conversations (never in two slots of
   one). The twelve people, the task types and the symptoms recur everywhere, so a question has
   to match a combination (equipment + detail + kind of fact), never one rare word.
4. **Uniqueness.** The key a question asks about (equipment + symptom for a ticket, equipment +
   task for an owner or decision, line + product for QC) is unique within its kind, and every
   answer string is unique in the corpus: ticket and decision IDs are drawn without replacement;
   owner and QC answers carry their subject ("Dana owns the calibration of sensor S-112",
   "line L-07 rejected 3.4%") because a bare name or percentage recurs. ``generate`` checks this
   and raises if it ever breaks.
5. **Questions.** Picked evenly over the history (one per window, preferring a rotating kind),
   each with a long paraphrased question that avoids the fact's words ("which work order number
   was raised for the leaking seal on ..." for "Ticket MT-1040 is open for the seal leak on ...")
   and an agent-style short query ("pump P-003 seal leak ticket").

Everything draws from one ``random.Random(seed)``; no global state, no iteration over sets, so
the same arguments give the same history byte for byte. The fact always sits in the first
sentence or two of a short message, so it survives funes' 160-character neighbour previews.

CLI: ``python -m benchmark.history N --out DIR`` writes ``conversations.jsonl`` (one ``POST
/turns`` body per line) and ``questions.json`` for inspection.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

USER = "bench-user"
KINDS = ("ticket", "qc", "owner", "decision")
PER_ENTITY = 6  # conversations each site and piece of equipment appears in (the article's figure)
CLUSTER = 3  # near-identical facts per group: "the same symptom on three machines"
SMALL_TALK_EQUIPMENT = 2  # equipment slots per conversation besides the fact's
SECOND_SITE_SHARE = 0.5  # share of conversations that mention a second site in small talk
# A Monday; the whole history lies in the past, since the server refuses turns stamped more than
# a day ahead of its clock (it was 2026-01-05: 52 weeks later, the same weekdays, but its last
# weeks ran past the day this bound came in, 2026-12-01).
YEAR_START = datetime(2025, 1, 6, tzinfo=UTC)
YEAR_DAYS = 350  # about a year of working history

PEOPLE = (
    "Dana", "Tomas", "Priya", "Marek", "Aisha", "Jonas",
    "Lena", "Ravi", "Sofia", "Kenji", "Elif", "Owen",
)  # fmt: skip
SHIFTS = ("early", "late", "night")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip

# Site names are prefix + suffix; no suffix starts another, so no site name contains another.
SITE_PREFIXES = (
    "Ash", "Birch", "Cedar", "Elm", "Fern", "Glen", "Hazel", "Holly", "Iron", "Kings", "Lark",
    "Marsh", "Mill", "Oak", "Pine", "Quarry", "Red", "Stone", "Thorn", "Black", "White", "Green",
    "Gold", "Silver", "Clay", "Sand", "Fox", "Hart", "Wolf", "Raven", "Crow", "Hawk", "Heron",
    "Swan", "Alder", "Rowan", "Willow", "Maple", "Beech", "Yew", "Ember", "Frost", "Storm",
    "Bright", "Fair", "High", "Long", "Broad", "Deep", "Cold", "Salt", "Coal", "Chalk", "Flint",
    "Copper", "Moss", "Reed", "Bram", "Dun", "Kel", "Lang", "Nor", "Wex", "Pen",
)  # fmt: skip
SITE_SUFFIXES = (
    "field", "ford", "brook", "haven", "moor", "dale", "wick", "bury", "gate", "well", "wood",
    "bridge", "stead", "mouth", "port", "ridge", "hill", "vale", "cross", "hurst", "combe",
    "thorpe", "ham", "ley", "stow", "worth", "march", "fold", "shaw", "holm", "mere", "crest",
    "lock", "bank", "end", "side", "croft", "garth", "heath", "knoll", "lea", "minster", "pool",
    "rigg", "tor", "yard", "nook", "row",
)  # fmt: skip


@dataclass(frozen=True)
class Symptom:
    fact: str  # as the fact states it: "the seal leak"
    asked: str  # as the question paraphrases it: "the leaking seal"
    short: str  # as an agent would type it: "seal leak"


@dataclass(frozen=True)
class Task:
    noun: str  # "calibration" (fact: "owns the calibration of sensor S-112")
    gerund: str  # "calibrating" (question: "responsible for calibrating sensor S-112")


@dataclass(frozen=True)
class EquipmentKind:
    label: str  # "pump"
    prefix: str  # "P" -> "P-003"
    width: int  # digits in the ID when few are needed
    symptoms: tuple[Symptom, ...]
    tasks: tuple[Task, ...]


# key | as the fact states it | as the question paraphrases it | as an agent would type it
_SYMPTOM_TABLE = """
vibration | the vibration alarm that keeps coming back | the recurring vibration alarm | vibration
seal | the seal leak | the leaking seal | seal leak
bearing | the bearing running hot | the overheating bearing | hot bearing
pressure | the pressure drop at the outlet | the falling outlet pressure | pressure drop
trips | the motor tripping on overload | the overload trips of the motor | motor trips
oil | the oil leak under the gearbox | oil dripping from the gearbox | gearbox oil leak
cavitation | the cavitation noise | the noise that sounds like cavitation | cavitation
discharge | the high discharge temperature | the discharge running too hot | discharge temperature
surge | the surge events | the surging | surge
drift | the drifting reading | readings that wander off | drift
dropouts | the signal dropouts | the signal cutting out | signal dropouts
frozen | the frozen reading | the value stuck at one number | frozen reading
tolerance | the reading out of tolerance | values outside the allowed band | out of tolerance
noise | the noisy signal | the jumpy signal | noisy signal
slip | the belt slipping | the slipping belt | belt slip
jam | the jam at the transfer point | the blockages where product transfers | transfer jam
rollers | the noisy rollers | the rollers making a racket | roller noise
tube | the tube leak | the leaking tube | tube leak
fouling | the fouling | the build-up of deposits | fouling
cold | the low outlet temperature | the outlet not getting warm enough | low outlet temperature
passing | the valve passing when closed | the valve letting by when shut | passing
actuator | the actuator fault | the faulty actuator | actuator fault
packing | the packing leak | the leaking packing | packing leak
stroke | the slow stroke | the valve taking ages to move | slow stroke
microstops | the micro-stops | the frequent short stoppages | micro-stops
labeler | the labeler jams | the labelling machine jamming | labeler jams
jaws | the sealing jaw temperature swings | the unstable sealing jaw temperature | sealing jaws
"""
_S = {
    key.strip(): Symptom(*(part.strip() for part in rest))
    for key, *rest in (row.split("|") for row in _SYMPTOM_TABLE.strip().splitlines())
}
_T = {
    "overhaul": Task("overhaul", "overhauling"),
    "seals": Task("seal replacement", "replacing the seals on"),
    "alignment": Task("alignment check", "checking the alignment of"),
    "vibration": Task("vibration survey", "measuring vibration on"),
    "grease": Task("lubrication round", "greasing"),
    "impeller": Task("impeller inspection", "inspecting the impeller of"),
    "valves": Task("valve inspection", "inspecting the valves on"),
    "oil": Task("oil change", "changing the oil in"),
    "filters": Task("filter change", "swapping the filters on"),
    "calibration": Task("calibration", "calibrating"),
    "firmware": Task("firmware update", "updating the firmware on"),
    "loop": Task("loop check", "testing the signal loop of"),
    "replacement": Task("replacement", "swapping out"),
    "cleaning": Task("cleaning", "cleaning"),
    "verification": Task("verification", "verifying"),
    "belt": Task("belt tensioning", "re-tensioning the belt on"),
    "rollers": Task("roller replacement", "replacing the rollers on"),
    "guards": Task("safety inspection", "inspecting the guards and e-stops on"),
    "pressure": Task("pressure test", "pressure testing"),
    "gaskets": Task("gasket replacement", "replacing the gaskets on"),
    "inspection": Task("inspection", "inspecting"),
    "plugging": Task("tube plugging", "plugging the leaking tubes in"),
    "stroke": Task("stroke test", "stroke testing"),
    "repack": Task("packing replacement", "repacking"),
    "actuator": Task("actuator overhaul", "rebuilding the actuator on"),
    "positioner": Task("positioner calibration", "calibrating the positioner on"),
    "changeover": Task("changeover checklist", "running the changeover checklist on"),
    "audit": Task("weekly audit", "auditing"),
    "first": Task("first-article check", "checking the first pieces off"),
    "speed": Task("speed trial", "trialling a higher speed on"),
    "deepclean": Task("deep clean", "deep-cleaning"),
}


def _kind(label: str, prefix: str, width: int, symptoms: str, tasks: str) -> EquipmentKind:
    return EquipmentKind(
        label,
        prefix,
        width,
        tuple(_S[key] for key in symptoms.split()),
        tuple(_T[key] for key in tasks.split()),
    )


# At least six symptoms and tasks per kind: a machine appears in at most six conversations, so
# it can never run out of distinct (machine, detail) keys.
EQUIPMENT = (
    _kind("pump", "P", 3, "seal vibration bearing pressure trips cavitation",
          "overhaul seals alignment vibration grease impeller"),
    _kind("compressor", "K", 3, "vibration discharge surge oil bearing trips",
          "overhaul valves oil vibration alignment filters"),
    _kind("sensor", "S", 3, "drift dropouts frozen tolerance noise vibration",
          "calibration firmware loop replacement cleaning verification"),
    _kind("conveyor", "C", 3, "slip jam rollers trips vibration oil",
          "belt rollers alignment grease guards overhaul"),
    _kind("heat exchanger", "E", 3, "tube fouling cold pressure seal vibration",
          "cleaning pressure gaskets inspection overhaul plugging"),
    _kind("valve", "V", 3, "passing actuator packing stroke seal vibration",
          "stroke repack actuator positioner inspection replacement"),
    _kind("line", "L", 2, "microstops labeler jaws trips jam vibration",
          "changeover audit first speed deepclean guards"),
)  # fmt: skip
LINE = len(EQUIPMENT) - 1  # QC facts are about production lines
# Small talk leans on machines; lines still recur through QC facts.
SMALL_TALK_WEIGHTS = (3, 3, 3, 2, 2, 2, 1)

PRODUCTS = (
    ("gasket", "gaskets"), ("bracket", "brackets"), ("valve body", "valve bodies"),
    ("housing", "housings"), ("impeller", "impellers"), ("flange", "flanges"),
    ("end cap", "end caps"), ("shaft", "shafts"), ("cover plate", "cover plates"),
)  # fmt: skip
ACTIONS = (  # (as decided, as asked)
    ("postpone", "push back"), ("approve", "go ahead with"), ("bring forward", "pull forward"),
    ("cancel", "drop"), ("outsource", "contract out"), ("schedule", "book in"),
)  # fmt: skip

# --- text templates: {eq} is "pump P-003", {site} a site name, {person}/{person2} people -------

OPENERS = (
    "Morning. Catching up on {site} before the {shift} shift starts.",
    "Back from the walk-round at {site}, a few things to log.",
    "Quick update from the {site} site.",
    "Hi, doing the {day} review for {site} now.",
    "Handover notes for {site}, {shift} shift.",
    "Hey, {person} asked me to go through the {site} list with you.",
    "Start of the week at {site}, let's sort a few items.",
    "On site at {site} today, busy one.",
    "Evening. Wrapping up at {site}.",
)
USER_EQUIPMENT = (
    "{person} walked past {eq} this morning, nothing unusual.",
    "Spare parts for {eq} finally arrived, {person} signed for them.",
    "{person} mentioned {symptom} on {eq} last week, but it cleared on its own.",
    "Can you remind me to ask {person} about the drawings for {eq}?",
    "{person} says the {task} on {eq} went smoothly.",
    "The contractor wants access to {eq} on {day}, {person} is checking the permit.",
    "{eq} sounded rough during the {shift} shift, {person} thinks it's just the new guard.",
    "Photos of {eq} are in the shared folder, {person} took them.",
    "Not urgent, but the tag on {eq} is faded again.",
    "{person} and {person2} had a look at {eq} together, no action for now.",
    "Is the {task} for {eq} still in next month's plan?",
)
USER_SITE = (
    "{person} is over at {site} until {day}.",
    "{site} borrowed our forklift again.",
    "The {site} team is short-staffed on the {shift} shift this week.",
    "Heard {site} had a power dip yesterday, nothing on our side.",
    "{person} wants to compare notes with {site} next week.",
    "Training at {site} got moved to {day}.",
)
ASSISTANT_EQUIPMENT = (
    "Noted. I'll keep {eq} on the watch list.",
    "Got it, {eq} stays on the list for the next round with {person}.",
    "Understood. If {symptom} shows up on {eq} again it's worth logging.",
    "Okay, I'll add a reminder to look at {eq} on {day}.",
    "Makes sense. {person} knows {eq} best.",
    "Right. The last {task} on {eq} was a while ago, worth keeping in mind.",
)
ASSISTANT_SITE = (
    "Thanks, I'll note that {person} is at {site}.",
    "Okay. {site} could lend a hand if the {shift} shift runs short.",
    "Noted for {site} as well.",
    "{site} had a similar week, {person} said.",
)
USER_FILLERS = (
    "Thanks.", "That's it for now.", "Good, let's move on.", "Coffee first, then the rest.",
    "Anything else on your side?", "Okay.",
)  # fmt: skip
ASSISTANT_FILLERS = (
    "Noted.", "Okay, anything else?", "Sure, I've logged that.", "All right. Have a good shift.",
    "Good, that's everything on my list.", "Understood.",
)  # fmt: skip
ASK_BEFORE_LOOKUP = (  # the user turn before a fact the assistant reports
    "Can you pull up what we have on {eq}?",
    "What's the latest on {eq}?",
    "Check the log for {eq}, please.",
)
LEADS = {  # lead-ins of the fact sentence; the fact core follows
    "user": ("", "One for the log: ", "Also, ", "Before I forget, ", "For the handover: "),
    "assistant": ("Checked the log: ", "From the maintenance log: ", "Yes, ", "Right, "),
}
FACTS = {
    "ticket": (
        "ticket {answer} is open for {symptom} on {eq}.",
        "ticket {answer} is open for {symptom} on {eq}, {person} logged it.",
        "{person} opened ticket {answer} for {symptom} on {eq}.",
    ),
    "qc": (  # must contain "{eq} rejected {rate}%": that is the answer
        "QC on {eq} rejected {rate}% of units in the {product} batch.",
        "QC results are in, {eq} rejected {rate}% of the {product} batch.",
        "{shift} shift QC: {eq} rejected {rate}% of {product} units.",
    ),
    "owner": (  # must contain "{owner} owns the {task} of {eq}": that is the answer
        "{owner} owns the {task} of {eq}.",
        "{owner} owns the {task} of {eq} from now on, {person} will support.",
        "we agreed that {owner} owns the {task} of {eq}.",
    ),
    "decision": (
        "decision {answer}: {action} the {task} of {eq}.",
        "decision {answer}: {action} the {task} of {eq}, {person} will tell the crew.",
        "decision {answer} was logged: {action} the {task} of {eq}.",
    ),
}
QUESTION_CONTEXT = (
    "",
    "Back in {month} we talked about {site}. ",
    "I'm trying to remember something from a chat about the {site} site. ",
    "Thinking of an earlier conversation from {month}. ",
)
QUESTIONS = {  # paraphrased away from the fact's words
    "ticket": (
        "Which work order number was raised for {symptom} on {eq}?",
        "What is the maintenance job number we have for {symptom} on {eq}?",
        "Under which work order is {symptom} on {eq} being tracked?",
    ),
    "qc": (
        "What share of the {product} from {eq} failed inspection?",
        "How much of the {product} run on {eq} did quality control throw out, as a percentage?",
        "What percentage of {product} made on {eq} didn't pass inspection?",
    ),
    "owner": (
        "Who is responsible for {task} {eq}?",
        "Which colleague is in charge of {task} {eq}?",
        "Who did we put down to take care of {task} {eq}?",
    ),
    "decision": (
        "What was the reference of the call to {action} {task} {eq}?",
        "Under which reference did we agree to {action} {task} {eq}?",
        "Which record number covers the choice to {action} {task} {eq}?",
    ),
}
SHORT_QUERIES = {  # agent style: identifiers and key nouns
    "ticket": "{eq} {symptom} ticket",
    "qc": "{eq} {product} QC reject rate",
    "owner": "{eq} {task} owner",
    "decision": "{eq} {task} decision",
}


@dataclass(frozen=True)
class Question:
    question: str  # long and paraphrased, as a person would ask
    short_query: str  # identifier-heavy, as an agent would call the tool
    answer: str  # must appear in the text recall returns; unique in the whole history
    conversation_id: str
    kind: str  # one of KINDS


@dataclass(frozen=True)
class Fact:
    conversation_id: str
    kind: str
    answer: str
    sentence: str  # the fact as it appears in the conversation
    equipment: str  # "pump P-003"
    detail: str  # the symptom, task or product that, with the equipment, identifies the fact


@dataclass
class History:
    conversations: list[dict[str, Any]]  # POST /turns bodies, in chronological order
    questions: list[Question]
    facts: list[Fact] = field(default_factory=list)  # one per conversation, for miss analysis
    # Questions of kind "month": a month named as part of the subject ("the July delivery"),
    # asked apart from ``questions`` so their figures stay comparable (add_month_subjects).
    month_questions: list[Question] = field(default_factory=list)


@dataclass
class _Plan:
    """What one conversation holds before it is written out."""

    kind: str
    fact_equipment_kind: int
    small_talk_kinds: list[int]
    sites: list[int] = field(default_factory=list)  # [home site, optional second site]
    equipment: list[int] = field(default_factory=list)  # entity index per slot, fact's first
    detail: int = -1  # index into the symptoms, tasks or PRODUCTS


def generate(n: int, seed: int = 7, questions: int = 100) -> History:
    """Build a history of ``n`` conversations and ``min(questions, n)`` questions about it."""
    if n < 1:
        raise ValueError("n must be at least 1")
    rng = random.Random(seed)
    plans = _plan_kinds(rng, n)
    clusters = _cluster(rng, plans)
    equipment_ids = _deal_equipment(rng, plans)
    site_names = _deal_sites(rng, plans)
    facts_data = _choose_details(rng, plans, clusters, equipment_ids)
    starts = _start_times(rng, n)
    width = max(5, len(str(n)))
    conversations: list[dict[str, Any]] = []
    facts: list[Fact] = []
    for index, plan in enumerate(plans):
        cid = f"c{index + 1:0{width}d}"
        body, fact = _write_conversation(
            rng, cid, plan, facts_data[index], equipment_ids, site_names, starts[index]
        )
        conversations.append(body)
        facts.append(fact)
    picked = _pick_questions(plans, min(questions, n))
    qs = [
        _question(rng, facts[i], facts_data[i], site_names[plans[i].sites[0]], starts[i])
        for i in picked
    ]
    _check(conversations, facts, qs)
    month_qs = add_month_subjects(
        conversations,
        [site_names[plan.sites[0]] for plan in plans],
        {q.conversation_id for q in qs},
        OPS_MONTH_SUBJECTS,
        seed=seed,
        count=len(qs) // MONTH_QUESTION_SHARE,
    )
    _check(conversations, facts, qs + month_qs)
    return History(conversations=conversations, questions=qs, facts=facts, month_questions=month_qs)


# --- planning ----------------------------------------------------------------------------------


def _plan_kinds(rng: random.Random, n: int) -> list[_Plan]:
    kinds: list[str] = []
    while len(kinds) < n:
        block = list(KINDS)
        rng.shuffle(block)  # one of each kind per four conversations keeps any stretch balanced
        kinds.extend(block)
    plans = []
    for kind in kinds[:n]:
        small = rng.choices(range(len(EQUIPMENT)), SMALL_TALK_WEIGHTS, k=SMALL_TALK_EQUIPMENT)
        plans.append(_Plan(kind=kind, fact_equipment_kind=-1, small_talk_kinds=small))
    return plans


def _cluster(rng: random.Random, plans: list[_Plan]) -> list[list[int]]:
    """Group facts of one kind in threes that share an equipment kind (and later a detail)."""
    clusters: list[list[int]] = []
    for kind in KINDS:
        members = [i for i, plan in enumerate(plans) if plan.kind == kind]
        rng.shuffle(members)  # spread each cluster over the whole history
        for start in range(0, len(members), CLUSTER):
            group = members[start : start + CLUSTER]
            eq_kind = LINE if kind == "qc" else rng.randrange(len(EQUIPMENT))
            for i in group:
                plans[i].fact_equipment_kind = eq_kind
            clusters.append(group)
    return clusters


def _deal(rng: random.Random, owners: list[int], minimum: int = 1) -> list[int]:
    """Assign entities to slots: each entity fills at most PER_ENTITY slots, none twice per owner.

    ``owners[s]`` is the conversation of slot ``s``; returns the entity index of each slot.
    """
    count = max(math.ceil(len(owners) / PER_ENTITY), minimum)
    # Round robin: entity counts differ by at most one (5 or 6 each once histories are large).
    pool = [s % count for s in range(len(owners))]
    rng.shuffle(pool)
    held: dict[int, list[int]] = {}
    for slot, owner in enumerate(owners):
        held.setdefault(owner, []).append(pool[slot])
    for slot, owner in enumerate(owners):
        if held[owner].count(pool[slot]) == 1:
            continue
        # A duplicate inside one conversation: swap with a slot elsewhere that takes it cleanly.
        # Random probes almost always succeed at once; the full scan proves impossibility.
        probes = [rng.randrange(len(owners)) for _ in range(32)]
        for other in itertools.chain(probes, range(len(owners))):
            mine, theirs = pool[slot], pool[other]
            other_owner = owners[other]
            if other_owner == owner or theirs in held[owner] or mine in held[other_owner]:
                continue
            pool[slot], pool[other] = theirs, mine
            held[owner].remove(mine)
            held[owner].append(theirs)
            held[other_owner].remove(theirs)
            held[other_owner].append(mine)
            break
        else:
            raise RuntimeError("cannot deal entities without repeating one in a conversation")
    return pool


def _ids(rng: random.Random, prefix: str, width: int, count: int) -> list[str]:
    """``count`` distinct IDs of one fixed width (fixed, so no ID is a substring of another)."""
    while 10**width - 10 ** (width - 1) < 2 * count:
        width += 1
    low = 1 if width <= 3 else 10 ** (width - 1)  # equipment numbers may be zero-padded
    return [f"{prefix}-{number:0{width}d}" for number in rng.sample(range(low, 10**width), count)]


def _deal_equipment(rng: random.Random, plans: list[_Plan]) -> list[list[str]]:
    """Deal equipment per kind; returns, per kind, the labelled names ("pump P-003")."""
    names: list[list[str]] = []
    for kind_index, kind in enumerate(EQUIPMENT):
        owners: list[int] = []
        positions: list[tuple[int, int]] = []
        for i, plan in enumerate(plans):
            for position, slot_kind in enumerate(
                [plan.fact_equipment_kind, *plan.small_talk_kinds]
            ):
                if slot_kind == kind_index:
                    owners.append(i)
                    positions.append((i, position))
        most_per_conversation = max(Counter(owners).values(), default=1)
        dealt = _deal(rng, owners, minimum=most_per_conversation)
        count = max(dealt, default=-1) + 1
        names.append([f"{kind.label} {id_}" for id_ in _ids(rng, kind.prefix, kind.width, count)])
        for (i, position), entity in zip(positions, dealt, strict=True):
            plan = plans[i]
            while len(plan.equipment) <= position:
                plan.equipment.append(-1)
            plan.equipment[position] = entity
    return names


def _deal_sites(rng: random.Random, plans: list[_Plan]) -> list[str]:
    owners: list[int] = []
    for i in range(len(plans)):
        owners.append(i)
        if rng.random() < SECOND_SITE_SHARE:
            owners.append(i)
    dealt = _deal(rng, owners, minimum=2)
    for owner, entity in zip(owners, dealt, strict=True):
        plans[owner].sites.append(entity)
    names = [p + s for p in SITE_PREFIXES for s in SITE_SUFFIXES]
    rng.shuffle(names)
    count = max(dealt) + 1
    # Beyond the pool (n > ~12,000) reuse names with a district: rare, and still distinct strings.
    districts = ("", " North", " South", " East", " West")
    return [names[i % len(names)] + districts[i // len(names)] for i in range(count)]


def _choose_details(
    rng: random.Random,
    plans: list[_Plan],
    clusters: list[list[int]],
    equipment_ids: list[list[str]],
) -> list[dict[str, Any]]:
    """Pick each fact's detail (shared within a cluster when possible) and its answer."""
    used: dict[str, set[tuple[int, int, int]]] = {kind: set() for kind in KINDS}
    for group in clusters:
        kind = plans[group[0]].kind
        eq_kind = plans[group[0]].fact_equipment_kind
        options = list(range(_detail_count(kind, eq_kind)))
        rng.shuffle(options)
        taken = used[kind]

        def free(detail: int, members: list[int], eq_kind: int = eq_kind, taken=taken) -> bool:
            keys = [(eq_kind, plans[i].equipment[0], detail) for i in members]
            return len(set(keys)) == len(keys) and not any(k in taken for k in keys)

        # Prefer one detail for the whole cluster (the near-identical facts); else per fact.
        shared = next((d for d in options if free(d, group)), None)
        for i in group:
            detail = shared if shared is not None else next(d for d in options if free(d, [i]))
            plans[i].detail = detail
            taken.add((eq_kind, plans[i].equipment[0], detail))

    tickets = _ids(rng, "MT", 4, sum(plan.kind == "ticket" for plan in plans))
    decisions = _ids(rng, "D", 4, sum(plan.kind == "decision" for plan in plans))
    rates: set[tuple[int, int]] = set()
    data: list[dict[str, Any]] = []
    for plan in plans:
        kind_def = EQUIPMENT[plan.fact_equipment_kind]
        eq = equipment_ids[plan.fact_equipment_kind][plan.equipment[0]]
        item: dict[str, Any] = {"kind": plan.kind, "eq": eq}
        if plan.kind == "ticket":
            item["symptom"] = kind_def.symptoms[plan.detail]
            item["detail"] = item["symptom"].short
            item["answer"] = tickets.pop()
        elif plan.kind == "decision":
            item["task"] = kind_def.tasks[plan.detail]
            item["detail"] = item["task"].noun
            item["action"] = rng.choice(ACTIONS)
            item["answer"] = decisions.pop()
        elif plan.kind == "owner":
            item["task"] = kind_def.tasks[plan.detail]
            item["detail"] = item["task"].noun
            item["owner"] = rng.choice(PEOPLE)
            item["answer"] = f"{item['owner']} owns the {item['task'].noun} of {eq}"
        else:
            item["product"] = PRODUCTS[plan.detail]
            item["detail"] = item["product"][0]
            rate = rng.randint(4, 98)
            while (plan.equipment[0], rate) in rates:  # one line never repeats a rate
                rate = rng.randint(4, 98)
            rates.add((plan.equipment[0], rate))
            item["rate"] = f"{rate / 10:.1f}"
            item["answer"] = f"{eq} rejected {item['rate']}%"
        data.append(item)
    return data


def _detail_count(kind: str, eq_kind: int) -> int:
    if kind == "qc":
        return len(PRODUCTS)
    if kind == "ticket":
        return len(EQUIPMENT[eq_kind].symptoms)
    return len(EQUIPMENT[eq_kind].tasks)


def _start_times(rng: random.Random, n: int) -> list[datetime]:
    """Sorted conversation starts over about a year, weekdays, working hours."""
    starts = []
    for _ in range(n):
        day = YEAR_START + timedelta(days=rng.randrange(YEAR_DAYS))
        if day.weekday() >= 5:
            day -= timedelta(days=day.weekday() - 4)  # weekend chats move to Friday
        starts.append(day + timedelta(seconds=rng.randrange(6 * 3600, 20 * 3600)))
    starts.sort()
    return starts


# --- writing -----------------------------------------------------------------------------------


def _fill(rng: random.Random, template: str, **values: str) -> str:
    """Fill a template; unnamed people, shifts and days are drawn fresh each time."""
    if "{person" in template:
        values.setdefault("person", rng.choice(PEOPLE))
        if "{person2}" in template:
            values["person2"] = rng.choice([p for p in PEOPLE if p != values["person"]])
    if "{shift}" in template:
        values.setdefault("shift", rng.choice(SHIFTS))
    if "{day}" in template:
        values.setdefault("day", rng.choice(DAYS))
    text = template.format(**values)
    return text[0].upper() + text[1:]


def _equipment_values(rng: random.Random, eq_kind: int, name: str) -> dict[str, str]:
    kind = EQUIPMENT[eq_kind]
    return {
        "eq": name,
        "symptom": rng.choice(kind.symptoms).fact,
        "task": rng.choice(kind.tasks).noun,
    }


def _fact_sentence(rng: random.Random, item: dict[str, Any], role: str) -> str:
    values: dict[str, str] = {"eq": item["eq"], "answer": item["answer"]}
    if item["kind"] == "ticket":
        values["symptom"] = item["symptom"].fact
    elif item["kind"] == "qc":
        values["product"] = item["product"][0]
        values["rate"] = item["rate"]
    elif item["kind"] == "owner":
        values["task"] = item["task"].noun
        values["owner"] = item["owner"]
    else:
        values["task"] = item["task"].noun
        values["action"] = item["action"][0]
    core = rng.choice(FACTS[item["kind"]])
    person = rng.choice([p for p in PEOPLE if p != item.get("owner")])  # never a second owner
    lead = rng.choice(LEADS[role])
    text = lead + core.format(person=person, shift=rng.choice(SHIFTS), **values)
    return text[0].upper() + text[1:]


def _write_conversation(
    rng: random.Random,
    cid: str,
    plan: _Plan,
    item: dict[str, Any],
    equipment_ids: list[list[str]],
    site_names: list[str],
    start: datetime,
) -> tuple[dict[str, Any], Fact]:
    roles = ["user", "assistant"] * 3
    parts: list[list[str]] = [[] for _ in roles]
    home = site_names[plan.sites[0]]
    parts[0].append(_fill(rng, rng.choice(OPENERS), site=home))

    fact_turn = rng.randrange(5)  # never the closing turn
    sentence = _fact_sentence(rng, item, roles[fact_turn])
    ask = ""
    if roles[fact_turn] == "assistant":  # a reported fact answers a lookup request
        ask = _fill(rng, rng.choice(ASK_BEFORE_LOOKUP), eq=item["eq"])
    parts[fact_turn].append(sentence)

    # Small talk: the other equipment and the second site, each in a turn of its own.
    pieces: list[tuple[str, dict[str, str]]] = []
    kinds = [plan.fact_equipment_kind, *plan.small_talk_kinds]
    for eq_kind, entity in zip(kinds[1:], plan.equipment[1:], strict=True):
        pieces.append(("eq", _equipment_values(rng, eq_kind, equipment_ids[eq_kind][entity])))
    for site in plan.sites[1:]:
        pieces.append(("site", {"site": site_names[site]}))
    free_turns = [t for t in range(len(roles)) if t != fact_turn]
    rng.shuffle(free_turns)
    for (what, values), turn in zip(pieces, free_turns[: len(pieces)], strict=True):
        if roles[turn] == "user":
            templates = USER_EQUIPMENT if what == "eq" else USER_SITE
        else:
            templates = ASSISTANT_EQUIPMENT if what == "eq" else ASSISTANT_SITE
        parts[turn].append(_fill(rng, rng.choice(templates), **values))
    if ask:
        parts[fact_turn - 1].append(ask)  # last in its turn, right before the answer
    for turn, role in enumerate(roles):
        if not parts[turn]:
            fillers = USER_FILLERS if role == "user" else ASSISTANT_FILLERS
            parts[turn].append(rng.choice(fillers))

    turns = []
    moment = start
    for turn, role in enumerate(roles):
        turns.append(
            {
                "id": f"{cid}-t{turn}",
                "role": role,
                "text": " ".join(parts[turn]),
                "ts": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        moment += timedelta(seconds=rng.randrange(15, 240))
    body = {"user": USER, "conversation_id": cid, "turns": turns}
    fact = Fact(cid, item["kind"], item["answer"], sentence, item["eq"], item["detail"])
    return body, fact


# --- questions ---------------------------------------------------------------------------------


def _pick_questions(plans: list[_Plan], count: int) -> list[int]:
    """One conversation per equal window of the history, preferring a rotating fact kind."""
    n = len(plans)
    picked = []
    for j in range(count):
        low, high = j * n // count, (j + 1) * n // count
        centre = (low + high) // 2
        window = sorted(range(low, high), key=lambda i: abs(i - centre))
        wanted = KINDS[j % len(KINDS)]
        picked.append(next((i for i in window if plans[i].kind == wanted), window[0]))
    return picked


def _question(
    rng: random.Random, fact: Fact, item: dict[str, Any], site: str, start: datetime
) -> Question:
    kind = item["kind"]
    eq = item["eq"]
    if kind == "ticket":
        long_values = {"symptom": item["symptom"].asked}
        short_values = {"symptom": item["symptom"].short}
    elif kind == "qc":
        long_values = {"product": item["product"][1]}
        short_values = {"product": item["product"][0]}
    elif kind == "owner":
        long_values = {"task": item["task"].gerund}
        short_values = {"task": item["task"].noun}
    else:
        long_values = {"task": item["task"].gerund, "action": item["action"][1]}
        short_values = {"task": item["task"].noun}
    context = rng.choice(QUESTION_CONTEXT).format(site=site, month=MONTHS[start.month - 1])
    core = rng.choice(QUESTIONS[kind]).format(eq=eq, **long_values)
    return Question(
        question=context + core,
        short_query=SHORT_QUERIES[kind].format(eq=eq, **short_values),
        answer=item["answer"],
        conversation_id=fact.conversation_id,
        kind=kind,
    )


def _check(
    conversations: list[dict[str, Any]],
    facts: list[Fact],
    qs: list[Question],
    id_pattern: str = r"\b(?:MT|D)-\d+\b",
    id_kinds: tuple[str, ...] = ("ticket", "decision"),
) -> None:
    """Refuse to return a history whose ground truth is ambiguous (raises, even under -O).

    Facts of ``id_kinds`` answer with a reference matching ``id_pattern`` (history_clinic.py
    passes its own)."""
    texts = ["\n".join(turn["text"] for turn in body["turns"]) for body in conversations]
    # Every fact: its answer is in its own conversation and its ID-like answer nowhere else.
    id_counts: dict[str, int] = {}
    for text in texts:
        for token in set(re.findall(id_pattern, text)):
            id_counts[token] = id_counts.get(token, 0) + 1
    for fact, text in zip(facts, texts, strict=True):
        if fact.answer not in text:
            raise RuntimeError(f"{fact.conversation_id}: answer {fact.answer!r} missing")
        if fact.kind in id_kinds and id_counts.get(fact.answer) != 1:
            count = id_counts.get(fact.answer, 0)
            raise RuntimeError(f"{fact.answer!r} appears in {count} conversations")
    # Every question, literally: the answer string occurs in exactly one conversation.
    separator = "\x00"  # never inside a text, so no match spans two conversations
    corpus = separator.join(texts)
    bounds = [0]
    for text in texts:
        bounds.append(bounds[-1] + len(text) + 1)
    index_of = {body["conversation_id"]: i for i, body in enumerate(conversations)}
    for q in qs:
        if q.answer in q.question or q.answer in q.short_query:
            raise RuntimeError(f"question for {q.conversation_id} gives its answer away")
        first, last = corpus.find(q.answer), corpus.rfind(q.answer)
        own = index_of[q.conversation_id]
        if not (bounds[own] <= first and last < bounds[own + 1]):
            raise RuntimeError(f"answer {q.answer!r} is not unique to {q.conversation_id}")
    if len({q.conversation_id for q in qs}) != len(qs):
        raise RuntimeError("two questions about one conversation")


# --- month-named subjects (issue 23) ------------------------------------------------------------

# One month question per this many of the main ones.
MONTH_QUESTION_SHARE = 5


@dataclass(frozen=True)
class MonthSubjects:
    """A fact whose subject names a month ("the July delivery"), told in a conversation dated in
    another month, and how it is asked. Templates take {month} {place} {count} {person} {when}
    (``when``: the month the conversation is dated in, for a question that names both)."""

    fact: str
    answer: str
    questions: tuple[str, ...]
    short: str
    fillers: frozenset[str]  # whole turns that say nothing: the fact takes one of their places
    people: tuple[str, ...]


OPS_MONTH_SUBJECTS = MonthSubjects(
    fact="The {month} delivery for {place} came {count} pallets short, {person} is chasing it.",
    answer="came {count} pallets short",
    questions=(
        "How many pallets were missing from the {month} delivery for {place}?",
        "What was wrong with the {month} delivery to {place}?",
        "Back in {when} we talked about the {month} delivery for {place}; how short was it?",
    ),
    short="{place} {month} delivery shortfall",
    fillers=frozenset(USER_FILLERS + ASSISTANT_FILLERS),
    people=PEOPLE,
)


def add_month_subjects(
    conversations: list[dict[str, Any]],
    places: list[str],
    asked: set[str],
    subjects: MonthSubjects,
    *,
    seed: int,
    count: int,
) -> list[Question]:
    """Put up to ``count`` month-subject facts into conversations spread over the history (one
    not already asked about, in place of a filler turn), each naming a month other than the
    one the conversation is dated in, with the conversation's home ``places[i]``; their
    questions, kind "month". A generator of its own: the rest of the history stays as drawn.

    The trap they set: a month that is part of what is asked about must not lift the turns
    dated in that month above the one turn that names it."""
    rng = random.Random(f"month-subjects-{seed}")
    n = len(conversations)
    counts = rng.sample(range(3, 400), max(count, 0))
    taken: set[tuple[str, int]] = set()
    questions: list[Question] = []
    for j in range(count):
        centre = (2 * j + 1) * n // (2 * count)
        for i in sorted(range(n), key=lambda i: (abs(i - centre), i)):
            body = conversations[i]
            fillers = [t for t in body["turns"] if t["text"] in subjects.fillers]
            if body["conversation_id"] in asked or not fillers:
                continue
            dated = int(body["turns"][0]["ts"][5:7])
            month = rng.choice([m for m in range(1, 13) if m != dated])
            if (places[i], month) in taken:
                continue
            taken.add((places[i], month))
            asked.add(body["conversation_id"])
            values = {
                "month": MONTHS[month - 1],
                "when": MONTHS[dated - 1],
                "place": places[i],
                "count": str(counts[j]),
                "person": rng.choice(subjects.people),
            }
            rng.choice(fillers)["text"] = subjects.fact.format(**values)
            questions.append(
                Question(
                    question=rng.choice(subjects.questions).format(**values),
                    short_query=subjects.short.format(**values),
                    answer=subjects.answer.format(**values),
                    conversation_id=body["conversation_id"],
                    kind="month",
                )
            )
            break
    return questions


# --- CLI ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int, help="number of conversations")
    parser.add_argument("--out", type=Path, required=True, help="directory to write into")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--questions", type=int, default=100)
    args = parser.parse_args(argv)
    history = generate(args.n, seed=args.seed, questions=args.questions)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "conversations.jsonl", "w", encoding="utf-8") as handle:
        for body in history.conversations:
            handle.write(json.dumps(body, ensure_ascii=False) + "\n")
    with open(args.out / "questions.json", "w", encoding="utf-8") as handle:
        json.dump([asdict(q) for q in history.questions], handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    print(
        f"wrote {len(history.conversations)} conversations and {len(history.questions)} "
        f"questions to {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
