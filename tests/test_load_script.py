"""benchmark/load.py stays bounded and runnable: loopback only, and a short phase against its own
server prints its figures and stops by itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmark.load import is_loopback_url, parse_args, server_side_shares
from devtools.testing import ROOT


@pytest.mark.parametrize(
    "url", ["http://10.0.0.8:8000", "http://example.com", "http://0.0.0.0:8000", "http://[::]:80"]
)
def test_a_url_that_is_not_loopback_is_refused(url: str) -> None:
    # given a target off this machine; when the script is asked to load it; then it refuses
    assert not is_loopback_url(url)
    with pytest.raises(SystemExit) as refused:
        parse_args(["--url", url, "--ingest-key", "k" * 32, "--tokens", "tokens.json"])
    assert refused.value.code == 2


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:8"])
def test_a_loopback_url_is_accepted(url: str) -> None:
    assert is_loopback_url(url)


@pytest.mark.parametrize("client", ["raw", "httpx"])
def test_a_short_ingest_phase_prints_its_figures_and_stops(client: str) -> None:
    # given the script with its own server; when it runs a two-second ingest phase
    command = [sys.executable, "-m", "benchmark.load", "--phase", "ingest", "--duration", "2"]
    command += ["--concurrency", "2", "--ingest-users", "2", "--sample-every", "1"]
    command += ["--client", client]
    finished = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # then it stopped by itself, every post was accepted, and the figures are there
    assert finished.returncode == 0, finished.stderr[-2000:]
    out = finished.stdout
    assert "ingest POST /turns:" in out and "answers {'202':" in out, out
    assert "errors none" in out and f"({client})" in out
    assert "5xx responses: 0" in out
    assert "server RSS MB:" in out and "load average" in out
    # and the server's own clock (its /metrics) counted the same posts
    assert "the same posts by the server's own clock (/metrics):" in out and "within 50 ms" in out


def test_server_side_shares_count_only_the_posts_between_the_two_snapshots() -> None:
    # given the server's cumulative 202 buckets before a phase (10 earlier posts, all fast) and
    # after it (100 more: 80 within 10 ms, 95 within 50 ms)
    inf = float("inf")
    before = {0.01: 10.0, 0.05: 10.0, inf: 10.0}
    after = {0.01: 90.0, 0.05: 105.0, inf: 110.0}
    # when the shares are taken; then they are the phase's own, not the server's lifetime's
    assert server_side_shares(before, after) == {"10": 0.8, "50": 0.95}
    # and a server without /metrics, or no post in between, gives none
    assert server_side_shares(None, after) is None
    assert server_side_shares(after, after) is None
