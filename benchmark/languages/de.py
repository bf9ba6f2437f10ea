"""German: a Hausverwaltung's office and caretakers. Buildings are street addresses whose
gender sets the article ("in der Lindenstraße 12", "im Ahornweg 3", "am Goetheplatz 5"); terms
carry their case forms (nominative, accusative; the paraphrases too), since German inflects the
article and the adjective ("der jährliche Check", "den jährlichen Check"). The paraphrases split
or swap compounds ("Heizungswartung" / "die jährliche Durchsicht der Heizanlage")."""

# ruff: noqa: E501, SIM905  (text tables: one term or template a line, words split from a block)
from __future__ import annotations

import random

from benchmark.languages import Forms, Language, latin_words

PEOPLE = ("Jana", "Murat", "Sabine", "Lukas", "Heike", "Tobias",
          "Aylin", "Jens", "Katrin", "Dirk", "Ute", "Stefan")  # fmt: skip
STREETS = (
    "Linden", "Ahorn", "Birken", "Kastanien", "Eichen", "Buchen", "Erlen", "Ulmen", "Tannen",
    "Holunder", "Flieder", "Rosen", "Tulpen", "Nelken", "Lerchen", "Amsel", "Drossel", "Finken",
    "Meisen", "Schwalben", "Falken", "Mühlen", "Brunnen", "Schul", "Kirch", "Wiesen", "Garten",
    "Hafen", "Schiller", "Goethe", "Lessing", "Herder", "Uhland", "Mozart", "Kepler", "Humboldt",
    "Fontane", "Heine", "Brahms", "Schubert", "Händel", "Dürer", "Röntgen", "Bunsen", "Liebig",
    "Leibniz", "Kant", "Hebbel",
)  # fmt: skip
# suffix -> (in, von, dative, accusative): the street's gender decides article and contraction
SUFFIXES = {
    "straße": ("in der", "von der", "der", "die"), "allee": ("in der", "von der", "der", "die"),
    "gasse": ("in der", "von der", "der", "die"), "weg": ("im", "vom", "dem", "den"),
    "ring": ("im", "vom", "dem", "den"), "platz": ("am", "vom", "dem", "den"),
}  # fmt: skip
SURNAMES = (
    "Kessler", "Brandstetter", "Kowalski", "Yilmaz", "Hoffmann", "Lehmann", "Krüger", "Berger",
    "Vogt", "Haas", "Winkler", "Lorenz", "Baumann", "Franke", "Albrecht", "Pohl", "Engel",
    "Horn", "Busch", "Seidel", "Kuhn", "Sauer", "Arnold", "Thiel", "Brandt", "Ludwig", "Graf",
    "Schreiber", "Dietrich", "Kraus", "Voigt", "Böhm", "Ziegler", "Schumann", "Jung", "Wendt",
    "Hahn", "Roth", "Beck", "Lang",
)  # fmt: skip
FIRMS = ("{} Haustechnik", "{} & Söhne", "{} GmbH", "{} Gebäudeservice", "Hausmeisterdienst {}")
MONTHS = ("Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September",
          "Oktober", "November", "Dezember")  # fmt: skip
DAYS = ("Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag")
ARTICLES = {"f": ("die", "die"), "m": ("der", "den"), "n": ("das", "das")}  # nominative, accusative


def places(rng: random.Random, count: int) -> list[Forms]:
    streets = [(stem, suffix) for stem in STREETS for suffix in SUFFIXES]  # "Lindenweg" too
    if count > len(streets):
        raise ValueError(f"too many conversations: {count} buildings needed, {len(streets)} named")
    out = []
    for stem, suffix in rng.sample(streets, count):
        name = f"{stem}{suffix} {rng.randrange(1, 60)}"
        at, of, dat, akk = SUFFIXES[suffix]
        out.append({"name": name, "in": f"{at} {name}", "von": f"{of} {name}",
                    "dat": f"{dat} {name}", "akk": f"{akk} {name}"})  # fmt: skip
    return out


def contractors(rng: random.Random, count: int) -> list[str]:
    if count > len(SURNAMES):
        raise ValueError(f"too many conversations: {count} contractors needed")
    return [rng.choice(FIRMS).format(name) for name in rng.sample(SURNAMES, count)]


