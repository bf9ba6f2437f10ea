"""Redaction at ingest: credentials in a posted turn become ``[REDACTED:<kind>]`` before any
byte reaches disk (the route and the backfill both go through parse_conversation).

What is redacted (built in): cloud provider keys (AWS access key ids, AWS secret keys in their
``aws_secret_access_key=`` context, Google API keys, Azure storage keys and client secrets),
bearer tokens and JWTs, private key blocks (a block cut before its END line is redacted to where
it stops), passwords in URLs (``scheme://user:password@host``: only the password), and the key
shapes of common providers (GitHub, Slack, Stripe, OpenAI/Anthropic). Identifiers, UUIDs, git
SHAs, hashes, dates, version numbers, emails and URLs without a password are not secrets and stay.

Every built-in pattern is linear in the text: no nested quantifiers, each token starts at a
boundary (a lookbehind), and runs of a character class are possessive (``++``, Python 3.11), so
a failed match never re-scans its run. A server once had a quadratic regex on this path; tests
check the cost of a long adversarial input grows like its length.

Extra patterns: REDACT_PATTERNS_FILE, one ``kind<TAB>regex`` a line (``#`` comments and blank
lines ignored). A pattern with a group named ``secret`` redacts only that group. A bad file (an
unknown line shape, a kind outside [a-z0-9_], a regex that does not compile or matches the empty
string) refuses to start the server, naming the line. Their linearity is the operator's care.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

KIND = re.compile(r"[a-z0-9_]{1,40}")
MARKER = re.compile(r"\[REDACTED:[a-z0-9_]{1,40}\]")

# A token character for key-shaped strings, and the lookbehind that makes a match start at a
# token's first character (so "xAKIA..." inside a longer run is not a key, and a long run is
# tried from one position only).
_B64URL = "A-Za-z0-9_-"
_START = f"(?<![{_B64URL}])"
_END = f"(?![{_B64URL}])"

BUILTIN: tuple[tuple[str, str], ...] = (
    # First: a key block holds base64 runs that other patterns would only partly match.
    (
        "private_key",
        r"-----BEGIN[A-Z ]{0,40}PRIVATE KEY-----(?:[^-]|-(?!----))*+"
        r"(?:-----END[A-Z ]{0,40}PRIVATE KEY-----)?",
    ),
    # Three base64url segments, the first a JSON object's start ("{"  -> eyJ); the signature
    # may be empty (alg none).
    ("jwt", f"{_START}eyJ[{_B64URL}]{{7,}}+\\.[{_B64URL}]{{2,}}+\\.[{_B64URL}]*+"),
    (
        "aws_access_key",
        r"(?<![A-Z0-9])(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}(?![A-Z0-9])",
    ),
    (
        "aws_secret_key",
        r"(?i:aws_?secret_?(?:access_?)?key)[\"']?[ \t]{0,4}[:=][ \t]{0,4}[\"']?"
        r"(?P<secret>(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=]))",
    ),
    ("google_api_key", f"{_START}AIza[{_B64URL}]{{35}}{_END}"),
    (
        "azure_key",
        r"(?i:AccountKey|SharedAccessKey)=(?P<secret>[A-Za-z0-9+/]{20,}+={0,2})",
    ),
    # Entra ID (Azure AD) client secrets: three characters, a digit, "Q~", then 31 to 34 more.
    ("azure_client_secret", r"(?<![A-Za-z0-9_~.-])[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}+"),
    ("github_token", f"{_START}(?:gh[pousr]_[A-Za-z0-9]{{36}}+|github_pat_[A-Za-z0-9_]{{22,}}+)"),
    ("slack_token", f"{_START}xox[abposr]-[A-Za-z0-9-]{{10,}}+"),
    ("stripe_key", f"{_START}(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{{16,}}+"),
    # A digit somewhere in the run: "sk-learn-compatible-estimators" is prose, not a key.
    ("openai_key", f"{_START}sk-(?=[A-Za-z_-]*+[0-9])(?:[a-z]{{2,8}}-)?[{_B64URL}]{{20,}}+"),
    # After the JWT: "Bearer eyJ..." is then already redacted as a JWT.
    # With a digit in it: "bearer internationalization" is prose.
    (
        "bearer_token",
        r"(?i:\bbearer)[ \t]{1,4}"
        r"(?P<secret>(?=[A-Za-z._~+/-]*+[0-9])[A-Za-z0-9._~+/-]{16,}+=*+)",
    ),
    (
        "basic_auth",
        r"(?i:authorization)[\"']?[ \t]{0,4}[:=][ \t]{0,4}[\"']?(?i:basic)[ \t]{1,4}"
        r"(?P<secret>[A-Za-z0-9+/_-]{8,}+={0,2})",  # base64, or base64url from some clients
    ),
    # scheme://user:password@host: the password only (the user and host stay readable). Starts
    # at "://", a literal the regex engine finds fast.
    (
        "url_password",
        r"://[^\s/?#@:]{0,256}+:(?P<secret>[^\s/?#@]{1,256}+)@",
    ),
)


# A cheap first look: a built-in pattern runs only on text holding one of its words (compared
# lowercased), so ordinary text costs a few substring scans, not fourteen regex passes.
TRIGGERS: dict[str, tuple[str, ...]] = {
    "private_key": ("private key",),
    "jwt": ("eyj",),
    "aws_access_key": ("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa"),
    "aws_secret_key": ("secret",),
    "google_api_key": ("aiza",),
    "azure_key": ("accountkey=", "sharedaccesskey="),
    "azure_client_secret": ("q~",),
    "github_token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "slack_token": ("xox",),
    "stripe_key": ("_live_", "_test_"),
    "openai_key": ("sk-",),
    "bearer_token": ("bearer",),
    "basic_auth": ("authorization",),
    "url_password": ("://",),
}

Pattern = tuple[str, re.Pattern[str], tuple[str, ...]]  # kind, regex, triggers (none: always)


class BadPatterns(ValueError):
    """REDACT_PATTERNS_FILE cannot be used; the message names the line."""


@dataclass(frozen=True)
class Redactor:
    """Applies its patterns in order; `redact` returns the text and the count per kind."""

    patterns: tuple[Pattern, ...] = field(
        default_factory=lambda: tuple(
            (kind, re.compile(rx), TRIGGERS[kind]) for kind, rx in BUILTIN
        )
    )

    def redact(self, text: str) -> tuple[str, Counter[str]]:
        counts: Counter[str] = Counter()
        # Once: a substitution only removes words (a marker's words match no pattern).
        lowered = text.lower()
        for kind, pattern, triggers in self.patterns:
            if triggers and not any(word in lowered for word in triggers):
                continue
            if not pattern.search(text):
                continue
            text = pattern.sub(_replacer(kind, counts), text)
        return text, counts

    @classmethod
    def with_file(cls, path: Path | None) -> Redactor:
        """The built-in patterns, then the file's (BadPatterns when it cannot be used)."""
        builtin = cls()
        if path is None:
            return builtin
        return cls(builtin.patterns + load_patterns(path))


