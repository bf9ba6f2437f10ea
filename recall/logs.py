"""One log format for every line: ours, FastMCP's and uvicorn's, as text or as JSON.

One record is always one line, whatever a request carried: control characters are written as
escapes. Libraries' records below INFO are not written: they quote requests. No record is written
with a password or key in it (SecretsRedacted): the code logs none, and this catches what a
library quotes (libpq quotes a connection string it cannot parse, and the pool logs it).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Loggers that libraries give their own handlers: FastMCP a Rich console at import, that
# wraps and pads lines and ignores LOG_LEVEL; uvicorn its own formatter (serve() asks it not to
# install one, this is for whatever else does). Their records go to the root handler instead.
OWN_HANDLERS = ("fastmcp", "uvicorn", "uvicorn.error", "uvicorn.access")
# Fields a log call may pass in `extra=` that the JSON format keeps as their own keys: the user
# as the directory hash (never the id), and a duration in seconds as a number.
EXTRA_FIELDS = ("user", "seconds")
# Characters that end a line or could fake one (a newline, CR, ESC and the other C0 and C1
# controls, DEL, Unicode's line and paragraph separators): written as their escapes.
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Those of them json.dumps leaves as they are (it escapes C0 itself).
JSON_UNESCAPED = re.compile("[\x7f-\x9f\u2028\u2029]")
# Set on a library's record that a filter of ours has rewritten to hold no request data
# (FastMCP's verifier lines, recall/auth.py): written at DEBUG like ours.
VETTED = "recall_vetted"
# A refusal's reason is written at most this often (seconds): a flood of one bad request cannot
# flood the log, and one kind of refusal cannot hide another.
REFUSAL_INTERVAL = 10.0
REFUSAL_REASONS_KEPT = 1000  # reasons remembered at once: the memory of the limit is bounded
# A password wherever a record may carry one: a URL's (scheme://user:PASSWORD@host) and a
# connection string's (password=...); and the secrets the settings name, wherever they appear.
URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s@]*@", re.IGNORECASE)
KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
REDACTED = "[redacted]"
# A secret shorter than this is left to the patterns: replacing every such string in every line
# would garble the log and hide nothing a URL did not already show.
SHORTEST_SECRET = 4


def user_fields(user: str | Path, seconds: float | None = None) -> dict[str, object]:
    """`extra=` for a line about a user (their hash, or their directory, named by it) and, if
    given, a duration."""
    name = user.name if isinstance(user, Path) else user
    return {"user": name} if seconds is None else {"user": name, "seconds": seconds}


def one_line(text: str) -> str:
    """``text`` with each control character as its Python escape (``\\n``, ``\\x1b``)."""
    return CONTROLS.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def vetted(record: logging.LogRecord) -> None:
    """Marks a library's record as holding nothing from a request, so DEBUG keeps it."""
    setattr(record, VETTED, True)


class LibraryDebugDropped(logging.Filter):
    """Drops libraries' records below INFO: FastMCP's, the MCP SDK's and uvicorn's DEBUG lines
    quote requests (`call_tool ... with {'query': ...}`), often formatted before logging, so
    dropping their arguments would not do. Ours (`recall*`) and vetted ones stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return (
            record.levelno >= logging.INFO
            or record.name == "recall"
            or record.name.startswith("recall.")
            or getattr(record, VETTED, False)
        )


class SecretsRedacted(logging.Filter):
    """Takes every password and key out of a record before it is written: its message, its
    traceback and its stack (see URL_PASSWORD, KEYWORD_PASSWORD and ``secrets``)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Longest first: a secret that holds another is replaced whole.
        self.secrets = sorted({s for s in secrets if len(s) >= SHORTEST_SECRET}, key=len)[::-1]

    def redact(self, text: str) -> str:
        text = URL_PASSWORD.sub(rf"\1{REDACTED}@", text)
        text = KEYWORD_PASSWORD.sub(rf"\1{REDACTED}", text)
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if (clean := self.redact(message)) != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


class TextFormatter(logging.Formatter):
    """LOG_FORMAT, one line a record: a traceback too, with its newlines escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return one_line(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, event (the message) and EXTRA_FIELDS."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        line.update({key: getattr(record, key) for key in EXTRA_FIELDS if hasattr(record, key)})
        if record.exc_info or record.exc_text:  # as SecretsRedacted left it; one line, escaped
            line["exception"] = record.exc_text or self.formatException(record.exc_info)
        text = json.dumps(line, ensure_ascii=False, default=str)
        # Only inside strings, so \uXXXX keeps the JSON valid and the value unchanged.
        return JSON_UNESCAPED.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def configure_logging(level: str, log_format: str = "text", secrets: Iterable[str] = ()) -> None:
    """Every logger writes to stderr at LOG_LEVEL: `<time> <LEVEL> <logger> <message>`, or with
    LOG_FORMAT=json one JSON object a line; never a password, nor any of ``secrets``."""
    stderr = logging.StreamHandler()
    stderr.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(LOG_FORMAT))
    stderr.addFilter(LibraryDebugDropped())
    stderr.addFilter(SecretsRedacted(secrets))
    logging.basicConfig(level=level.upper(), handlers=[stderr])
    logging.captureWarnings(True)  # a library's warning is a line like any other, not text
    adopt_library_loggers()


def adopt_library_loggers() -> None:
    """The libraries' loggers write through ours: FastMCP installs its own handler when it is
    imported, which recall-server does after configure_logging (a refused start never imports
    it), so this runs again once it is."""
    for name in OWN_HANDLERS:
        logger = logging.getLogger(name)
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)  # LOG_LEVEL, not FASTMCP_LOG_LEVEL, decides


class Refusals:
    """Why requests are refused, at INFO: each reason (a field and a rule, or a fixed text,
    never a value) at most once every REFUSAL_INTERVAL seconds, with how many refusals of that
    reason were left out since its last line."""

    def __init__(self, logger: logging.Logger, interval: float = REFUSAL_INTERVAL) -> None:
        self._logger = logger
        self._interval = interval
        self._seen: dict[str, tuple[float, int]] = {}  # reason -> (when last written, left out)

    def note(self, reason: str) -> None:
        now = time.monotonic()
        written, left_out = self._seen.get(reason, (float("-inf"), 0))
        if now - written < self._interval:
            self._seen[reason] = (written, left_out + 1)
            return
        if len(self._seen) >= REFUSAL_REASONS_KEPT:
            self._seen.clear()
        self._seen[reason] = (now, 0)
        more = f" ({left_out} more since its last line)" if left_out else ""
        self._logger.info("%s%s", reason, more)
