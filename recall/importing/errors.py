"""Why an export is refused as a whole: nothing of it is written."""

from __future__ import annotations


class ImportRefused(Exception):
    """A hostile or unusable export (too large, a zip bomb, a path that climbs out, malformed
    JSON, a cycle, another format than the one named). The message names the file or field and
    the problem, never conversation text; ``status`` is what the page's upload answers."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class TooLarge(ImportRefused):
    def __init__(self, message: str) -> None:
        super().__init__(message, 413)
