"""OpenBLAS runs one thread per call in the server (recall/__init__.py): the dense leg's product
is memory-bound, and OpenBLAS's own threads spun on the cores the recall threads needed (under
load, 16 MCP callers got half the throughput; benchmark/README.md, "Load")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from devtools.testing import ROOT

# In a fresh interpreter: the server's module, then the number of threads OpenBLAS will use.
OPENBLAS_THREADS = """
import ctypes, sys
import recall_server  # the server's import path: whatever it sets, it sets before numpy loads
import numpy
numpy.ones((64, 64)) @ numpy.ones(64)  # OpenBLAS loaded and initialised
names = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
         "openblas_get_num_threads")
for line in open("/proc/self/maps"):
    path = line.split()[-1]
    if "openblas" in path.lower():
        lib = ctypes.CDLL(path)
        for name in names:
            if hasattr(lib, name):
                print(getattr(lib, name)())
                sys.exit(0)
print("unknown")
"""


def openblas_threads(**env: str) -> int:
    child_env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | env
    result = subprocess.run(
        [sys.executable, "-c", OPENBLAS_THREADS],
        env=child_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    answer = result.stdout.strip()
    if answer == "unknown":
        pytest.skip("numpy's BLAS here is not an OpenBLAS we can ask")
    return int(answer)


def test_openblas_runs_one_thread_per_call_in_the_server() -> None:
    # given no OPENBLAS_NUM_THREADS in the environment (OpenBLAS would take one per core)
    # when the server's module is imported and numpy loads OpenBLAS
    # then OpenBLAS runs one thread
    assert openblas_threads() == 1


def test_an_operators_own_openblas_setting_wins() -> None:
    # given an operator who asks for two threads (capped by OpenBLAS at the cores there are)
    wanted = min(2, os.cpu_count() or 1)
    # when the server's module is imported, then that setting holds
    assert openblas_threads(OPENBLAS_NUM_THREADS=str(wanted)) == wanted
