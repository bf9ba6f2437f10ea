"""Word rules: words, identifiers, stopwords, the query as one analysed value, the FTS query,
coverage. Pure functions over text; nothing here reads the db.

`identifier_forms` also fills the stored `ids` column: a change to what counts as an identifier
changes what is stored, so it needs a bump of `store.SCHEMA`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

WORD = re.compile(r"\w+")
# An identifier: letters and digits joined by -_./#: as in MT-4471, N-11, F-204, v2.3.1.
# Linear on any text: a match may only start where a run of letters and digits starts (the
# lookbehind), and runs are taken whole (possessive), so a long run without a separator (a hex or
# base64 blob) is read once, not once per starting position (that was quadratic: 70 ms for 1,200
# chars). Separators are never letters or digits, so the matches are the same as without both.
IDENTIFIER = re.compile(r"(?<![^\W_])[^\W_]++(?:[-_./#:][^\W_]++)+")
# Longer than this is a blob (a hash, a key, a path), not something one searches for by name.
MAX_IDENTIFIER_CHARS = 64
NON_WORD = re.compile(r"[\W_]+")
STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a about after again all also am an and any are as at be because been before being both "
        "but by can could did do does doing for from had has have having he her here him his how "
        "i if in into is it its just me more most my no nor not of off on once only or other our "
        "out over own same she should so some such than that the their them then there these they "
        "this those through to too under until up very was we were what when where which while "
        "who whom whose why will with would you your",
    )
)
# Scripts written without spaces between words: Han (Chinese, Japanese kanji), kana, Hangul.
# FTS5's unicode61 keeps a run of them as one token (a whole clause), so a query shares no token
# with the passage unless it is the very clause. A run is read as its overlapping character
# bigrams instead ("会议室" -> "会议 议室"): most Chinese words are two characters, and a
# longer word is matched by its bigrams in a row. No dictionary, the same rule for every such
# language.
CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+")
# The English stemmer (FTS5's porter) applied to German or Spanish cuts suffixes it reads as
# English ("straße" -> "straß", "hablamos" -> "hablamo"). A word of a passage that does not look
# English is indexed with this mark after it: a private-use character, a token character to
# unicode61, on which no porter rule ends, so the word is stored as written. A query searches
# each of its words both ways (fts_forms); a passage holds one.
UNSTEMMED = "\ue000"
# Words distinctly English, few of them shared with German, Spanish or French ("in", "am", "was",
# "a", "no" are): a passage with none of them among many words is not stemmed as English.
ENGLISH_WORDS = frozenset(
    re.findall(
        r"\w+",
        "the and of to is that it for you with this are have be not they what we my your our at "
        "from but or if would can do did there about just been has had were which",
    )
)
ENGLISH_SHARE = 0.05  # one word in twenty: English prose runs at a third and more
SHORT_PASSAGE = 6  # fewer Latin words than this: English unless a letter says otherwise
MAX_QUERY_TERMS = 32  # a query is a few words; the cap bounds the FTS work one call can cause
# Words joined by "_" ("user_id") are phrases to FTS5 ("user" "id"), and PostgreSQL's postings
# hold no positions: each is counted by tokenising every row holding all its words again. A
# query searches its first MAX_PHRASE_TERMS of them; later ones are left out, on both stores.
MAX_PHRASE_TERMS = 8
PHRASE = re.compile(r"[^\W_]_+[^\W_]")  # "_" between two word characters: FTS5 splits there
ID_COVERAGE = 4  # a whole identifier counts as this many words in coverage()


@dataclass(frozen=True)
class Query:
    """A query analysed once; the search and the rendering both read this value."""

    text: str  # as asked: what the model embeds
    terms: tuple[str, ...]  # what the lexical leg searches for (query_terms)
    ids: tuple[str, ...]  # the identifiers' joined forms (MT-4471 -> mt4471), also in terms
    focus: tuple[str, ...]  # what an excerpt keeps in view (focus_terms)
    months: tuple[tuple[int | None, int], ...] = ()  # (year or None, month) the query names

    @classmethod
    def parse(cls, text: str) -> Query:
        return cls(
            text=text,
            terms=tuple(query_terms(text)),
            ids=tuple(identifier_forms(text)),
            focus=tuple(focus_terms(text)),
            months=tuple(months_named(text)),
        )


MONTHS = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)  # fmt: skip
# A month by name (or its three-letter form), then maybe a year: "in May 2023", "Jan 2026".
# "may" alone is also a verb, so May counts only before a year.
MONTH_NAMED = re.compile(
    r"\b(" + "|".join(m[:3] + f"(?:{m[3:]})?" if len(m) > 3 else m for m in MONTHS) + r")\b"
    r"(?:\s*,?\s*(\d{4}))?",
    re.IGNORECASE,
)


# A month is a time ("in May 2023", "back in January", "since March", "on 8 June", "was it
# February?") unless it names part of the subject: "the July pallets", "the March delivery", a
# month right before a noun with no time word before it. Only a time lifts the turns dated in it.
TIME_WORDS = frozenset(
    re.findall(
        r"\w+",
        "in on during since from until till by before after around through throughout early late "
        "mid of between and or to last next this each every",
    )
)
WORD_BEFORE = re.compile(r"([^\W_]+)[^\w]*$")
WORD_AFTER = re.compile(r"[ \t]+([^\W\d_]+)")


def months_named(text: str) -> list[tuple[int | None, int]]:
    """The (year or None, month) pairs a query names as a time: a soft hint for ranking, never
    a filter. A month naming the subject ("the July pallets") is a word like any other."""
    found = []
    for match in MONTH_NAMED.finditer(text):
        name, year = match.group(1).lower(), match.group(2)
        month = next(i for i, m in enumerate(MONTHS, 1) if m.startswith(name[:3]))
        if month == 5 and not year and name == "may":
            continue
        if not year and names_a_subject(text, match.start(), match.end(1)):
            continue
        found.append((int(year) if year else None, month))
    return list(dict.fromkeys(found))


def names_a_subject(text: str, start: int, end: int) -> bool:
    """Whether the month at ``text[start:end]`` modifies the noun after it ("the July pallets")
    rather than telling a time: a word that is neither a stopword nor a time word follows, and
    no time word or day number comes right before it."""
    before = WORD_BEFORE.search(text[:start])
    if before and (before.group(1).lower() in TIME_WORDS or before.group(1).isdigit()):
        return False
    after = WORD_AFTER.match(text, end)
    if after is None:
        return False
    word = after.group(1).lower()
    return word not in STOPWORDS and word not in TIME_WORDS


def names_month(text: str, month: int) -> bool:
    """Whether a passage's text names ``month`` as a time, read as a query's month is ("in July",
    not "the July delivery"): capitalised, as a month is written, and "May" only after a word or
    a number, never at a sentence's start where it is the verb."""
    name = MONTHS[month - 1].capitalize()
    pattern = r"(?<=[a-z0-9,] )May\b" if month == 5 else rf"\b(?:{name}|{name[:3]}\.?)\b"
    return any(
        not names_a_subject(text, found.start(), found.end())
        for found in re.finditer(pattern, text)
    )


