"""The container image really built and run: tests/container/smoke.sh with podman.

The script builds the embedded target on a local Debian stand-in base, runs it as an operator
would (its root filesystem read-only), seeds the demo and recalls as alice and bob through MCP,
before and after a restart: once as built by default, once built with EXTRAS=multilingual and
run with EMBED_MODEL=multilingual-e5-small.
It needs root, podman and debootstrap (CI installs them via .ci/run); elsewhere this skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

SMOKE = ROOT / "tests" / "container" / "smoke.sh"
# A cold run builds the base with debootstrap and pip-installs the image's dependencies: minutes
# on a loaded 2-core machine. A warm run (both images cached) takes under two.
SMOKE_TIMEOUT = 1800.0
# What each image is built with (the Dockerfile's EXTRAS) and which EMBED_MODEL it runs. The
# second adds about 3 minutes to a cold run (its own pip layer 95 s, its run 75 s), a fifth of the
# whole suite's CPU budget: it runs when RECALL_TEST_IMAGES=all (the static tests in
# test_container_files.py check its wiring in every run).
ALL_IMAGES = os.environ.get("RECALL_TEST_IMAGES") == "all"
IMAGES = {
    "minilm": {},
    "multilingual-e5-small": {"EXTRAS": "multilingual", "EMBED_MODEL": "multilingual-e5-small"},
}
OUTPUT_TAIL = 60  # lines of the script's output shown when it fails


def why_it_cannot_run() -> str | None:
    absent = [tool for tool in ("podman", "debootstrap") if shutil.which(tool) is None]
    if absent:
        return (
            f"podman not installed: no {' or '.join(absent)} on PATH (CI installs it via .ci/run)"
        )
    if os.geteuid() != 0:
        return "podman not usable: the image test needs root (CI runs .ci/run as root)"
    return None


@pytest.mark.parametrize("model", IMAGES)
def test_the_embedded_image_serves_each_user_as_non_root_across_a_restart(model: str) -> None:
    if reason := why_it_cannot_run():
        pytest.skip(reason)
    if IMAGES[model] and not ALL_IMAGES:
        pytest.skip("the multilingual image: RECALL_TEST_IMAGES=all runs it (3 more minutes)")
    # given podman, the project's Python (with fastmcp) for the host-side MCP client, and what
    # the image is built with and runs (none of it inherited from the caller's environment)
    environment = {
        **{k: v for k, v in os.environ.items() if k not in {"EXTRAS", "EMBED_MODEL"}},
        "RECALL_PYTHON": sys.executable,
        **IMAGES[model],
    }
    # when the smoke script builds and runs the image
    try:
        result = subprocess.run(
            ["bash", str(SMOKE)],
            cwd=ROOT,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=SMOKE_TIMEOUT,
        )
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout if isinstance(expired.stdout, str) else ""
        tail = "\n".join(output.splitlines()[-OUTPUT_TAIL:])
        pytest.fail(f"smoke.sh did not finish within {SMOKE_TIMEOUT:g}s:\n{tail}")
    # then it succeeds, and on failure its last lines say which step failed
    tail = "\n".join(result.stdout.splitlines()[-OUTPUT_TAIL:])
    assert result.returncode == 0, f"smoke.sh exited {result.returncode}:\n{tail}"
    assert "smoke: OK:" in result.stdout, tail
