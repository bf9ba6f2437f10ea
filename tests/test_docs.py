"""The docs stay true: README's test command is what CI runs, the settings table is complete."""

from __future__ import annotations

import re
from pathlib import Path

from recall.settings import Settings, settings_markdown_table

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    return re.findall(r"```sh\n(python3 -m venv .+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    run_command, test_command = readme_commands()
    assert test_command in ci_lines
    assert "pytest" in test_command and "recall-server" in run_command


def test_readme_documents_every_setting() -> None:
    readme = (ROOT / "docs" / "settings.md").read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in readme]
    assert missing == []


def test_readme_settings_table_is_the_one_generated_from_the_settings_model() -> None:
    # the table --help also prints from: a setting added, renamed or re-described shows here
    readme = (ROOT / "docs" / "settings.md").read_text()
    expected = settings_markdown_table()
    assert expected in readme, f"replace docs/settings.md's settings table with:\n{expected}"
