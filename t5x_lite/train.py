"""`python -m t5x_lite.train --gin_file=... --gin.KEY=VALUE`: run the gin-configured train loop.

Exit codes: 0 success, 2 a configuration or input problem (the message names the fix),
75 stopped on SIGTERM or a preemption notice: after saving a checkpoint, or at once, saving
nothing, when the signal came before the first step (run again to resume or start), 130
stopped by SIGINT (Ctrl-C).
"""

from __future__ import annotations

import sys
from typing import Sequence

from t5x_lite import errors, host_memory
from t5x_lite.training import preemption

USAGE = """usage: t5x-lite train --gin_file=FILE [--gin_file=FILE ...] [--gin.KEY=VALUE ...]
                      [--gin_search_paths=DIR[,DIR...]]

Runs the train loop configured by the gin files, e.g.
  t5x-lite train --gin_file=runs/quickstart.gin --gin.TRAIN_STEPS=100 --gin.MODEL_DIR="'/tmp/run'"
"""


def main(argv: Sequence[str] | None = None) -> int:
    # Signals first: SIGTERM or Ctrl-C while JAX and TensorFlow load, the data pipeline is built
    # or the step compiles ends the run with one line (preemption.py), not a bare exit 143.
    with preemption.StartupSignals():
        try:
            from t5x_lite.config import entry as gin_entry  # gin, JAX: after the handlers are in place

            return gin_entry.run(argv, usage=USAGE, configurable="train")
        except (preemption.Preempted, preemption.StoppedBySignal) as e:
            print(errors.without_gin_call_note(str(e)), file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:  # Ctrl-C once the loop runs (before it: StoppedBySignal)
            print("received SIGINT: stopped without saving; run the same command again to resume from the "
                  "latest checkpoint.", file=sys.stderr)
            return preemption.EXIT_INTERRUPTED


if __name__ == "__main__":
    host_memory.run_program(main)
