"""The other-language histories (issues 24 and 34): deterministic, unambiguous, written in each
language's own form, with questions that name their fact by other words; Chinese twice, in two
domains and two phrasings; Japanese."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from pathlib import Path

import pytest

from benchmark import languages
from benchmark.history import History, Question
from benchmark.languages import stages
from benchmark.report import hits_table
from benchmark.run import HISTORIES, ask, env_setting, load_by_posting, server
from recall.domain.conversation import parse_conversation

CODES = ("de", "es", "zh", "zh_school", "ja")
CHINESE = ("zh", "zh_school")
JAPANESE_CONTENT = "\u30a0-\u30ff\u4e00-\u9fff"  # katakana and kanji: the content words
HAN = "\u4e00-\u9fff"
# Function words, listed here independently of the generators' own lists.
FUNCTION_WORDS = frozenset(
    [
        "dass",
        "eine",
        "einen",
        "einem",
        "einer",
        "noch",
        "schon",
        "welche",
        "welcher",
        "welchen",
        "welchem",
        "haben",
        "hatten",
        "wird",
        "wurde",
        "über",
        "unter",
        "nach",
        "nicht",
        "dann",
        "para",
        "como",
        "cuál",
        "cuándo",
        "cuánto",
        "quién",
        "desde",
        "hasta",
        "sobre",
        "esto",
        "está",
        "este",
        "esta",
        "contra",
    ]
)


@pytest.fixture(scope="module", params=CODES)
def history(request: pytest.FixtureRequest) -> tuple[str, History]:
    return request.param, languages.generate(request.param, 80)


def _texts(h: History) -> dict[str, str]:
    return {b["conversation_id"]: "\n".join(t["text"] for t in b["turns"]) for b in h.conversations}


def _names(code: str, h: History) -> list[str]:
    """The buildings (as the facts name them) and the staff: what a question may share."""
    lang = languages.LANGUAGES[code]()
    return [*(f.equipment for f in h.facts), *lang.people]


def _units(code: str, text: str, names: list[str]) -> set[str]:
    """Words of four letters or more by their first five (German, Spanish), Han bigrams
    (Chinese), or bigrams of kanji and katakana (Japanese)."""
    for name in sorted(names, key=len, reverse=True):
        text = text.replace(name, " ")
    if code == "ja":  # a run of one kanji is a word too
        runs = re.findall(f"[{JAPANESE_CONTENT}]+", text)
        return {run[i : i + 2] for run in runs for i in range(max(len(run) - 1, 1))}
    if code in CHINESE:
        runs = re.findall(f"[{HAN}]+", text)
        grams = {run[i : i + 2] for run in runs for i in range(len(run) - 1)}
        return {gram for gram in grams if "的" not in gram}  # the particle joins words
    words = re.findall(r"[^\W\d_]{4,}", text.lower())
    return {w[:5] for w in words if w not in FUNCTION_WORDS}


@pytest.mark.parametrize("code", CODES)
def test_same_seed_gives_byte_identical_history(code: str) -> None:
    first, second = languages.generate(code, 80, seed=3), languages.generate(code, 80, seed=3)

    assert json.dumps(first.conversations) == json.dumps(second.conversations)
    assert first.questions == second.questions
    assert json.dumps(languages.generate(code, 80, seed=4).conversations) != json.dumps(
        first.conversations
    )


def test_every_body_is_accepted_by_the_turns_route(history: tuple[str, History]) -> None:
    _, h = history
    for body in h.conversations:
        conversation = parse_conversation(body)

        assert [line["role"] for line in conversation.lines] == ["user", "assistant"] * 3


def test_sixty_questions_balanced_by_kind_on_distinct_conversations(
    history: tuple[str, History],
) -> None:
    _, h = history

    assert len(h.conversations) == 80 and len(h.questions) == 60
    assert len({q.conversation_id for q in h.questions}) == 60
    assert {kind: sum(q.kind == kind for q in h.questions) for kind in languages.KINDS} == {
        kind: 15 for kind in languages.KINDS
    }


def test_every_answer_occurs_in_exactly_one_conversation(history: tuple[str, History]) -> None:
    _, h = history
    texts = _texts(h)

    for item in [*h.questions, *h.facts]:
        assert [cid for cid, text in texts.items() if item.answer in text] == [
            item.conversation_id
        ], item.answer
    assert len({f.answer for f in h.facts}) == len(h.facts)


def test_questions_never_contain_their_answer_or_an_id(history: tuple[str, History]) -> None:
    _, h = history
    for q in h.questions:
        assert q.answer not in q.question and q.answer not in q.short_query
        assert not re.search(r"[A-Z]+-\d", q.question + q.short_query)  # nothing to match by id


def test_near_identical_facts_differ_only_in_the_building(history: tuple[str, History]) -> None:
    _, h = history
    for kind in languages.KINDS:
        by_detail: dict[str, set[str]] = {}
        for fact in h.facts:
            if fact.kind == kind:
                by_detail.setdefault(fact.detail, set()).add(fact.equipment)

        assert max(len(buildings) for buildings in by_detail.values()) >= 3, kind


def test_long_questions_share_no_content_with_their_fact_but_names(
    history: tuple[str, History],
) -> None:
    code, h = history
    facts = {f.conversation_id: f for f in h.facts}
    names = _names(code, h)
    for q in h.questions:
        fact = facts[q.conversation_id].sentence
        shared = _units(code, q.question, names) & _units(code, fact, names)

        assert not shared, (q.question, fact, shared)


@pytest.mark.parametrize("code", [*CHINESE, "ja"])
def test_chinese_and_japanese_are_written_without_spaces_between_characters(code: str) -> None:
    h = languages.generate(code, 80)
    texts = [*_texts(h).values(), *(q.question for q in h.questions)]

    script = f"{HAN}\u3040-\u30ff"  # Han characters, and kana for Japanese
    written = f"[{script}，。？！：；、]"  # with the full-width punctuation
    assert all(not re.search(f"{written} +{written}", text) for text in texts)
    assert all(re.search(f"[{script}]", text) for text in texts)
    assert any("，" in text or "、" in text for text in texts)
    assert any("。" in text for text in texts)
    assert not any(re.search(r"[,.?] ?$", text) for text in texts)  # no ASCII punctuation at ends


def test_german_articles_follow_the_street_and_spanish_ones_contract() -> None:
    german = "\n".join(_texts(languages.generate("de", 80)).values())
    spanish = "\n".join(_texts(languages.generate("es", 80)).values())

    assert re.search(r"\bim \w+weg\b", german) and re.search(r"\bin der \w+straße\b", german)
    assert not re.search(r"\b(?:im|vom) \w+(?:straße|allee|gasse)\b", german)
    assert not re.search(r"\b(?:in|von) der \w+(?:weg|ring|platz)\b", german)
    assert "del paseo" in spanish or "en el paseo" in spanish
    assert not re.search(r"\b(?:de|a) el\b", spanish)
    assert not re.search(r"\bla \w+ [^.,;]* programado\b", spanish)


def test_the_check_refuses_an_answer_found_in_a_second_conversation() -> None:
    h = languages.generate("de", 80)
    lang = languages.LANGUAGES["de"]()
    bodies = copy.deepcopy(h.conversations)
    asked = next(q for q in h.questions if q.kind == "owner")
    other = next(b for b in bodies if b["conversation_id"] != asked.conversation_id)
    other["turns"][5]["text"] += f" War das nicht auch {asked.answer}?"
    places = [{"name": f.equipment} for f in h.facts]

    with pytest.raises(RuntimeError, match="not unique"):
        languages._check_language(lang, bodies, h.facts, h.questions, places)


def test_the_school_history_is_phrased_apart_from_the_property_one() -> None:
    # Given both Chinese histories
    school, estates = languages.generate("zh_school", 80), languages.generate("zh", 80)
    school_text, estate_text = (
        "\n".join(_texts(school).values()),
        "\n".join(_texts(estates).values()),
    )
    # Then the school's ids are short ("K-039"), its short queries one run of characters, and no
    # run of eight Han characters of one history (a template's words) occurs in the other
    assert all(re.fullmatch(r"K-\d{3}", f.answer) for f in school.facts if f.kind == "ticket")
    assert all(" " not in q.short_query for q in school.questions)
    assert all(" " in q.short_query for q in estates.questions)
    runs = set(re.findall(f"[{HAN}]{{8}}", school_text))
    assert not [run for run in runs if run in estate_text]


def test_the_runner_knows_every_language() -> None:
    for code in CODES:
        make_history, questions = HISTORIES[code]

        assert questions == 60
        assert make_history(8, seed=7, questions=questions).questions


def test_env_settings_reach_the_benchmark_server(tmp_path: Path) -> None:
    key, value = env_setting("EMBED_MODEL=some-model")
    live = server(tmp_path, "embedded", 3, env={key: value})

    assert live.env["EMBED_MODEL"] == "some-model" and live.env["RECALL_K"] == "3"
    with pytest.raises(Exception, match="KEY=VALUE"):
        env_setting("EMBED_MODEL")


def test_the_languages_table_names_its_settings() -> None:
    row = {"history": "zh", "engine": "embedded", "size": 80, "questions": 60,
           "hit@3_long": 0.25, "hit@3_short": 0.5, "hit@8_long": 0.4, "hit@8_short": 0.75,
           "nothing@3_long": 7, "nothing@3_short": 0,
           "machine": "test box", "load_average_at_end": [1.0, 2.0, 3.0]}  # fmt: skip

    table = hits_table([row], {"EMBED_MODEL": "m"})

    assert table.startswith("Settings: EMBED_MODEL=m")
    assert "| zh | embedded | 80 | 60 | 25% / 50% | 40% / 75% | 7 / 0 |" in table
    assert hits_table([row], {}).startswith("Settings: defaults")


def test_the_benchmark_counts_the_questions_answered_nothing_found(tmp_path: Path) -> None:
    # Given a small history on a real server, and two questions: one about what it holds, and
    # one about something it never mentions (the floor answers "Nothing relevant found")
    history = languages.generate("de", 8, seed=7, questions=1)
    asked = history.questions[0]
    never = Question(
        "What did the vet say about the dog's diet?", "vet dog diet", "-", "-", "owner"
    )
    live = server(tmp_path, "embedded", 3)
    with live.start(timeout=120):
        load_by_posting(live, history)
        # When the benchmark asks both
        result = asyncio.run(ask(live, [asked, never], 3))
    # Then only the never-mentioned one counts as answered "nothing found", in both forms
    assert result["nothing@3_long"] == 1 and result["nothing@3_short"] == 1, result


@pytest.mark.parametrize(("floor", "blamed"), [("1", True), ("0", False)])
def test_the_stages_lay_a_miss_to_the_floor_only_when_it_emptied_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, floor: str, blamed: bool
) -> None:
    # Given a small German history on the default model, with a floor above every cosine or off
    monkeypatch.setenv("RECALL_MIN_SIMILARITY", floor)
    history = languages.generate("de", 8, seed=7, questions=1)
    fact = history.facts[0]
    # and a question about something it never mentions, whose "answer" is a real fact's
    never = Question("Was hat der Tierarzt zum Futter gesagt?", "Tierarzt Futter", fact.answer,
                     fact.conversation_id, fact.kind)  # fmt: skip
    history.questions = [never]
    # When the stages are measured, the same question also asked as a never-mentioned one
    rows = asyncio.run(stages.measure(history, tmp_path, stages.engines(), never=(never.question,)))
    asked, unasked = rows[:4], rows[4:]
    # Then each k and form is counted once, laid to the floor only when the floor was on (with it
    # off, eight passages of eight conversations may hold the answer by chance)
    assert len(asked) == 4
    assert all((row["verdict"] == "nothing found") == blamed for row in asked), rows
    # and the never-mentioned one is shown passages only when the floor was off
    assert [row["shown"] for row in unasked] == [not blamed] * 2, unasked


def test_every_language_has_never_mentioned_questions() -> None:
    for code in CODES:
        assert len(languages.LANGUAGES[code]().never_mentioned) >= 8, code
