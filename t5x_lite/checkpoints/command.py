"""`t5x-lite checkpoint VERB`: info (what a step holds), verify (each step's state), unlock (a dead
trainer's lease)."""

from __future__ import annotations

import sys
from typing import Sequence

from t5x_lite import host_memory
from t5x_lite.checkpoints import info, lease, verify

VERBS = {"info": (info.main, info.USAGE), "verify": (verify.main, verify.USAGE),
         "unlock": (lease.unlock_main, "t5x-lite checkpoint unlock MODEL_DIR [--force]")}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in VERBS:
        print("usage:\n" + "\n".join(f"  {usage}" for _, usage in VERBS.values()), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    run, _ = VERBS[argv[0]]
    return run(argv[1:])


if __name__ == "__main__":
    host_memory.run_program(main)