def _replacer(kind: str, counts: Counter[str]) -> Callable[[re.Match[str]], str]:
    marker = f"[REDACTED:{kind}]"

    def replace(match: re.Match[str]) -> str:
        if "secret" in match.re.groupindex and MARKER.fullmatch(match.group("secret") or ""):
            return match.group(0)  # already redacted (a re-post): the same text, not counted
        counts[kind] += 1
        if "secret" in match.re.groupindex and match.group("secret") is not None:
            start, end = match.span("secret")
            whole = match.group(0)
            offset = match.start()
            return whole[: start - offset] + marker + whole[end - offset :]
        return marker

    return replace


def load_patterns(path: Path) -> tuple[Pattern, ...]:
    """``kind<TAB>regex`` lines; BadPatterns names the first line that cannot be used."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadPatterns(f"REDACT_PATTERNS_FILE {path}: cannot read ({exc})") from exc
    patterns = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"REDACT_PATTERNS_FILE {path} line {number}"
        kind, tab, regex = line.partition("\t")
        if not tab or not regex:
            raise BadPatterns(f"{where}: expected kind<TAB>regex")
        if not KIND.fullmatch(kind):
            raise BadPatterns(f"{where}: kind must match [a-z0-9_]{{1,40}}")
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise BadPatterns(f"{where}: regex does not compile ({exc})") from exc
        if compiled.fullmatch(""):
            raise BadPatterns(f"{where}: regex matches the empty string")
        patterns.append((kind, compiled, ()))
    return tuple(patterns)
