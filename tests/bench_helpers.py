"""Helper for tests that run a benchmark in-process, as `python -m bench NAME ...` would."""

from __future__ import annotations

import contextlib
import io
from typing import Any

from bench.__main__ import BENCHMARKS, parser


def run_bench(*argv: str) -> tuple[Any, str]:
    """(what the benchmark's `run` returned, the report it printed) for `python -m bench ARGV`."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = BENCHMARKS[argv[0]].run(parser().parse_args(list(argv)), "python -m bench " + " ".join(argv))
    return result, out.getvalue()