def _tasks(table: str) -> tuple[Forms, ...]:
    """usual term | gender | paraphrase nominative | paraphrase accusative | short paraphrase"""
    out = []
    for row in table.strip().splitlines():
        fact, gender, q_nom, q_akk, q_short = (part.strip() for part in row.split("|"))
        nom, akk = ARTICLES[gender]
        out.append({"fact": fact, "nom": f"{nom} {fact}", "akk": f"{akk} {fact}",
                    "q_nom": q_nom, "q_akk": q_akk, "q_short": q_short})  # fmt: skip
    return tuple(out)


TASKS = _tasks("""
Heizungswartung | f | die jährliche Durchsicht der Heizanlage | die jährliche Durchsicht der Heizanlage | Durchsicht Heizanlage
Dachrinnenreinigung | f | das Säubern der Regenrinnen | das Säubern der Regenrinnen | Regenrinnen säubern
Treppenhausreinigung | f | das wöchentliche Wischen der Stufen und Flure | das wöchentliche Wischen der Stufen und Flure | Stufen wischen
Winterdienst | m | das Schneeschippen und Streuen bei Glätte | das Schneeschippen und Streuen bei Glätte | Schneeschippen
Rauchmelderprüfung | f | der jährliche Check der Brandmelder | den jährlichen Check der Brandmelder | Brandmelder Check
Legionellenprüfung | f | die Beprobung des Trinkwassers auf Keime | die Beprobung des Trinkwassers auf Keime | Trinkwasser Beprobung
Aufzugswartung | f | der regelmäßige Service am Fahrstuhl | den regelmäßigen Service am Fahrstuhl | Fahrstuhl Service
Gartenpflege | f | das Mähen und Heckeschneiden im Hof | das Mähen und Heckeschneiden im Hof | Rasen mähen
Fassadenreinigung | f | das Abwaschen der Außenwände | das Abwaschen der Außenwände | Außenwände abwaschen
Spielplatzkontrolle | f | die Sicherheitsprüfung von Schaukeln und Klettergerüst | die Sicherheitsprüfung von Schaukeln und Klettergerüst | Schaukeln Sicherheit
Zählerablesung | f | das Ablesen der Strom- und Wasseruhren | das Ablesen der Strom- und Wasseruhren | Wasseruhren ablesen
Baumkontrolle | f | die Begutachtung der Bäume auf dem Grundstück | die Begutachtung der Bäume auf dem Grundstück | Bäume begutachten
Filterwechsel | m | das Erneuern der Lüftungsfilter | das Erneuern der Lüftungsfilter | Lüftungsfilter erneuern
Tiefgaragenreinigung | f | das Kehren der Parkgarage | das Kehren der Parkgarage | Parkgarage kehren
""")  # fmt: skip


def _defects(table: str) -> tuple[Forms, ...]:
    """usual words (accusative) | paraphrase (accusative) | short usual | short paraphrase"""
    rows = (tuple(part.strip() for part in row.split("|")) for row in table.strip().splitlines())
    return tuple({"fact": akk, "akk": akk, "q_akk": q_akk, "short": short}
                 for akk, q_akk, short in rows)  # fmt: skip


DEFECTS = _defects("""
den Wasserschaden im Keller | die feuchte Wand im Untergeschoss | Wasserschaden Keller
den ausgefallenen Aufzug | den Fahrstuhl, der zwischen zwei Etagen steckt | Aufzug ausgefallen
die defekte Klingelanlage | die stumme Türglocke | Klingelanlage defekt
die verstopfte Fallleitung | den Abfluss, durch den nichts mehr abläuft | Fallleitung verstopft
das undichte Dachfenster | die Luke oben, durch die es reinregnet | Dachfenster undicht
die flackernde Treppenhausbeleuchtung | das Flurlicht, das ständig an- und ausgeht | Treppenhausbeleuchtung flackert
die klemmende Haustür | den Eingang, der sich kaum noch öffnen lässt | Haustür klemmt
den Schimmel im Bad | die schwarzen Flecken an der Badezimmerdecke | Schimmel Bad
die kalten Heizkörper | die Radiatoren, die nicht mehr warm werden | Heizkörper kalt
die aufgebrochenen Briefkästen | die beschädigten Postfächer unten am Eingang | Briefkästen aufgebrochen
""")  # fmt: skip

