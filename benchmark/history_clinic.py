"""A second synthetic history, in another domain: a small veterinary practice with branches.

Written as a held-out check (issue 9) before any ranking was tuned on it, and blind to the
ranking: the ranking must not be tuned on this file. Same shape as ``history.py`` (``generate``
returns its ``History``, so ``benchmark/run.py --history clinic`` measures it the same way), but
its questions are harder in one deliberate way: every long question names its task, procedure or
medicine by other words than the fact (a synonym or a description: "who is looking after the
fortnightly fridge temperature log at Ormford?" for "Freya is on the vaccine cold-chain check at
Ormford"), plus a place or person that small talk mentions too ("The weather looks fine for the
Ormford run."). A question shares no word with its fact but names; ``_check_clinic`` raises if so.

1. **Fact kinds**, one of each per block of four conversations: a *booking* (reference
   ``BK-12345`` for a procedure on a patient at a branch), a *dose* (a patient, a medicine and
   an amount, signed off by a vet), a *duty* (who is on a routine task at a branch) and a
   *decision* (reference ``DC-1234`` for an action on a routine task at a branch).
2. **Near-identical facts** in clusters of three: the same procedure, medicine or task on three
   patients or branches, so only the patient or the branch tells them apart.
3. **Recurrence.** Each conversation mentions a home branch (its opener), the fact's branch for
   bookings, duties and decisions, and half the time another branch in small talk; one patient in
   small talk besides the fact's. Branches and patients are dealt so each occurs in about six
   conversations (never twice in one); the twelve staff recur everywhere, and so do the tasks
   and procedures, by their usual names, in small talk (the medicines more rarely).
4. **Uniqueness.** The key a question asks about (patient + procedure, patient + medicine, branch +
   task) is unique within its kind; booking and decision references are drawn without
   replacement; dose and duty answers carry their subject ("Biscuit Hartley (PT-0412) takes
   1.5 mg of meloxicam", "Freya is on the vaccine cold-chain check at Ormford").
5. **Questions**: the long form as above; the short form as an agent would type it: the chart
   number and the clinical term for bookings and doses ("PT-0412 dental booking"), but only the
   branch and the paraphrase for duties and decisions, which have no id to go on ("Ormford fridge
   temperature log owner"): the hard case.

Deterministic: one ``random.Random(seed)``, no iteration over sets. Supports up to about 6,000
conversations (the branch names run out beyond; ``generate`` raises).
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from benchmark.history import (
    CLUSTER,
    MONTH_QUESTION_SHARE,
    MONTHS,
    Fact,
    History,
    MonthSubjects,
    Question,
    _check,
    _deal,
    _ids,
    _start_times,
    add_month_subjects,
)

USER = "bench-user"
KINDS = ("booking", "dose", "duty", "decision")
SECOND_PLACE_SHARE = 0.5  # share of conversations that mention another branch in small talk
TASK_TALK_SHARE = 0.5  # share that mention a routine task (by its usual name) in small talk
CHART_IN_TALK_SHARE = 0.5  # share of small-talk patient mentions that carry the chart number

PEOPLE = (
    "Nadia", "Callum", "Ingrid", "Mateo", "Yuki", "Bram",
    "Freya", "Idris", "Rosa", "Tobias", "Zara", "Hugo",
)  # fmt: skip
SESSIONS = ("morning", "afternoon", "evening")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")

PET_NAMES = (
    "Biscuit", "Pickle", "Waffle", "Noodle", "Pumpkin", "Mochi", "Juniper", "Clementine",
    "Marmalade", "Paprika", "Nutmeg", "Truffle", "Pretzel", "Dumpling", "Muffin", "Crumpet",
    "Toffee", "Custard", "Gizmo", "Pixel", "Widget", "Sprocket", "Nimbus", "Comet", "Pebble",
    "Otis", "Luna", "Milo", "Bella", "Archie", "Poppy", "Teddy", "Rolo", "Bonnie", "Winnie",
    "Ziggy", "Olive", "Basil", "Mabel", "Percy", "Dotty", "Hector", "Ruby", "Oscar", "Tilly",
    "Bertie", "Fudge", "Skittles", "Domino", "Socks", "Mittens", "Patch", "Shadow", "Smudge",
    "Tiger", "Rocco", "Kiwi", "Peanut", "Pippin", "Frodo",
)  # fmt: skip
SURNAMES = (
    "Hartley", "Okafor", "Lindqvist", "Moreau", "Castellano", "Brennan", "Achterberg",
    "Dunmore", "Galloway", "Haddon", "Iversen", "Jablonski", "Kowalczyk", "Lachance",
    "Marchetti", "Nakamura", "Oyelaran", "Pemberton", "Quigley", "Rasmussen", "Sandoval",
    "Thackeray", "Underwood", "Vasquez", "Whitlock", "Yardley", "Zielinski", "Abernathy",
    "Blackwood", "Crowther", "Delacroix", "Ellingham", "Fitzgerald", "Gallagher", "Holloway",
    "Ingram", "Jessop", "Kettering", "Lockhart", "Mulligan", "Northcott", "Osborne",
    "Prendergast", "Radcliffe", "Sheridan", "Tremaine", "Vickers", "Wainwright", "Ashdown",
    "Barrowman", "Chadwick", "Devereux", "Eastwood", "Ferrante", "Gutierrez", "Hawthorne",
    "Ibarra", "Jennings", "Kilbride", "Lowther",
)  # fmt: skip
# Branch names are prefix + suffix; names that begin another name are dropped (see _places), so
# "at Ormford" never occurs inside another branch's text.
PLACE_PREFIXES = (
    "Ald", "Bex", "Carr", "Dray", "Eb", "Fal", "Gant", "Hel", "Ick", "Jar", "Kir", "Lud", "Mab",
    "Nett", "Orm", "Pell", "Quen", "Rud", "Sib", "Tal", "Ven", "Wark", "Yarn", "Bron", "Cress",
    "Dal", "Elk", "Fin", "Gil", "Hob", "Kel", "Lin", "Mor", "Nev", "Os", "Pol", "Rath", "Sel",
    "Tor", "Wen", "Ash", "Brig", "Cor", "Dun", "Emb", "Frith", "Gor", "Hal", "Mar", "Pen",
    "Stan", "Thurl", "Wal", "Wynd", "Yel", "Bar", "Chel", "Dor", "Fen", "Lang",
)  # fmt: skip
PLACE_SUFFIXES = (
    "borough", "by", "caster", "chester", "don", "field", "ford", "gate", "ham", "hope",
    "ington", "less", "ling", "low", "mere", "mouth", "ney", "over", "rith", "sett", "stone",
    "thwaite", "ton", "wardine", "wick", "worth", "leigh", "combe", "hithe", "keld",
    "bury", "dale", "holme", "kirk", "marsh", "pool", "ridge", "stow", "well", "yard",
)  # fmt: skip


@dataclass(frozen=True)
class Term:
    """One thing under three names. The question's words share no word with the fact's."""

    fact: str  # as the fact (and small talk) says it: "vaccine cold-chain check"
    asked: str  # as a person paraphrases it: "the fortnightly fridge temperature log"
    short: str  # as an agent types it: the clinical term for ids kinds, else the paraphrase


def _terms(table: str) -> tuple[Term, ...]:
    return tuple(
        Term(*(part.strip() for part in row.split("|"))) for row in table.strip().splitlines()
    )


# Routine tasks at a branch (duties and decisions): the short form is a paraphrase too, as an
# agent passing on the user's words would type it.
TASKS = _terms("""
vaccine cold-chain check | the fortnightly fridge temperature log | fridge temperature log
controlled drugs register audit | the count of the locked-cabinet medicines | locked-cabinet count
autoclave spore test | the steriliser validation | steriliser validation
dosimeter badge swap | the changeover of the radiation monitors | radiation monitor changeover
kennel deep clean | the top-to-bottom scrub of the dog wards | dog ward scrub
oxygen cylinder restock | the refill of the theatre O2 bottles | theatre O2 bottle refill
anaesthetic machine leak test | the pressure check on the sleep-gas unit | sleep-gas unit check
sharps bin collection | the pickup of the needle containers | needle container pickup
pharmacy expiry check | the dispensary clear-out of old stock | dispensary clear-out
booster reminder mailing | the yearly jab letters to owners | yearly jab letters
fire alarm test | the evacuation bell drill | evacuation bell drill
lab courier run | the specimen dispatch to the external laboratory | specimen dispatch
out-of-hours phone cover | the night-time call handling | night call handling
isolation ward disinfection | the sanitising of the infectious-cases room | infectious room scrub
reception rota | the front-counter timetable | front counter timetable
quarterly stocktake | the three-monthly inventory count | inventory count
""")  # fmt: skip
# Procedures (bookings): "{patient}'s {asked}" reads as a question.
PROCEDURES = _terms("""
dental scale and polish | teeth cleaning under sedation | dental
spay | neutering operation | spay
lump removal | growth excision | lump removal
cruciate ligament repair | knee surgery | cruciate
abdominal ultrasound | belly scan | ultrasound
senior blood panel | older-animal screening tests | blood panel
hip x-rays | pelvic radiographs | hip x-ray
ophthalmic exam | eye check-up | eye exam
aural flush | ear cleaning | ear flush
microchip implant | ID chip insertion | microchip
""")  # fmt: skip
# Medicines (doses), with the unit their amount is in.
MEDICINES = _terms("""
meloxicam | the anti-inflammatory pain relief | meloxicam
amoxicillin | the penicillin-type antibiotic | amoxicillin
gabapentin | the nerve pain capsules | gabapentin
prednisolone | the steroid tablets | prednisolone
furosemide | the water tablets | furosemide
insulin | the diabetes injections | insulin
levothyroxine | the thyroid supplement | levothyroxine
omeprazole | the stomach acid blocker | omeprazole
maropitant | the anti-sickness medicine | maropitant
phenobarbital | the seizure control pills | phenobarbital
""")  # fmt: skip
UNITS = {"insulin": "units"}  # everything else is dosed in mg
ACTIONS = (  # (as decided, as asked)
    ("postpone", "push back"), ("approve", "go ahead with"), ("bring forward", "move up"),
    ("cancel", "drop"), ("outsource", "subcontract"), ("pause", "put on hold"),
)  # fmt: skip

# --- text templates ----------------------------------------------------------------------------
# {place} a branch, {patient} "Biscuit Hartley" or "Biscuit Hartley (PT-0412)", {pet} the name
# alone (for possessives), {person}/{person2} staff, {task}/{procedure}/{medicine} usual names.

OPENERS = (
    "Morning. Catching up on {place} before the doors open.",
    "Back from a long day at {place}, a few things to go through.",
    "Quick update from the {place} branch.",
    "Hi, doing the {day} roundup for {place} now.",
    "Handover for {place}, {session} session.",
    "Hey, {person} asked me to go through the {place} list with you.",
    "Start of the week at {place}, let's sort a few things.",
    "On the rota at {place} today, busy one.",
    "Evening. Closing up at {place}.",
)
USER_PATIENT = (
    "{pet}'s owner rang about the bill, {person} dealt with it.",
    "{person} saw {patient} for a quick weigh-in, all fine.",
    "{patient} is back on {day} for a recheck with {person}.",
    "{person} mentioned {patient} might need the {procedure} later this year.",
    "Can you remind me to ask {person} about {pet}'s insurance form?",
    "{patient} was a handful in the waiting room again.",
    "Photos of {patient} are in the shared folder, {person} took them.",
    "{person} says {patient} is doing well on the {medicine}.",
    "{person} and {person2} had a look at {patient} together, no action for now.",
)
ASSISTANT_PATIENT = (
    "Noted. I'll keep {patient} on the watch list.",
    "Got it, {patient} stays on {person}'s list for the next visit.",
    "Understood. If {patient} needs the {procedure} it's worth planning early.",
    "Okay, I'll add a reminder about {patient} for {day}.",
    "Makes sense. {person} knows {patient} best.",
    "Right. {patient} was last weighed a while ago, worth keeping in mind.",
)
USER_PLACE = (
    "The weather looks fine for the {place} run.",
    "{person} is covering {place} until {day}.",
    "The road out to {place} is flooded again.",
    "{place} borrowed our spare clippers again.",
    "{person} says the {task} at {place} went smoothly.",
    "Is the {task} at {place} still planned for next month?",
    "{place} is short a nurse on {day}.",
    "{person} wants to compare notes with {place} next week.",
    "The phones at {place} were down yesterday, nothing on our side.",
)
ASSISTANT_PLACE = (
    "Noted about {place}.",
    "Okay, I'll flag {place} for {day}.",
    "Got it. {person} can check in with {place} if it keeps happening.",
    "Understood, the {task} at {place} can wait for {person}.",
    "Right, I'll keep the {place} run in mind.",
)
USER_TASK = (
    "The forms for the {task} are in the back office.",
    "{person} asked who's doing the {task} this month.",
    "Reminder that the {task} sheet needs a signature.",
    "{person} found the {task} checklist behind the printer.",
)
ASSISTANT_TASK = (
    "Noted, the {task} paperwork stays with {person}.",
    "Okay. The {task} comes round again soon.",
)
ASK_BEFORE_LOOKUP = (
    "Can you look up {subject} for me?",
    "What did we settle about {subject}?",
    "Could you pull up {subject}, please?",
)
USER_FILLERS = ("Thanks.", "Okay, that's all for now.", "Great, cheers.", "Anything else?")
ASSISTANT_FILLERS = ("You're welcome.", "Anytime.", "Sure, that's everything from my side.")
# Month-named subjects (history.add_month_subjects): written with the rule's "before", blind to it.
CLINIC_MONTH_SUBJECTS = MonthSubjects(
    fact="The {month} stock order for {place} arrived {count} boxes short, {person} called the "
    "wholesaler.",
    answer="arrived {count} boxes short",
    questions=(
        "How many boxes were missing from the {month} wholesaler order at {place}?",
        "What went wrong with the {month} supplies for {place}?",
        "Back in {when} we talked about the {month} stock order for {place}; how short was it?",
    ),
    short="{place} {month} stock order shortfall",
    fillers=frozenset(USER_FILLERS + ASSISTANT_FILLERS),
    people=PEOPLE,
)
LEADS = {
    "user": ("", "Oh, and ", "Before I forget, "),
    "assistant": ("", "From the clinic file: ", "Found it: ", "Here it is: "),
}
FACTS = {
    "booking": (
        "booking {answer} is in for the {procedure} on {patient} at {place}.",
        "{patient} is down for the {procedure} at {place}, booking {answer}.",
        "booking {answer}: {procedure} for {patient} at {place}, {person} will do it.",
    ),
    "dose": (  # must contain "{answer}": "<patient> takes <amount> of <medicine>"
        "{answer} twice daily, {vet} signed it off.",
        "{answer} once a day with food, per {vet}.",
        "{vet} says {answer} until the recheck.",
    ),
    "duty": (  # must contain "{answer}": "<person> is on the <task> at <place>"
        "{answer}.",
        "{answer} from now on, {person} will cover holidays.",
        "we agreed that {answer}.",
    ),
    "decision": (
        "decision {answer}: {action} the {task} at {place}.",
        "decision {answer}: {action} the {task} at {place}, {person} will tell the team.",
        "decision {answer} went in: {action} the {task} at {place}.",
    ),
}
QUESTION_CONTEXT = (
    "",
    "Back in {month} we talked about this. ",
    "Thinking of an earlier chat from {month}. ",
    "{person} brought this up in {month}. ",
    "Something from a chat at {home}. ",
)
QUESTIONS = {  # no word in common with the fact but names (checked by _check)
    "booking": (
        "What's the confirmation number for {pet}'s {asked} at {place}?",
        "Which appointment reference did {pet}'s {asked} at {place} get?",
        "At {place}, what reference number was given to {pet}'s {asked}?",
    ),
    "dose": (
        "How much of {asked} did {vet} put {pet} on?",
        "What amount of {asked} is {pet} getting from {vet}?",
        "Which strength of {asked} did {vet} prescribe for {pet}?",
    ),
    "duty": (
        "Who is looking after {asked} at {place}?",
        "Which team member takes care of {asked} at {place}?",
        "Who did we put in charge of {asked} at {place}?",
    ),
    "decision": (
        "Under which reference did we agree to {action} {asked} at {place}?",
        "What's the reference for the call to {action} {asked} at {place}?",
        "Which entry number goes with the choice to {action} {asked} at {place}?",
    ),
}
SHORT_QUERIES = {  # agent style; duties and decisions have no id, only the branch
    "booking": "{chart} {short} booking",
    "dose": "{chart} {short} dose",
    "duty": "{place} {short} owner",
    "decision": "{place} {short} decision",
}
SHORT_KIND_WORDS = ("owner", "decision")  # the kind words the short forms add

# Words that carry no content, for the paraphrase rule (a question and its fact may share these).
STOPWORDS = frozenset((
    "a", "after", "an", "and", "are", "at", "did", "do", "for", "from", "get", "give", "given",
    "go", "goes", "how", "in", "is", "it", "its", "of", "on", "or", "our", "s", "that", "the",
    "their", "them", "there", "this", "to", "under", "up", "was", "we", "were", "what", "when",
    "which", "who", "whom", "will", "with", "you",
))  # fmt: skip


# --- the paraphrase rule -----------------------------------------------------------------------


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def content_words(text: str, names: frozenset[str] = frozenset()) -> list[str]:
    """Lower-cased word stems of ``text``, without stopwords and ``names`` (lower-case)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return [_stem(w) for w in words if len(w) > 1 and w not in STOPWORDS and w not in names]


