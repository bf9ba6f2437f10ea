"""The order in which `pytest -n 4 --dist loadscope` hands modules to its workers.

xdist keeps each module in one worker (the module's shared servers) and sends the modules with
the most tests first. Test count is a poor guide to time here: a module of six tests that start
servers or build an image outlasts one of sixty quick ones, and sent last it runs alone at the
end while the other workers idle. So the modules measured to take longest go first (longest
first, then xdist's own order): the long ones overlap, and the short ones fill in at the end.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from xdist.scheduler import LoadScopeScheduling

# Seconds each module took in one worker (setup, calls and teardown) in a full
# `pytest -n 3 --dist loadscope` on a shared 2-core machine under a load of about 25: several
# times what they take on a quiet one, but only the order matters (test_lifecycle_races.py: its
# tests' share of test_lifecycle.py's time then). A module not listed (under 50 s there) goes
# after these, in xdist's own order; a new module that takes minutes belongs here.
# (Issue 33: modules whose tests or start-up got cheaper scaled by their measured CPU-seconds
# after/before, until the next full run measures them.)
MEASURED_SECONDS = {
    # cold on a fresh CI machine (debootstrap, then pip inside the build): 5.5 min, mostly waiting
    "tests/test_container_image.py": 990,
    "tests/test_fuzz.py": 550,
    "tests/test_command_line.py": 270,
    "tests/test_lifecycle_races.py": 320,
    "tests/test_languages.py": 430,
    "tests/test_monotone.py": 200,  # five histories indexed in-process (430 s alone at load 11)
    "tests/test_lifecycle.py": 390,
    "tests/test_native_engine.py": 370,
    "tests/test_auth.py": 275,
    "tests/test_read_tool.py": 250,
    "tests/test_pg_search.py": 145,
    "tests/test_index_workers.py": 150,
    "tests/test_pg_transfer.py": 120,
    "tests/test_examples.py": 180,
    "tests/test_replicas.py": 170,
    "tests/test_readme_blocks.py": 190,
    "tests/test_crash.py": 140,
    "tests/test_observability.py": 130,
    "tests/test_embedded_server.py": 110,
    "tests/test_memory_page.py": 140,
    "tests/test_demo.py": 190,
    "tests/test_embedded_engine.py": 80,
    "tests/test_tool_contract.py": 135,
    "tests/test_indexing.py": 160,
    "tests/test_benchmark_quality.py": 100,
    "tests/test_funes_engine.py": 120,
    "tests/test_pg_start.py": 70,
    "tests/test_pg_store.py": 110,
    "tests/test_container_files.py": 110,
    "tests/test_audit.py": 95,
    "tests/test_memory_api.py": 100,
    "tests/test_transport.py": 80,
    "tests/test_redaction.py": 90,
    "tests/test_ingest.py": 60,
    "tests/test_locomo_benchmark.py": 30,
    "tests/test_logging.py": 60,
    "tests/test_recalled.py": 45,
    "tests/test_pg_schema.py": 50,
}


def measured_seconds(scope: str) -> float:
    return MEASURED_SECONDS.get(scope.split("::")[0], 0)


class LongestModulesFirst(LoadScopeScheduling):
    """--dist loadscope, with the work queue in the order above (a stable sort: modules not
    listed keep xdist's order among themselves)."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._ordered = False

    def _assign_work_unit(self, node: Any) -> None:
        # schedule() fills the queue, then assigns: the first assignment sees the whole queue
        if not self._ordered:
            self._ordered = True
            order = sorted(self.workqueue, key=lambda scope: -measured_seconds(scope))
            self.workqueue = OrderedDict((scope, self.workqueue[scope]) for scope in order)
        super()._assign_work_unit(node)
