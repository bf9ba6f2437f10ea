"""One log format for every line: ours, FastMCP's and uvicorn's."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Loggers that libraries give their own handlers: FastMCP a Rich console at import, that
# wraps and pads lines and ignores LOG_LEVEL; uvicorn its own formatter (serve() asks it not to
# install one, this is for whatever else does). Their records go to the root handler instead.
OWN_HANDLERS = ("fastmcp", "uvicorn", "uvicorn.error", "uvicorn.access")


def configure_logging(level: str) -> None:
    """Every logger writes `<time> <LEVEL> <logger> <message>` to stderr, at LOG_LEVEL."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    for name in OWN_HANDLERS:
        logger = logging.getLogger(name)
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)  # LOG_LEVEL, not FASTMCP_LOG_LEVEL, decides
