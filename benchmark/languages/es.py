"""Spanish: an administración de fincas and its comunidades de propietarios. Streets carry
their gender ("en la calle Goya 14", "del paseo Sorolla 3"), terms their article, and what
agrees with them agrees ("el mantenimiento ... está programado", "la revisión ... está
programada", "lo lleva" / "la lleva"); "de el" and "a el" contract to "del" and "al"."""

# ruff: noqa: E501, SIM905  (text tables: one term or template a line, words split from a block)
from __future__ import annotations

import random

from benchmark.languages import Forms, Language, latin_words

PEOPLE = ("Lucía", "Javier", "Marta", "Sergio", "Nerea", "Iñaki",
          "Carmen", "Álvaro", "Rocío", "Pablo", "Ainhoa", "Diego")  # fmt: skip
STREETS = (
    "Goya", "Sorolla", "Zurbarán", "Velázquez", "Machado", "Quevedo", "Cervantes", "Lorca",
    "Unamuno", "Galdós", "Bécquer", "Murillo", "Ribera", "Albéniz", "Granados", "Falla",
    "Góngora", "Espronceda", "Larra", "Zorrilla", "Baroja", "Alberti", "Cernuda", "Salinas",
    "Guillén", "Aleixandre", "Miró", "Gaudí", "Jovellanos", "Campoamor", "Echegaray", "Moratín",
    "Garcilaso", "Berceo", "Nebrija", "Pizarro", "Colón", "Elcano", "Magallanes", "Sagasta",
    "Castelar", "Prim", "Narváez", "Argensola", "Feijoo", "Mariana", "Vitoria", "Herrera",
)  # fmt: skip
STREET_KINDS = {"calle": "la", "avenida": "la", "plaza": "la", "ronda": "la", "travesía": "la",
                "paseo": "el"}  # fmt: skip
SURNAMES = (
    "Ibarra", "Salcedo", "Quintana", "Robles", "Valverde", "Arrieta", "Cabrera", "Echeverría",
    "Olmedo", "Peña", "Villalba", "Zamora", "Aranda", "Bustos", "Carrasco", "Delgado",
    "Escobar", "Fuentes", "Galindo", "Hurtado", "Iglesias", "Jiménez", "Lozano", "Medina",
    "Navarro", "Ortega", "Pacheco", "Quiroga", "Ramos", "Sanz", "Toledo", "Urrutia", "Vidal",
    "Yagüe", "Zubiri", "Calvo", "Marín", "Soler", "Prieto", "Rubio",
)  # fmt: skip
FIRMS = ("Reformas {}", "Mantenimientos {}", "Hermanos {}", "Instalaciones {}", "Servicios {}")
MONTHS = ("enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto",
          "septiembre", "octubre", "noviembre", "diciembre")  # fmt: skip
DAYS = ("lunes", "martes", "miércoles", "jueves", "viernes", "sábado")
OF = {"el": "del", "la": "de la", "los": "de los", "las": "de las"}
TO = {"el": "al", "la": "a la", "los": "a los", "las": "a las"}
ENDING = {"el": "o", "la": "a", "los": "os", "las": "as"}  # agreement: programado/programada
PRONOUN = {"el": "lo", "la": "la", "los": "los", "las": "las"}  # "lo lleva" / "la lleva"


def places(rng: random.Random, count: int) -> list[Forms]:
    streets = [(kind, name) for name in STREETS for kind in STREET_KINDS]  # "paseo Goya" too
    if count > len(streets):
        raise ValueError(f"too many conversations: {count} buildings needed, {len(streets)} named")
    out = []
    for kind, name in rng.sample(streets, count):
        article = STREET_KINDS[kind]
        full = f"{kind} {name} {rng.randrange(1, 60)}"
        out.append({"name": full, "en": f"en {article} {full}", "de": f"{OF[article]} {full}",
                    "a": f"{TO[article]} {full}", "n": f"{article} {full}"})  # fmt: skip
    return out


def contractors(rng: random.Random, count: int) -> list[str]:
    if count > len(SURNAMES):
        raise ValueError(f"too many conversations: {count} contractors needed")
    return [rng.choice(FIRMS).format(name) for name in rng.sample(SURNAMES, count)]


def _phrase(text: str, prefix: str = "") -> Forms:
    """A noun phrase with its article: its forms after "de" and "a", its agreement ending and
    its object pronoun, under ``prefix`` ("" for the usual words, "q_" for the paraphrase)."""
    article, rest = text.split(" ", 1)
    return {f"{prefix}n": text, f"{prefix}de": f"{OF[article]} {rest}",
            f"{prefix}a": f"{TO[article]} {rest}", f"{prefix}o": ENDING[article],
            f"{prefix}lo": PRONOUN[article], f"{prefix}bare": rest}  # fmt: skip


