"""The shared body of the gin-configured entry points (train, eval, infer)."""

from __future__ import annotations

import sys
from typing import Sequence

from t5x_lite import errors


def run(argv: Sequence[str] | None, *, usage: str, configurable: str) -> int:
    """Prints `usage` for -h/--help; else parses the gin flags and calls the configurable named `configurable`.

    Bad input (an unknown flag, a gin error, a configuration or data problem) is reported as
    one `error: ...` line and exit code 2.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(usage)
        return 0
    with errors.reported():
        from t5x_lite import config

        config.parse_command_line(argv, usage=usage)
        import gin

        gin.get_configurable(configurable)()
    return 0
