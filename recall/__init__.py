"""recall: the machinery behind recall_server.py.

The write and read paths, one line per module and where new code goes: docs/architecture.md.
"""

import os

# One OpenBLAS thread per call. The embedded engine's dense leg multiplies one query vector by a
# user's matrix: memory-bound work that OpenBLAS's own threads only slow down, spinning on the
# cores the recall threads need (benchmark/README.md, "Load": 11 ms -> 0.3 ms per product on a
# busy 2-core machine). The recall pool is the parallelism. Set before numpy loads OpenBLAS (no
# module of ours imports it before this package); an operator's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
