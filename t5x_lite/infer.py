"""`python -m t5x_lite.infer --gin_file=runs/infer.gin ...`: prompts -> a jsonl file of outputs.

Resumable: run the same command again after an interruption and it continues with the chunks
not yet written. Exit codes: 0 success, 2 a configuration or input problem.
"""

from __future__ import annotations

from typing import Sequence

from t5x_lite import host_memory
from t5x_lite.config import entry as gin_entry

USAGE = """usage: t5x-lite infer --gin_file=FILE [--gin_file=FILE ...] [--gin.KEY=VALUE ...]
                      [--gin_search_paths=DIR[,DIR...]]

Generates an output for every prompt of a jsonl file (or of a task's split) with the latest
checkpoint of MODEL_DIR, e.g.
  t5x-lite infer --gin_file=runs/infer.gin --gin.MODEL_DIR="'runs/quickstart'" \\
      --gin.PROMPTS="'prompts.jsonl'" --gin.OUTPUT="'outputs.jsonl'"
See docs/infer.md.
"""


def main(argv: Sequence[str] | None = None) -> int:
    return gin_entry.run(argv, usage=USAGE, configurable="infer")


if __name__ == "__main__":
    host_memory.run_program(main)
