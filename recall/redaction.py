"""Redaction at ingest: credentials in a posted turn become ``[REDACTED:<kind>]`` before any
byte reaches disk (the route and the backfill both go through parse_conversation).

What is redacted (built in): cloud provider keys (AWS access key ids, AWS secret keys in their
``aws_secret_access_key=`` context, Google API keys, Azure storage keys and client secrets),
bearer tokens and JWTs, private key blocks (PEM, OpenSSH and PGP armour; a block cut before its
END line is redacted to where it stops), passwords in URLs (``scheme://user:password@host``: only
the password, which runs to the last ``@`` before the host), and the key shapes of common
providers (GitHub, GitLab, Slack and its webhook URLs, Stripe, OpenAI/Anthropic, npm, PyPI,
Hugging Face, SendGrid, Shopify, DigitalOcean, Twilio, HashiCorp Vault, Databricks, age).
Identifiers, UUIDs, git SHAs, hashes, dates, version numbers, emails and URLs without a password
are not secrets and stay.

The provider shapes are taken from gitleaks' rule set (config/gitleaks.toml), kept to those with a
distinctive prefix, and rewritten here in the linear style below. detect-secrets is not used: it
scans line by line through a plugin per provider, slower than one trigger-gated pass, and its
regexes carry no linearity promise.

Every built-in pattern is linear in the text: no nested quantifiers, each token starts at a
boundary (a lookbehind, after the token's literal prefix where it has one, so the engine searches
for the literal), and runs of a character class are possessive (``++``, Python 3.11), so a failed
match never re-scans its run. A server once had a quadratic regex on this path; tests
check the cost of a long adversarial input grows like its length.

Extra patterns: REDACT_PATTERNS_FILE, one ``kind<TAB>regex`` a line (``#`` comments and blank
lines ignored). A pattern with a group named ``secret`` redacts only that group. A bad file (an
unknown line shape, a kind outside [a-z0-9_], a regex that does not compile, or one that can
match without consuming text, such as a lookahead alone, or whose ``secret`` group can) refuses
to start the server, naming the line: a zero-width match would insert a marker and keep the
secret. Their linearity is the operator's care.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from re import _parser as _regex_parser  # minimum match widths (Python 3.11+)

KIND = re.compile(r"[a-z0-9_]{1,40}")
MARKER = re.compile(r"\[REDACTED:[a-z0-9_]{1,40}\]")

# A token character for key-shaped strings, and the lookbehind that makes a match start at a
# token's first character (so "xAKIA..." inside a longer run is not a key, and a long run is
# tried from one position only).
_B64URL = "A-Za-z0-9_-"
_START = f"(?<![{_B64URL}])"
_END = f"(?![{_B64URL}])"


def _lead(prefix: str) -> str:
    """A token opening with the fixed-width `prefix` (a regex), at a token's first character.
    The literal comes first so the engine can search for it fast (a leading lookbehind is
    tried at every position); the lookbehind after it checks the same boundary as _START."""
    return f"{prefix}(?<![{_B64URL}]{prefix})"


BUILTIN: tuple[tuple[str, str], ...] = (
    # First: a key block holds base64 runs that other patterns would only partly match. PGP
    # armour says "PRIVATE KEY BLOCK"; the body runs to the next "-----" or the text's end.
    (
        "private_key",
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?:[^-]|-(?!----))*+"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)?",
    ),
    # Three base64url segments, the first a JSON object's start ("{"  -> eyJ); the signature
    # may be empty (alg none).
    ("jwt", f"{_START}eyJ[{_B64URL}]{{7,}}+\\.[{_B64URL}]{{2,}}+\\.[{_B64URL}]*+"),
    (
        "aws_access_key",
        r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|A3T[A-Z0-9])"
        r"[A-Z0-9]{16}(?![A-Z0-9])",
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
    # Personal, deploy, runner, CI job, trigger, feed, mail, agent, OAuth, SCIM and feature-flag
    # tokens; a routable token ends in "." and nine characters.
    (
        "gitlab_token",
        f"{_lead('gl')}(?:pat|dt|rt|cbt|ptt|ft|imt|agent|oas|soat|ffct)-[{_B64URL}]{{20,}}+"
        r"(?:\.[0-9a-z]{9})?",
    ),
    ("slack_token", f"{_START}(?:xox[abposre]|xapp)-[A-Za-z0-9-]{{10,}}+"),
    # The URL is the credential: its path after the kind (host and kind stay readable).
    (
        "slack_webhook",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9+/_-]{20,}+)",
    ),
    ("stripe_key", f"{_START}(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{{16,}}+"),
    # A digit somewhere in the run: "sk-learn-compatible-estimators" is prose, not a key.
    ("openai_key", f"{_START}sk-(?=[A-Za-z_-]*+[0-9])(?:[a-z]{{2,8}}-)?[{_B64URL}]{{20,}}+"),
    ("npm_token", f"{_lead('npm_')}[A-Za-z0-9]{{36}}{_END}"),
    # A macaroon whose first bytes name pypi.org or test.pypi.org, base64-encoded.
    ("pypi_token", f"{_lead('pypi-AgE')}(?:IcHlwaS5vcmc|NdGVzdC5weXBpLm9yZw)[{_B64URL}]{{50,}}+"),
    ("huggingface_token", f"{_START}(?:hf_|api_org_)[A-Za-z]{{34}}{_END}"),
    ("sendgrid_key", _lead(r"SG\.") + f"[{_B64URL}]{{22}}\\.[{_B64URL}]{{43}}{_END}"),
    ("shopify_token", f"{_lead('shp')}(?:at|ca|pa|ss)_[a-fA-F0-9]{{32}}{_END}"),
    ("digitalocean_token", f"{_lead('do')}[opr]_v1_[a-f0-9]{{64}}{_END}"),
    # "SK" and 32 hex digits, nothing more: a longer hex run (a SHA) is not one.
    ("twilio_key", f"{_lead('SK')}[0-9a-fA-F]{{32}}{_END}"),
    ("vault_token", f"{_lead('hv')}[sbr]\\.[{_B64URL}]{{24,}}+"),
    ("databricks_token", f"{_lead('dapi')}[a-f0-9]{{32}}(?:-[0-9])?{_END}"),
    ("age_secret_key", f"{_lead('AGE-SECRET-KEY-1')}[0-9A-Z]{{58}}{_END}"),
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
    # scheme://user:password@host: the password only (the user and host stay readable). A
    # password may hold "@", so it runs to the authority's last "@" (none after it before the
    # path, query or fragment), where urllib and browsers split it too. Starts at "://", a
    # literal the regex engine finds fast; an attempt cannot cross a "/", so attempts never
    # re-scan each other's text, and each "@" is looked past once.
    (
        "url_password",
        r"://[^\s/?#@:]*+:(?P<secret>[^\s/?#]+?)@(?![^\s/?#@]*+@)",
    ),
)


# A cheap first look: a built-in pattern runs only on text holding one of its words (compared
# lowercased), so ordinary text costs a substring scan or one literal search per pattern, not a
# regex pass that tries a lookbehind at every position.
TRIGGERS: dict[str, tuple[str, ...]] = {
    "private_key": ("private key",),
    "jwt": ("eyj",),
    "aws_access_key": (
        "akia",
        "asia",
        "abia",
        "acca",
        "agpa",
        "aida",
        "aroa",
        "anpa",
        "anva",
        "aipa",
        "a3t",
    ),
    "aws_secret_key": ("secret",),
    "google_api_key": ("aiza",),
    "azure_key": ("accountkey=", "sharedaccesskey="),
    "azure_client_secret": ("q~",),
    "github_token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "gitlab_token": (
        "glpat-",
        "gldt-",
        "glrt-",
        "glcbt-",
        "glptt-",
        "glft-",
        "glimt-",
        "glagent-",
        "gloas-",
        "glsoat-",
        "glffct-",
    ),
    "slack_token": ("xox", "xapp-"),
    "slack_webhook": ("hooks.slack.com",),
    "stripe_key": ("_live_", "_test_", "_prod_"),
    "openai_key": ("sk-",),
    "npm_token": ("npm_",),
    "pypi_token": ("pypi-age",),
    "huggingface_token": ("hf_", "api_org_"),
    "sendgrid_key": ("sg.",),
    "shopify_token": ("shp",),
    "digitalocean_token": ("_v1_",),
    "twilio_key": ("sk",),
    "vault_token": ("hvs.", "hvb.", "hvr."),
    "databricks_token": ("dapi",),
    "age_secret_key": ("age-secret-key-1",),
    "bearer_token": ("bearer",),
    "basic_auth": ("authorization",),
    "url_password": ("://",),
}

Present = Callable[[str], object]  # truthy when the lowercased text holds a trigger word
Pattern = tuple[str, re.Pattern[str], Present | None]  # kind, regex, trigger check (None: always)


def _present(words: tuple[str, ...]) -> Present:
    """The check for one kind's words. Several with a common first letter: one regex (the parser
    moves their common prefix out as a literal the engine searches for fast), which costs a third
    to a tenth of a scan per word on a long text. Else a scan per word: with no common prefix
    such a regex would try its alternatives at every position."""
    if len(words) == 1:
        word = words[0]
        return lambda text: word in text
    if len({word[0] for word in words}) == 1:
        return re.compile("|".join(map(re.escape, words))).search
    return lambda text: any(word in text for word in words)


class BadPatterns(ValueError):
    """REDACT_PATTERNS_FILE cannot be used; the message names the line."""


@dataclass(frozen=True)
class Redactor:
    """Applies its patterns in order; `redact` returns the text and the count per kind."""

    patterns: tuple[Pattern, ...] = field(
        default_factory=lambda: tuple(
            (kind, re.compile(rx), _present(TRIGGERS[kind])) for kind, rx in BUILTIN
        )
    )

    def redact(self, text: str) -> tuple[str, Counter[str]]:
        counts: Counter[str] = Counter()
        # Once: a substitution only removes words (a marker's words match no pattern).
        lowered = text.lower()
        for kind, pattern, present in self.patterns:
            if present is not None and not present(lowered):
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
        if why := _zero_width(compiled):
            raise BadPatterns(f"{where}: {why}")
        patterns.append((kind, compiled, None))
    return tuple(patterns)


def _zero_width(compiled: re.Pattern[str]) -> str | None:
    """Why a pattern could match (or redact) no text, else None. A zero-width match, e.g. a
    lookahead alone, inserts a marker and keeps the secret after it; so does a ``secret`` group
    that can be empty. The regex parser's minimum width is a lower bound over all inputs."""
    parsed = _regex_parser.parse(compiled.pattern)  # its inline flags are in the text
    if parsed.getwidth()[0] == 0:
        return "regex can match without consuming text (e.g. only a lookahead)"
    secret = compiled.groupindex.get("secret")
    if secret is not None and parsed.state.groupwidths[secret][0] == 0:
        return "group `secret` can match without consuming text (e.g. only a lookahead)"
    return None
