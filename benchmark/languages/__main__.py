"""All the other-language histories on both stores, one table (issue 24):

    python -m benchmark.languages                          # today's default settings
    python -m benchmark.languages --env EMBED_MODEL=...    # another setting, same histories
    python -m benchmark.languages --engines embedded --sizes 80

``benchmark.run --history de es zh zh_school ja --sizes 80 --engines embedded postgres
--no-save``, with any further options passed through (``--env KEY=VALUE`` into the servers'
environment)."""

from __future__ import annotations

import sys

from benchmark import run
from benchmark.languages import LANGUAGES

SIZE = "80"  # conversations: about as many as one user's few months of chats


def main(argv: list[str]) -> int:
    defaults = ["--history", *LANGUAGES, "--no-save"]
    if "--sizes" not in argv:
        defaults += ["--sizes", SIZE]
    if "--engines" not in argv:
        defaults += ["--engines", "embedded", run.POSTGRES]
    return run.main(defaults + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