def shared_words(question: str, fact: str, names: frozenset[str]) -> list[str]:
    """Content words of ``question`` that the fact has too (same stem or first five letters)."""
    fact_keys = {key for word in content_words(fact, names) for key in (word, word[:5])}
    return [w for w in content_words(question, names) if w in fact_keys or w[:5] in fact_keys]


# --- planning ----------------------------------------------------------------------------------


@dataclass
class _Plan:
    kind: str
    home: int = -1  # branch of the opener
    fact_place: int = -1  # branch of the fact (bookings, duties, decisions)
    talk_place: int = -1  # another branch in small talk, or none
    fact_patient: int = -1  # patient of the fact (bookings, doses)
    talk_patient: int = -1  # patient in small talk
    detail: int = -1  # index into PROCEDURES, MEDICINES or TASKS
    talks_task: bool = False  # whether small talk mentions a routine task


def _details(kind: str) -> tuple[Term, ...]:
    return {"booking": PROCEDURES, "dose": MEDICINES}.get(kind, TASKS)


def _key_subject(plan: _Plan) -> int:
    return plan.fact_patient if plan.kind in ("booking", "dose") else plan.fact_place


def _plan(rng: random.Random, n: int) -> list[_Plan]:
    kinds: list[str] = []
    while len(kinds) < n:
        block = list(KINDS)
        rng.shuffle(block)  # one of each kind per four conversations keeps any stretch balanced
        kinds.extend(block)
    plans = [_Plan(kind=kind) for kind in kinds[:n]]
    # Branch slots: home always, the fact's for three kinds, another in small talk half the time.
    owners: list[int] = []
    slots: list[tuple[int, str]] = []
    for i, plan in enumerate(plans):
        wanted = ["home"]
        if plan.kind != "dose":
            wanted.append("fact_place")
        if rng.random() < SECOND_PLACE_SHARE:
            wanted.append("talk_place")
        plan.talks_task = rng.random() < TASK_TALK_SHARE
        for name in wanted:
            owners.append(i)
            slots.append((i, name))
    for (i, name), entity in zip(slots, _deal(rng, owners, minimum=3), strict=True):
        setattr(plans[i], name, entity)
    # Patient slots: the fact's for bookings and doses, one in small talk always.
    owners, slots = [], []
    for i, plan in enumerate(plans):
        wanted = ["fact_patient", "talk_patient"] if plan.kind in ("booking", "dose") else []
        for name in wanted or ["talk_patient"]:
            owners.append(i)
            slots.append((i, name))
    for (i, name), entity in zip(slots, _deal(rng, owners, minimum=2), strict=True):
        setattr(plans[i], name, entity)
    return plans


