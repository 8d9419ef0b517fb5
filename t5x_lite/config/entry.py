"""The shared body of the gin-configured entry points (train, eval, infer)."""

from __future__ import annotations

import sys
from typing import Sequence

import gin

from t5x_lite import errors
from t5x_lite.config import command as config_command
from t5x_lite.config import parsing
from t5x_lite.config import resolve as config_resolve
from t5x_lite.data import task_access
from t5x_lite.parallel import distributed

CACHE_DIRS_FLAG = "--seqio_additional_cache_dirs"
CACHE_DIRS_HELP = f"""seqio flag (t5x's):
  {CACHE_DIRS_FLAG}=DIR[,DIR...]  more directories to search for seqio tasks' offline caches
                                        (`t5x-lite cache --output_cache_dir`; docs/from_t5x.md)"""


def run(argv: Sequence[str] | None, *, usage: str, configurable: str) -> int:
    """Prints `usage` for -h/--help; else parses the gin flags and calls the configurable named `configurable`.

    `--seqio_additional_cache_dirs=DIR[,DIR...]` (t5x's flag) adds directories where seqio looks
    for tasks' offline caches.

    Bad input (an unknown flag, a gin error, an undefined macro, a configuration or data
    problem) is reported as one `error: ...` line and exit code 2. Bindings that the run never
    uses (a misspelt scope or macro) are warned about on stderr before it starts.

    The config is read first, so that a bad one fails at once; then the process joins the
    run's other processes (distributed.py) before anything touches a device.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(f"{usage}\n{distributed.FLAGS_HELP}\n{CACHE_DIRS_HELP}")
        return 0
    with errors.reported():
        files, bindings, paths, rest = parsing.split_gin_flags(argv)
        distributed_flags, rest = distributed.parse_flags(rest)
        cache_dirs, rest = _cache_dirs(rest)
        if rest:
            raise parsing.ConfigError(f"Unknown arguments {rest}.\n{usage}")
        resolved = config_resolve.load_run(gin_files=files, gin_bindings=bindings, gin_search_paths=paths,
                                           entry=configurable)
        if cache_dirs:
            task_access.add_cache_dirs(cache_dirs)
        distributed.setup(distributed_flags)
        if distributed.is_chief():
            config_command.print_unused_warnings(resolved)

        gin.get_configurable(configurable)()
    return 0


def _cache_dirs(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """The directories of --seqio_additional_cache_dirs=DIR[,DIR...] (repeatable), and the other arguments."""
    dirs, rest, args = [], [], list(args)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name == CACHE_DIRS_FLAG and not eq and args and not args[0].startswith("-"):
            eq, value = "=", args.pop(0)  # absl's `--flag VALUE` form
        if name != CACHE_DIRS_FLAG:
            rest.append(arg)
        elif not eq or not value.strip(","):
            raise parsing.ConfigError(f"{CACHE_DIRS_FLAG} needs a value: {CACHE_DIRS_FLAG}=DIR[,DIR...].")
        else:
            dirs.extend(d for d in value.split(",") if d)
    return dirs, rest
