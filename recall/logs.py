"""One log format for every line: ours, FastMCP's and uvicorn's, as text or as JSON."""

from __future__ import annotations

import json
import logging
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


def user_fields(home: Path, seconds: float | None = None) -> dict[str, object]:
    """`extra=` for a line about a user (as the directory hash) and, if given, a duration."""
    return {"user": home.name} if seconds is None else {"user": home.name, "seconds": seconds}


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
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)  # one line, escaped
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Every logger writes to stderr at LOG_LEVEL: `<time> <LEVEL> <logger> <message>`, or with
    LOG_FORMAT=json one JSON object a line."""
    if log_format == "json":
        stderr = logging.StreamHandler()
        stderr.setFormatter(JsonFormatter())
        logging.basicConfig(level=level.upper(), handlers=[stderr])
        logging.captureWarnings(True)  # a library's warning is a line like any other, not text
    else:
        logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    for name in OWN_HANDLERS:
        logger = logging.getLogger(name)
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)  # LOG_LEVEL, not FASTMCP_LOG_LEVEL, decides