def _terms(table: str) -> tuple[Forms, ...]:
    """usual words | paraphrase | short paraphrase (an agent's words)"""
    out = []
    for row in table.strip().splitlines():
        fact, asked, q_short = (part.strip() for part in row.split("|"))
        out.append({"fact": fact, **_phrase(fact), **_phrase(asked, "q_"), "q_short": q_short})
    return tuple(out)


TASKS = _terms("""
la revisión de la caldera | el chequeo anual de la calefacción | chequeo calefacción
la limpieza de los canalones | el despeje de los sumideros del tejado | sumideros tejado
la limpieza de la escalera | el fregado semanal de los rellanos | fregado rellanos
el mantenimiento del ascensor | la puesta a punto periódica del elevador | puesta a punto elevador
la revisión de los extintores | el control de los aparatos antiincendios | control antiincendios
el análisis de legionela | la toma de muestras del agua caliente | muestras agua caliente
la poda de los árboles | el recorte de las ramas del patio | recorte ramas
el cuidado del jardín | el riego y el corte del césped | riego césped
la desinsectación | el tratamiento contra cucarachas y demás plagas | tratamiento plagas
la lectura de contadores | la anotación de los consumos de agua y luz | consumos agua luz
la inspección de la cubierta | la subida al tejado a mirar las tejas | tejas
la limpieza del garaje | el barrido del aparcamiento subterráneo | barrido aparcamiento
el pintado del portal | la capa de pintura nueva del vestíbulo | pintura vestíbulo
""")  # fmt: skip
DEFECTS = _terms("""
la fuga de agua en el sótano | las manchas de humedad en los trasteros | humedad trasteros
la avería del ascensor | el elevador que se queda parado entre pisos | elevador parado
el portero automático estropeado | el interfono que no suena | interfono
el atasco de la bajante | el desagüe que no traga | desagüe
la gotera del último piso | el agua que entra por el techo del ático | techo ático
la luz de la escalera que parpadea | el alumbrado del rellano que se enciende y se apaga solo | alumbrado rellano
la puerta del portal que se atasca | el acceso principal que cuesta abrir | acceso principal
el moho del baño | las manchas negras en el techo del aseo | manchas aseo
los radiadores fríos | la calefacción que no calienta | calefacción no calienta
los buzones forzados | los casilleros del correo reventados | casilleros correo
""")  # fmt: skip

STOPWORDS = frozenset("""
el la los las un una unos unas de del al a en y o u que qué por para con se le les lo nos me
te mi su sus es son está están era fue ha han hemos he hay ya más como cuál cuándo cuánto
quién dónde otro otra otros otras este esta esto ese esa eso sobre hasta desde muy no sí nosotros nuestro nuestra
""".split())  # fmt: skip

