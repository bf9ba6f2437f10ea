"""The export formats, by the name `--format` and the page give them (docs/import.md)."""

from __future__ import annotations

from recall.importing.formats.base import Format
from recall.importing.formats.chatgpt import CHATGPT
from recall.importing.formats.claude import CLAUDE
from recall.importing.formats.claude_code import CLAUDE_CODE
from recall.importing.formats.codex import CODEX
from recall.importing.formats.open_webui import OPEN_WEBUI

FORMATS: dict[str, Format] = {f.name: f for f in (CHATGPT, CLAUDE, CLAUDE_CODE, CODEX, OPEN_WEBUI)}