STOPWORDS = frozenset("""
der die das den dem des ein eine einen einem einer eines und oder für mit von vom im in am an
auf bei zu zum zur ist sind war waren wird wurde werden hat haben hatten habe hast wir ihr ich
du er sie es man mir uns noch mal schon wer wie was wann welche welcher welchen welchem welches
über unter nach aus bis um als auch nicht nichts denn doch dann da hier dort sich sein seine
""".split())  # fmt: skip

LANGUAGE = Language(
    code="de",
    name="Deutsch",
    people=PEOPLE,
    days=DAYS,
    months=MONTHS,
    places=places,
    tasks=TASKS,
    defects=DEFECTS,
    contractors=contractors,
    ticket_prefix="RA",
    amount=lambda euros: f"{euros:,}".replace(",", ".") + " Euro",
    date=lambda month, day, hour, minute: f"{day}. {MONTHS[month - 1]} um {hour}:{minute:02d} Uhr",
    openers=(
        "Moin, ich bin gerade {home[in]} und gehe die Liste durch.",
        "Kurzes Update {home[von]}.",
        "Hallo, {person} hat mich gebeten, mit dir die offenen Punkte {home[von]} anzuschauen.",
        "Guten Morgen! Heute steht {home[name]} auf dem Plan.",
        "Bin zurück vom Rundgang {home[in]}, ein paar Sachen zum Festhalten.",
        "Gleich Feierabend, vorher noch schnell {home[name]}.",
        "Wochenstart, fangen wir mit {home[dat]} an.",
    ),
    talk={
        ("user", "place"): (
            "{person} ist bis {day} {place[in]} eingeteilt.",
            "Die Mieter {place[von]} haben sich wieder über den Lärm beschwert.",
            "{place[in]} war gestern kurz der Strom weg, bei uns ist alles normal.",
            "Der Hausmeister {place[von]} hat sich krankgemeldet, {person} springt ein.",
            "{person} will sich nächste Woche mit dem Beirat {place[von]} abstimmen.",
            "Hat {place[name]} eigentlich schon die neuen Mülltonnen bekommen?",
        ),
        ("assistant", "place"): (
            "Notiert, {place[name]} behalte ich im Blick.",
            "Alles klar, ich setze {place[name]} für {day} auf die Liste.",
            "Gut zu wissen. {person} kann {place[in]} vorbeischauen, falls es wieder vorkommt.",
            "Verstanden, ich sage {person} Bescheid, was {place[name]} angeht.",
        ),
        ("user", "task"): (
            "{task[nom]} {place[in]} ist übrigens gut gelaufen, meint {person}.",
            "Steht {task[nom]} eigentlich noch für nächsten Monat an?",
            "Die Unterlagen für {task[akk]} liegen im Büro.",
            "{person} fragt, wer diesen Monat {task[akk]} macht.",
        ),
        ("assistant", "task"): (
            "Notiert, die Papiere für {task[akk]} bleiben bei {person}.",
            "Okay, {task[nom]} steht bald wieder an.",
            "Gut, dann erinnere ich {person} an {task[akk]}.",
        ),
        ("user", "day"): (
            "Das Wetter soll bis {day} halten.",
            "{person} ist ab {day} im Urlaub.",
            "Der Drucker im Büro streikt schon wieder.",
            "Erst mal Kaffee, dann der Rest.",
            "{person} und {person2} sind heute zusammen unterwegs.",
        ),
        ("assistant", "day"): (
            "Alles klar, ich trage es für {day} ein.",
            "Gut, dann plane ich {person} für {day} ein.",
            "Verstanden, ich melde mich am {day} noch mal.",
        ),
    },
    ask_before_lookup=(
        "Kannst du mal nachsehen, was wir {place[in]} offen haben?",
        "Was gibt's Neues {place[von]}?",
        "Schau bitte mal in die Akte {place[von]}.",
    ),
    leads={
        "user": ("", "Übrigens: ", "Noch was: ", "Bevor ich's vergesse, "),
        "assistant": ("", "Laut Akte: ", "Hab's gefunden: ", "Ja, "),
    },
    facts={
        "ticket": (
            "Reparaturauftrag {answer} ist raus, es geht um {defect[akk]} {place[in]}.",
            "für {defect[akk]} {place[in]} habe ich den Auftrag {answer} angelegt.",
            "{person} hat {defect[akk]} {place[in]} gemeldet, Auftragsnummer {answer}.",
            "unter {answer} läuft jetzt der Auftrag für {defect[akk]} {place[in]}.",
        ),
        "owner": (
            "{task[akk]} {place[in]} übernimmt ab sofort {answer}.",
            "{answer} macht jetzt {task[akk]} {place[in]}, {person} hat den Vertrag unterschrieben.",
            "wir haben {task[akk]} {place[in]} an {answer} vergeben.",
            "für {task[akk]} {place[in]} ist künftig {answer} zuständig.",
        ),
        "amount": (
            "das Angebot für {task[akk]} {place[in]} liegt bei {answer}.",
            "{task[nom]} {place[in]} kostet laut Angebot {answer}.",
            "{person} hat das Angebot geschickt: {answer} für {task[akk]} {place[in]}.",
        ),
        "date": (
            "{task[nom]} {place[in]} ist für den {answer} angesetzt.",
            "Termin für {task[akk]} {place[in]}: {answer}.",
            "{person} hat {task[akk]} {place[in]} auf den {answer} gelegt.",
            "{task[nom]} {place[in]} findet am {answer} statt, die Mieter bekommen einen Aushang.",
        ),
    },
    question_context=(
        "",
        "Im {month} hatten wir das schon mal. ",
        "{person} hat das im {month} angesprochen. ",
        "Mir fällt gerade ein Gespräch über {home[akk]} ein. ",
        "Eine Frage zu etwas von früher: ",
    ),
    questions={
        "ticket": (
            "Unter welcher Vorgangsnummer bearbeiten wir {place[in]} die Meldung für {defect[q_akk]}?",
            "Welche Nummer hat die Meldung {place[in]} bekommen? Es ging um {defect[q_akk]}.",
            "Wie war noch mal die Kennung der Schadensmeldung {place[in]} für {defect[q_akk]}?",
        ),
        "owner": (
            "Wer kümmert sich inzwischen um {task[q_akk]} {place[in]}?",
            "Welchen Dienstleister haben wir {place[in]} für {task[q_akk]} beauftragt?",
            "Wen hatten wir {place[in]} für {task[q_akk]} engagiert?",
        ),
        "amount": (
            "Wie teuer wird {task[q_nom]} {place[in]}?",
            "Mit welcher Summe müssen wir für {task[q_akk]} {place[in]} rechnen?",
            "Was wollte der Betrieb für {task[q_akk]} {place[in]} haben?",
        ),
        "date": (
            "Wann kommen die Leute für {task[q_akk]} {place[in]}?",
            "An welchem Tag und zu welcher Uhrzeit ist {task[q_nom]} {place[in]} geplant?",
            "Wann geht {task[q_nom]} {place[in]} über die Bühne?",
        ),
    },
    short_queries={
        "ticket": "{place[name]} {defect[short]} Reparaturauftrag",
        "owner": "{place[name]} {task[q_short]} Dienstleister",
        "amount": "{place[name]} {task[fact]} Angebot",
        "date": "{place[name]} {task[q_short]} Termin",
    },
    fillers={
        "user": (
            "Danke.",
            "Das war's erst mal.",
            "Super, danke dir.",
            "Passt.",
            "Okay, weiter geht's.",
        ),
        "assistant": (
            "Gerne.",
            "Notiert.",
            "Alles klar, sonst noch was?",
            "Erledigt.",
            "Gut, dann war's das von meiner Seite.",
        ),
    },
    content_words=latin_words(STOPWORDS, ("ern", "en", "er", "es", "em", "et", "e", "n", "s", "t")),
    never_mentioned=(
        "Was hat der Tierarzt über das Futter für den Hund gesagt?",
        "In welchem Hotel haben wir in Japan übernachtet?",
        "Welche Stufe hat meine Tochter bei der Klavierprüfung erreicht?",
        "Wie hieß der Science-Fiction-Roman, den du mir empfohlen hast?",
        "Wann läuft mein Reisepass ab?",
        "Wie viele Gäste kamen zu unserer Hochzeit?",
        "Was hat der Fitnesstrainer für meinen Trainingsplan vorgeschlagen?",
        "Wie viel Steuern habe ich letztes Jahr zurückbekommen?",
    ),
)