def segmented(text: str) -> str:
    """``text`` with each run of CJK characters replaced by its overlapping bigrams, spaced
    (a run of one character stays as it is); other text as it was."""
    return CJK_RUN.sub(lambda run: f" {' '.join(bigrams(run.group(0)))} ", text)


def words_of(text: str) -> list[str]:
    """The words of ``text``, lower-cased, CJK runs as their bigrams: as the index reads them."""
    return WORD.findall(segmented(text.lower()))


def bigrams(run: str) -> list[str]:
    return [run] if len(run) < 2 else [run[i : i + 2] for i in range(len(run) - 1)]


def stemmable(word: str) -> bool:
    """Whether porter may change ``word`` (a WORD token): three characters or more, with a
    letter outside CJK. The index and the query mark and expand by this same test."""
    return len(word) >= 3 and any(c.isalpha() and not CJK_RUN.match(c) for c in word)


def english_looking(text: str) -> bool:
    """Whether a passage reads as English to the stemmer: a twentieth of its Latin words or
    more are ENGLISH_WORDS; a short one without such words counts as English unless it has a
    letter beyond ASCII (ä, ñ, é)."""
    words = [w for w in WORD.findall(CJK_RUN.sub(" ", text.lower())) if not w.isdigit()]
    hits = sum(w in ENGLISH_WORDS for w in words)
    if hits >= ENGLISH_SHARE * len(words):
        return True
    return len(words) < SHORT_PASSAGE and text.isascii()


def fts_text(text: str) -> str:
    """What the FTS index holds for a passage's text (both stores): CJK runs as bigrams, and in
    a passage that does not look English every stemmable word marked UNSTEMMED."""
    text = segmented(text)
    if english_looking(text):
        return text
    return WORD.sub(lambda w: w.group(0) + UNSTEMMED if stemmable(w.group(0)) else w.group(0), text)


def fts_forms(term: str) -> list[str]:
    """The forms a query term is searched by: as written (porter stems it, as it stems an
    English passage) and, when stemmable, marked (as a passage in another language holds it)."""
    return [term, term + UNSTEMMED] if stemmable(term) else [term]


def identifiers(text: str) -> list[str]:
    """The identifiers in ``text`` as written, in order, up to MAX_IDENTIFIER_CHARS each."""
    return [
        token
        for token in (match.group(0) for match in IDENTIFIER.finditer(text))
        if len(token) <= MAX_IDENTIFIER_CHARS
    ]


