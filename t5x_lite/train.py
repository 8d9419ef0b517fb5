"""`python -m t5x_lite.train --gin_file=... --gin.KEY=VALUE`: run the gin-configured train loop.

Exit codes: 0 success, 2 a configuration or input problem (the message names the fix),
75 stopped on SIGTERM or a preemption notice after saving a checkpoint (run again to resume).
"""

from __future__ import annotations

import sys
from typing import Sequence

from t5x_lite import errors
from t5x_lite.config import entry as gin_entry
from t5x_lite.training.preemption import EXIT_PREEMPTED, Preempted

USAGE = """usage: t5x-lite train --gin_file=FILE [--gin_file=FILE ...] [--gin.KEY=VALUE ...]
                      [--gin_search_paths=DIR[,DIR...]]

Runs the train loop configured by the gin files, e.g.
  t5x-lite train --gin_file=runs/quickstart.gin --gin.TRAIN_STEPS=100 --gin.MODEL_DIR="'/tmp/run'"
"""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return gin_entry.run(argv, usage=USAGE, configurable="train")
    except Preempted as e:
        print(errors.without_gin_call_note(str(e)), file=sys.stderr)
        return EXIT_PREEMPTED


if __name__ == "__main__":
    sys.exit(main())
