"""The order in which `pytest -n 3 --dist loadscope` hands modules to its workers.

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

# Seconds each module took in one worker (setup, calls and teardown), measured with
# `pytest -n 3 --dist loadscope` on a shared 2-core machine: only the order matters, so a
# rough figure will do. A module not listed goes after these, in xdist's own order; a new
# module that takes minutes belongs here.
MEASURED_SECONDS = {
    "tests/test_lifecycle.py": 280,
    "tests/test_memory_api.py": 110,
    "tests/test_embedded_engine.py": 100,
    "tests/test_redaction.py": 90,
    "tests/test_ingest.py": 65,
    "tests/test_fuzz.py": 57,
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