def identifier_forms(text: str) -> list[str]:
    """``MT-4471`` -> ``mt4471``: one term for the whole id (unicode61 sees ``mt`` + ``4471``)."""
    forms = []
    for token in identifiers(text):
        if any(c.isdigit() for c in token) and any(c.isalpha() for c in token):
            forms.append(NON_WORD.sub("", token.lower()))
    return forms


def query_terms(query: str) -> list[str]:
    """The words worth searching for, then the joined forms of the identifiers in the query.

    Stopwords are dropped unless nothing else is left: they match nearly every row, which costs
    time and adds noise. Of the words joined by "_", the first MAX_PHRASE_TERMS are kept.
    """
    words = words_of(query)
    # Single letters (the "t" of "didn't", the "s" of "Caroline's") and one-character parts of
    # ids (the "v" of V-1415, which "v1415" matches exactly) match thousands of rows, cost a third
    # of the search time and say nothing; a single digit on its own ("note 7") stays.
    id_parts = {p for token in identifiers(query.lower()) for p in WORD.findall(token)}
    terms = [
        w
        for w in words
        if w not in STOPWORDS and not (len(w) == 1 and (w.isalpha() or w in id_parts))
    ]
    terms = terms or words
    terms += identifier_forms(query)
    unique = list(dict.fromkeys(terms))
    beyond = set([t for t in unique if PHRASE.search(t)][MAX_PHRASE_TERMS:])
    return [t for t in unique if t not in beyond][:MAX_QUERY_TERMS]


def focus_terms(query: str) -> list[str]:
    """What to keep in view when a passage must be cut: identifiers first, then other words."""
    ids = [token.lower() for token in identifiers(query)]
    words = [w for w in words_of(query) if w not in STOPWORDS and (len(w) > 2 or CJK_RUN.match(w))]
    return ids + words


def fts_query(terms: Sequence[str]) -> str:
    """An OR of quoted terms: no FTS syntax (quotes, NEAR, *, :, -, AND) survives.

    Every term is a run of word characters wrapped in double quotes, so FTS5 reads it as a plain
    string (tokenised and stemmed like the indexed text), in each of its fts_forms.
    """
    return " OR ".join(f'"{form}"' for t in terms for form in fts_forms(t))


def is_common(word: str, common_stems: Mapping[str, int] | frozenset[str]) -> bool:
    """Whether a query word is one of the index's common words. The index holds porter stems
    ("valv" for "valves"), so the word itself or the word less a suffix of up to 3 letters."""
    return common_count(word, common_stems) is not None


def common_count(word: str, common_stems: Mapping[str, int] | frozenset[str]) -> int | None:
    """How many passages hold a common query word (its stem's count), or None when it is not
    common. A frozenset of stems (no counts) answers 0 for a common word."""
    for prefix in stem_prefixes(word):
        if prefix in common_stems:
            return common_stems[prefix] if isinstance(common_stems, Mapping) else 0
    return None


def stem_prefixes(word: str) -> list[str]:
    """The stems a query word may have in the index, shortest first: the word itself or the
    word less a suffix of up to 3 letters (never shorter than 3); then, for a stemmable word,
    the word as a passage in another language holds it (marked UNSTEMMED)."""
    stems = [word[:n] for n in range(max(len(word) - 3, 3), len(word) + 1)]
    return [*stems, word + UNSTEMMED] if stemmable(word) else stems


def coverage(
    terms: Sequence[str],
    text: str,
    weights: Mapping[str, float] | None = None,
    ids: Iterable[str] | None = None,
) -> float:
    """How much of the query a passage contains: the weights of the terms it has (1 each when
    no weights are given). A word counts by its stem-ish prefix; a whole identifier counts
    ID_COVERAGE times, so the id always outweighs a few shared words. A word shorter than four
    letters counts only whole (as a prefix, "end" would match "endless").

    BM25 sums evidence per term, so a short passage with the id alone can beat the one passage
    that has the id *and* the rest of the question ("line L-382 impeller QC"): among lexical
    candidates, the one covering more of the query ranks first.

    ``ids`` are the passage's identifier forms when the caller already has them (the index
    stores them): the same forms without reading the text for them again.
    """
    words = set(words_of(text))
    held = set(identifier_forms(text) if ids is None else ids)
    # The words' prefixes of each length asked for: a set lookup per term, not a scan of every
    # word per term (a recall scores dozens of passages, on the thread that holds the GIL).
    prefixes: dict[int, set[str]] = {}

    def starts_a_word(prefix: str) -> bool:
        if len(prefix) not in prefixes:
            prefixes[len(prefix)] = {w[: len(prefix)] for w in words}
        return prefix in prefixes[len(prefix)]

    return sum(
        (ID_COVERAGE if t in held else 1) * (weights.get(t, 1.0) if weights else 1.0)
        for t in terms
        if t in held or t in words or (len(t) >= 4 and starts_a_word(t[: max(4, len(t) - 2)]))
    )
