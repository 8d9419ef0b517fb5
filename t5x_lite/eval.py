"""`python -m t5x_lite.eval --gin_file=runs/eval.gin ...`: evaluate a model directory's checkpoints.

Exit codes: 0 success, 2 a configuration or input problem (the message names the fix).
"""

from __future__ import annotations

from typing import Sequence

from t5x_lite import host_memory
from t5x_lite.config import entry as gin_entry

USAGE = """usage: t5x-lite eval --gin_file=FILE [--gin_file=FILE ...] [--gin.KEY=VALUE ...]
                     [--gin_search_paths=DIR[,DIR...]]

Evaluates the latest checkpoint of MODEL_DIR (or evaluate.step, or every checkpoint with
evaluate.every_checkpoint=True) as gin/runs/eval.gin and the given bindings configure, e.g.
  t5x-lite eval --gin_file=runs/eval.gin --gin.MODEL_DIR="'runs/quickstart'" \\
      --gin.evaluate.perplexity="@PerplexityEval()" --gin.PerplexityEval.mixture_or_task_name="'python_stdlib_lm'"
See docs/eval.md.
"""


def main(argv: Sequence[str] | None = None) -> int:
    return gin_entry.run(argv, usage=USAGE, configurable="evaluate")


if __name__ == "__main__":
    host_memory.run_program(main)