def _cluster_details(rng: random.Random, plans: list[_Plan]) -> None:
    """Clusters of three facts of one kind share a detail when their keys allow it."""
    taken: dict[str, set[tuple[int, int]]] = {kind: set() for kind in KINDS}  # looked up only
    for kind in KINDS:
        members = [i for i, plan in enumerate(plans) if plan.kind == kind]
        rng.shuffle(members)  # spread each cluster over the whole history
        for start in range(0, len(members), CLUSTER):
            group = members[start : start + CLUSTER]
            options = list(range(len(_details(kind))))
            rng.shuffle(options)

            def free(detail: int, group_: list[int], kind_: str = kind) -> bool:
                keys = [(_key_subject(plans[i]), detail) for i in group_]
                return len(set(keys)) == len(keys) and not any(k in taken[kind_] for k in keys)

            shared = next((d for d in options if free(d, group)), None)
            for i in group:
                detail = shared if shared is not None else next(d for d in options if free(d, [i]))
                plans[i].detail = detail
                taken[kind].add((_key_subject(plans[i]), detail))


def _places(rng: random.Random, count: int) -> list[str]:
    names = sorted({p + s for p in PLACE_PREFIXES for s in PLACE_SUFFIXES})
    staff = [p.lower() for p in PEOPLE]
    names = [
        name
        for index, name in enumerate(names)
        # sorted, so a name that begins another is followed by it; keep neither ambiguous
        if not (index + 1 < len(names) and names[index + 1].startswith(name))
        and not any(person in name.lower() for person in staff)
    ]
    if count > len(names):
        raise ValueError(f"too many conversations: {count} branches needed, {len(names)} named")
    rng.shuffle(names)
    return names[:count]