LANGUAGE = Language(
    code="es",
    name="Español",
    people=PEOPLE,
    days=DAYS,
    months=MONTHS,
    places=places,
    tasks=TASKS,
    defects=DEFECTS,
    contractors=contractors,
    ticket_prefix="OT",
    amount=lambda euros: f"{euros:,}".replace(",", ".") + " euros",
    date=lambda month, day, hour, minute: f"{day} de {MONTHS[month - 1]} a las {hour}:{minute:02d}",
    openers=(
        "Buenos días, repasando lo {home[de]} antes de abrir.",
        "Acabo de volver {home[de]}, te cuento un par de cosas.",
        "Hola, {person} me ha pedido que revisemos contigo los pendientes {home[de]}.",
        "Resumen rápido {home[de]}.",
        "Hoy me toca {home[name]}, vamos allá.",
        "Empezamos la semana con {home[name]}.",
        "Ya casi cierro, pero antes lo {home[de]}.",
    ),
    talk={
        ("user", "place"): (
            "{person} estará {place[en]} hasta el {day}.",
            "Los vecinos {place[de]} se han vuelto a quejar del ruido.",
            "Ayer se fue la luz un rato {place[en]}, aquí todo normal.",
            "El conserje {place[de]} está de baja, {person} lo cubre.",
            "¿Han llegado ya los contenedores nuevos {place[a]}?",
            "{person} quiere hablar con el presidente de la comunidad {place[de]}.",
        ),
        ("assistant", "place"): (
            "Anotado, sigo de cerca lo {place[de]}.",
            "Vale, pongo {place[name]} en la lista del {day}.",
            "Entendido. {person} puede pasarse {place[a]} si vuelve a ocurrir.",
            "De acuerdo, se lo comento a {person}.",
        ),
        ("user", "task"): (
            "{person} dice que {task[n]} {place[en]} fue bien.",
            "¿Sigue en pie {task[n]} para el mes que viene?",
            "Los papeles {task[de]} están en la oficina.",
            "{person} pregunta quién se encarga este mes {task[de]}.",
        ),
        ("assistant", "task"): (
            "Apuntado, los papeles {task[de]} los guarda {person}.",
            "Vale, {task[n]} toca pronto otra vez.",
            "Bien, le recuerdo a {person} lo {task[de]}.",
        ),
        ("user", "day"): (
            "Dicen que el buen tiempo aguanta hasta el {day}.",
            "{person} está de vacaciones a partir del {day}.",
            "La impresora de la oficina ha vuelto a fallar.",
            "Primero un café y luego seguimos.",
            "{person} y {person2} salen juntos hoy a hacer visitas.",
        ),
        ("assistant", "day"): (
            "Vale, lo apunto para el {day}.",
            "Perfecto, cuento con {person} el {day}.",
            "Entendido, vuelvo a escribir el {day}.",
        ),
    },
    ask_before_lookup=(
        "¿Puedes mirar qué tenemos pendiente {place[en]}?",
        "¿Qué hay de nuevo {place[en]}?",
        "Échale un ojo a lo {place[de]}, porfa.",
    ),
    leads={
        "user": ("", "Por cierto, ", "Otra cosa: ", "Antes de que se me olvide: "),
        "assistant": ("", "Según el expediente, ", "Lo tengo: ", "Sí, "),
    },
    facts={
        "ticket": (
            "he abierto la orden de trabajo {answer} por {defect[n]} {place[en]}.",
            "{person} ha dado parte {defect[de]} {place[en]}, número de aviso {answer}.",
            "lo {defect[de]} {place[en]} va con la orden {answer}, el técnico ya está avisado.",
            "para {defect[n]} {place[en]} tenemos la orden {answer}.",
        ),
        "owner": (
            "{task[n]} {place[en]} {task[lo]} lleva ahora {answer}.",
            "hemos contratado a {answer} para {task[n]} {place[en]}.",
            "{answer} se encarga desde ya {task[de]} {place[en]}, {person} firmó el contrato.",
            "{task[n]} {place[en]} queda en manos de {answer}.",
        ),
        "amount": (
            "el presupuesto {task[de]} {place[en]} sale por {answer}.",
            "{person} ha mandado el presupuesto: {answer} por {task[n]} {place[en]}.",
            "{task[n]} {place[en]} costaría {answer}, según el presupuesto.",
        ),
        "date": (
            "{task[n]} {place[en]} está programad{task[o]} para el {answer}.",
            "{person} ha cerrado la cita {task[de]} {place[en]}: el {answer}.",
            "{task[n]} {place[en]} queda fijad{task[o]} para el {answer}; ya he avisado a los vecinos.",
        ),
    },
    question_context=(
        "",
        "Esto lo hablamos en {month}. ",
        "{person} lo sacó en {month}. ",
        "Me acuerdo de una conversación sobre {home[n]}. ",
        "Una duda sobre algo de hace tiempo: ",
    ),
    questions={
        "ticket": (
            "¿Con qué código quedó registrado lo {defect[q_de]} {place[en]}?",
            "¿Qué referencia se asignó a lo {defect[q_de]} {place[en]}?",
            "Necesito la referencia de la incidencia sobre {defect[q_n]} {place[en]}.",
        ),
        "owner": (
            "¿Quién se ocupa {task[q_de]} {place[en]}?",
            "¿A qué empresa le dimos {task[q_n]} {place[en]}?",
            "¿Qué proveedor tenemos para {task[q_n]} {place[en]}?",
        ),
        "amount": (
            "¿Cuánto nos piden por {task[q_n]} {place[en]}?",
            "¿Qué precio nos dieron para {task[q_n]} {place[en]}?",
            "¿Qué importe nos cotizaron por {task[q_n]} {place[en]}?",
        ),
        "date": (
            "¿Cuándo vienen a hacer {task[q_n]} {place[en]}?",
            "¿Qué día y a qué hora toca {task[q_n]} {place[en]}?",
            "¿Para cuándo está previst{task[q_o]} {task[q_n]} {place[en]}?",
        ),
    },
    short_queries={
        "ticket": "{place[name]} {defect[bare]} orden de trabajo",
        "owner": "{place[name]} {task[q_short]} empresa",
        "amount": "{place[name]} {task[bare]} presupuesto",
        "date": "{place[name]} {task[q_short]} fecha",
    },
    fillers={
        "user": (
            "Gracias.",
            "Eso es todo por ahora.",
            "Genial, gracias.",
            "Vale.",
            "Seguimos luego.",
        ),
        "assistant": (
            "De nada.",
            "Anotado.",
            "Vale, ¿algo más?",
            "Hecho.",
            "Perfecto, por mi parte eso es todo.",
        ),
    },
    content_words=latin_words(STOPWORDS, ("es", "as", "os", "a", "o", "s", "e")),
    never_mentioned=(
        "¿Qué dijo el veterinario sobre la comida del perro?",
        "¿En qué hotel nos quedamos en Japón?",
        "¿Qué nivel sacó mi hija en el examen de piano?",
        "¿Cómo se llamaba la novela de ciencia ficción que me recomendaste?",
        "¿Cuándo caduca mi pasaporte?",
        "¿Cuántos invitados vinieron a nuestra boda?",
        "¿Qué plan de entrenamiento me propuso el entrenador del gimnasio?",
        "¿Cuánto me devolvieron de la declaración de la renta el año pasado?",
    ),
)
