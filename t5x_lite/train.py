"""`python -m t5x_lite.train --gin_file=... --gin.KEY=VALUE`: run the gin-configured train loop.

Exit codes: 0 success, 2 a configuration or input problem (the message names the fix),
75 stopped on SIGTERM or a preemption notice after saving a checkpoint (run again to resume).
"""

from __future__ import annotations

import sys
from typing import Sequence

from t5x_lite import errors

USAGE = """usage: t5x-lite train --gin_file=FILE [--gin_file=FILE ...] [--gin.KEY=VALUE ...]
                      [--gin_search_paths=DIR[,DIR...]]

Runs the train loop configured by the gin files, e.g.
  t5x-lite train --gin_file=runs/quickstart.gin --gin.TRAIN_STEPS=100 --gin.MODEL_DIR="'/tmp/run'"
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    with errors.reported():
        from t5x_lite import config

        files, bindings, paths, rest = config.split_gin_flags(argv)
        if rest:
            raise config.ConfigError(f"Unknown arguments {rest}.\n{USAGE}")
        config.parse(gin_files=files, gin_bindings=bindings, gin_search_paths=paths)
        import gin

        from t5x_lite.preemption import EXIT_PREEMPTED, Preempted

        try:
            gin.get_configurable("train")()
        except Preempted as e:
            print(str(e), file=sys.stderr)
            return EXIT_PREEMPTED
        return 0


if __name__ == "__main__":
    sys.exit(main())