def _patients(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """``count`` (name, chart) pairs: "Biscuit Hartley", "PT-0412"; both unique."""
    names = [f"{pet} {surname}" for pet, surname in itertools.product(PET_NAMES, SURNAMES)]
    if count > len(names):
        raise ValueError(f"too many conversations: {count} patients needed, {len(names)} named")
    rng.shuffle(names)
    charts = _ids(rng, "PT", 4, count)
    return list(zip(names[:count], charts, strict=True))


# --- writing -----------------------------------------------------------------------------------


def _fill(rng: random.Random, template: str, **values: str) -> str:
    """Fill a template; unnamed staff, sessions, days and usual names are drawn fresh."""
    if "{person" in template:
        values.setdefault("person", rng.choice(PEOPLE))
        if "{person2}" in template:
            values["person2"] = rng.choice([p for p in PEOPLE if p != values["person"]])
    fresh = {
        "session": lambda: rng.choice(SESSIONS),
        "day": lambda: rng.choice(DAYS),
        "task": lambda: rng.choice(TASKS).fact,
        "procedure": lambda: rng.choice(PROCEDURES).fact,
        "medicine": lambda: rng.choice(MEDICINES).fact,
    }
    for name, draw in fresh.items():
        if "{" + name + "}" in template:
            values.setdefault(name, draw())
    text = template.format(**values)
    return text[0].upper() + text[1:]


def _patient_values(rng: random.Random, patient: tuple[str, str]) -> dict[str, str]:
    name, chart = patient
    shown = f"{name} ({chart})" if rng.random() < CHART_IN_TALK_SHARE else name
    return {"patient": shown, "pet": name}


def _fact_item(
    rng: random.Random,
    plan: _Plan,
    places: list[str],
    patients: list[tuple[str, str]],
    references: dict[str, list[str]],
) -> dict[str, Any]:
    """What the fact says, its answer, and the names that identify it."""
    term = _details(plan.kind)[plan.detail]
    item: dict[str, Any] = {"kind": plan.kind, "term": term}
    if plan.kind in ("booking", "dose"):
        name, chart = patients[plan.fact_patient]
        item |= {"pet": name, "chart": chart, "patient": f"{name} ({chart})"}
        item["subject"] = item["patient"]
    if plan.kind != "dose":
        item["place"] = places[plan.fact_place]
        item.setdefault("subject", item["place"])
    if plan.kind == "booking":
        item["answer"] = references["booking"].pop()
    elif plan.kind == "dose":
        unit = UNITS.get(term.fact, "mg")
        amount = rng.choice((0.25, 0.5, 1, 1.5, 2, 2.5, 3, 4, 5, 7.5, 10, 12.5, 15, 20, 25))
        amount_text = f"{amount:g}"
        item["vet"] = rng.choice(PEOPLE)
        item["answer"] = f"{item['patient']} takes {amount_text} {unit} of {term.fact}"
    elif plan.kind == "duty":
        item["owner"] = rng.choice(PEOPLE)
        item["answer"] = f"{item['owner']} is on the {term.fact} at {item['place']}"
    else:
        item["action"] = rng.choice(ACTIONS)
        item["answer"] = references["decision"].pop()
    return item


def _fact_sentence(rng: random.Random, item: dict[str, Any], role: str) -> str:
    named = [item.get("owner"), item.get("vet")]
    values = {
        "answer": item["answer"],
        "patient": item.get("patient", ""),
        "place": item.get("place", ""),
        "vet": item.get("vet", ""),
        "procedure": item["term"].fact,
        "task": item["term"].fact,
        "action": item.get("action", ("", ""))[0],
        "person": rng.choice([p for p in PEOPLE if p not in named]),  # never a second owner
    }
    text = rng.choice(LEADS[role]) + rng.choice(FACTS[item["kind"]]).format(**values)
    return text[0].upper() + text[1:]


def _write_conversation(
    rng: random.Random,
    cid: str,
    plan: _Plan,
    item: dict[str, Any],
    places: list[str],
    patients: list[tuple[str, str]],
    start: datetime,
) -> tuple[dict[str, Any], Fact]:
    roles = ["user", "assistant"] * 3
    parts: list[list[str]] = [[] for _ in roles]
    parts[0].append(_fill(rng, rng.choice(OPENERS), place=places[plan.home]))

    # Never the opening or closing turn: the answer stays in a message's first 160 characters.
    fact_turn = rng.randrange(1, 5)
    sentence = _fact_sentence(rng, item, roles[fact_turn])
    parts[fact_turn].append(sentence)

    pieces: list[tuple[str, dict[str, str]]] = [
        ("patient", _patient_values(rng, patients[plan.talk_patient]))
    ]
    if plan.talk_place >= 0:
        pieces.append(("place", {"place": places[plan.talk_place]}))
    if plan.talks_task:
        pieces.append(("task", {}))
    free_turns = [t for t in range(len(roles)) if t != fact_turn]
    rng.shuffle(free_turns)
    templates = {
        ("user", "patient"): USER_PATIENT,
        ("assistant", "patient"): ASSISTANT_PATIENT,
        ("user", "place"): USER_PLACE,
        ("assistant", "place"): ASSISTANT_PLACE,
        ("user", "task"): USER_TASK,
        ("assistant", "task"): ASSISTANT_TASK,
    }
    for (what, values), turn in zip(pieces, free_turns[: len(pieces)], strict=True):
        parts[turn].append(_fill(rng, rng.choice(templates[roles[turn], what]), **values))
    if roles[fact_turn] == "assistant":  # a reported fact answers a lookup request
        ask = rng.choice(ASK_BEFORE_LOOKUP).format(subject=item["subject"])
        parts[fact_turn - 1].append(ask)  # last in its turn, right before the answer
    for turn, role in enumerate(roles):
        if not parts[turn]:
            parts[turn].append(rng.choice(USER_FILLERS if role == "user" else ASSISTANT_FILLERS))

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
    fact = Fact(cid, item["kind"], item["answer"], sentence, item["subject"], item["term"].fact)
    return body, fact


# --- questions ---------------------------------------------------------------------------------


def _pick_questions(plans: list[_Plan], count: int) -> list[int]:
    """Conversations spread evenly over the history, the kinds in turn, so balanced by kind.

    (history.py takes one per window and may skip a kind when windows are short: 60 questions
    over 300 conversations are windows of five.)"""
    n, picked = len(plans), []
    taken = [False] * n
    for j in range(count):
        centre = (2 * j + 1) * n // (2 * count)
        wanted = KINDS[j % len(KINDS)]
        free = [i for i in range(n) if not taken[i]]
        of_kind = [i for i in free if plans[i].kind == wanted]
        best = min(of_kind or free, key=lambda i: (abs(i - centre), i))
        taken[best] = True
        picked.append(best)
    return picked


def _question(
    rng: random.Random, fact: Fact, item: dict[str, Any], home: str, start: datetime
) -> Question:
    kind, term = item["kind"], item["term"]
    values = {
        "asked": term.asked,
        "pet": item.get("pet", ""),
        "place": item.get("place", ""),
        "vet": item.get("vet", ""),
        "action": item.get("action", ("", ""))[1],
    }
    others = [p for p in PEOPLE if p not in (item.get("owner"), item.get("vet"))]
    context = rng.choice(QUESTION_CONTEXT).format(
        month=MONTHS[start.month - 1], person=rng.choice(others), home=home
    )
    short = SHORT_QUERIES[kind].format(
        chart=item.get("chart", ""), place=item.get("place", ""), short=term.short
    )
    return Question(
        question=context + rng.choice(QUESTIONS[kind]).format(**values),
        short_query=short,
        answer=item["answer"],
        conversation_id=fact.conversation_id,
        kind=kind,
    )


def names_in(texts: list[str]) -> frozenset[str]:
    """Every name ``texts`` use (staff, patients, branches), lower-cased: the words a question
    may share with its fact."""
    branches = {p + s for p in PLACE_PREFIXES for s in PLACE_SUFFIXES}
    words = sorted({word for text in texts for word in re.findall(r"[A-Z][a-z]+", text)})
    pool = [*PEOPLE, *PET_NAMES, *SURNAMES, *(w for w in words if w in branches)]
    return frozenset(name.lower() for name in pool)


def _check_clinic(
    conversations: list[dict[str, Any]], facts: list[Fact], qs: list[Question]
) -> None:
    """history.py's checks, plus: keys unique per kind, and the paraphrase rule (raises)."""
    _check(conversations, facts, qs, r"\b(?:BK|DC)-\d+\b", ("booking", "decision"))
    keys = Counter((fact.kind, fact.equipment, fact.detail) for fact in facts)
    for key, count in keys.items():
        if count > 1:
            raise RuntimeError(f"{count} facts share the key {key}")
    by_id = {fact.conversation_id: fact for fact in facts}
    names = names_in([f.sentence for f in facts] + [q.question for q in qs])
    for q in qs:
        fact = by_id[q.conversation_id]
        shared = shared_words(q.question, fact.sentence, names)
        if shared:
            raise RuntimeError(f"question for {q.conversation_id} repeats the fact's {shared}")
        if q.kind in ("duty", "decision"):  # no id: the short form paraphrases too
            rest = shared_words(q.short_query, fact.sentence, names)
            if any(w not in SHORT_KIND_WORDS for w in rest):
                raise RuntimeError(f"short query for {q.conversation_id} repeats the fact's {rest}")


def generate(n: int, seed: int = 7, questions: int = 60) -> History:
    """Build a history of ``n`` conversations and ``min(questions, n)`` questions about it."""
    if n < 1:
        raise ValueError("n must be at least 1")
    rng = random.Random(seed)
    plans = _plan(rng, n)
    _cluster_details(rng, plans)
    places = _places(rng, max(max(p.home, p.fact_place, p.talk_place) for p in plans) + 1)
    patients = _patients(rng, max(max(p.fact_patient, p.talk_patient) for p in plans) + 1)
    references = {
        "booking": _ids(rng, "BK", 5, sum(p.kind == "booking" for p in plans)),
        "decision": _ids(rng, "DC", 4, sum(p.kind == "decision" for p in plans)),
    }
    items = [_fact_item(rng, plan, places, patients, references) for plan in plans]
    starts = _start_times(rng, n)
    width = max(5, len(str(n)))
    conversations: list[dict[str, Any]] = []
    facts: list[Fact] = []
    for index, plan in enumerate(plans):
        body, fact = _write_conversation(
            rng, f"c{index + 1:0{width}d}", plan, items[index], places, patients, starts[index]
        )
        conversations.append(body)
        facts.append(fact)
    picked = _pick_questions(plans, min(questions, n))
    qs = [_question(rng, facts[i], items[i], places[plans[i].home], starts[i]) for i in picked]
    _check_clinic(conversations, facts, qs)
    month_qs = add_month_subjects(
        conversations,
        [places[plan.home] for plan in plans],
        {q.conversation_id for q in qs},
        CLINIC_MONTH_SUBJECTS,
        seed=seed,
        count=len(qs) // MONTH_QUESTION_SHARE,
    )
    _check(conversations, facts, qs + month_qs, r"\b(?:BK|DC)-\d+\b", ("booking", "decision"))
    return History(conversations=conversations, questions=qs, facts=facts, month_questions=month_qs)
