"""Gin configuration: T5X-style flags, search paths, and the registry of configurables.

Flags (same as t5x): `--gin_file=FILE` (repeatable, applied in order), `--gin.KEY=VALUE`
(a binding, applied after all files), `--gin_search_paths=DIR[,DIR...]`. Files are looked up
in the search paths, then the current directory, then the project's own gin/ folder, which
is found both in a checkout and in an installed package.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import re
from pathlib import Path
from typing import Sequence

import gin
from gin import resource_reader

from t5x_lite.config import registry
from t5x_lite.errors import UserError


class ConfigError(UserError, ValueError):
    """A gin file or binding is invalid; the message names the file, line or binding."""


def builtin_gin_dir() -> Path:
    """gin/ of a checkout, or the copy shipped inside the installed package."""
    here = Path(__file__).resolve().parents[1]  # the t5x_lite package
    for candidate in (here.parent / "gin", here / "gin_configs"):
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"The gin/ folder was not found beside {here}; reinstall t5x_lite.")


def split_gin_flags(argv: Sequence[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """Splits argv into (gin files, gin bindings, search paths, remaining args)."""
    files, bindings, paths, rest = [], [], [], []
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        if key in ("--gin_file", "--gin_search_paths") and not eq:
            if not args:
                raise ConfigError(f"{key} needs a value.")
            value = args.pop(0)
        if key == "--gin_file":
            files.append(value)
        elif key == "--gin_search_paths":
            paths.extend(p for p in value.split(",") if p)
        elif key.startswith("--gin.") and eq:
            bindings.append(f"{key[len('--gin.'):]} = {value}")
        else:
            rest.append(arg)
    return files, bindings, paths, rest


def parse(*, gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
          gin_search_paths: Sequence[str] = (), skip_unknown: bool = False) -> None:
    """Parses gin files then bindings into gin's global config (cleared first).

    skip_unknown: skip bindings of configurables that are not registered (reading a run's saved
    config.gin, which also binds t5's and seqio's configurables, without importing them).
    """
    registry.register_configurables()
    _drop_package_path_reader()
    gin.clear_config()
    # gin keeps search paths across parses; start from its initial [''] so an earlier parse's
    # working directory or --gin_search_paths cannot shadow this one's.
    gin.config._LOCATION_PREFIXES[:] = [""]  # noqa: SLF001 - gin has no API to reset them
    for path in [*gin_search_paths, os.getcwd(), str(builtin_gin_dir())]:
        gin.add_config_file_search_path(path)
    if not gin_files:
        raise ConfigError("No --gin_file given; for example --gin_file=runs/quickstart.gin.")
    try:
        with _quiet_search_misses():
            gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings), finalize_config=False,
                                                skip_unknown=skip_unknown)
    except IOError as e:
        raise ConfigError(f"{e}\nGin files are searched in: {', '.join(gin_search_paths) or '(no --gin_search_paths)'}, "
                          f"the current directory, and {builtin_gin_dir()}.") from None
    except (ValueError, SyntaxError) as e:
        raise ConfigError(_with_suggestion(str(e))) from None


def _drop_package_path_reader() -> None:
    """Stops gin from reading 'pkg/file.gin' as a file inside Python package `pkg`.

    That reader crashes when the current directory holds a plain folder of the same name (a
    namespace package, such as a `runs/` model directory next to `runs/quickstart.gin`), and
    t5x_lite finds its files through search paths instead.
    """

    gin.config._FILE_READERS[:] = [  # noqa: SLF001 - gin has no API to unregister a reader
        (reader, exists) for reader, exists in gin.config._FILE_READERS  # noqa: SLF001
        if exists is not resource_reader.system_path_file_exists
    ]


@contextlib.contextmanager
def _quiet_search_misses():
    """Hides gin's 'Path not found' log line for each search path that lacks a file."""
    def drop_misses(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Path not found")

    root = logging.getLogger()
    root.addFilter(drop_misses)
    try:
        yield
    finally:
        root.removeFilter(drop_misses)


def _with_suggestion(message: str) -> str:
    """Adds 'did you mean' for an unknown configurable or parameter named in a gin error."""
    configurables = registry.own_configurables()
    unknown = re.search(r"No configurable matching (?:reference '@(?:[\w.]+/)*|')([\w.]+)", message)
    if unknown:
        close = difflib.get_close_matches(unknown.group(1), list(configurables), n=3)
        hint = f"Did you mean {', '.join(close)}? " if close else ""
        return f"{message}\n{hint}Configurables: {', '.join(sorted(configurables))}."
    bad_param = re.search(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'", message)
    if bad_param and bad_param.group(1).split(".")[-1] in configurables:
        name = bad_param.group(1).split(".")[-1]
        params = registry.params_of(configurables[name])
        close = difflib.get_close_matches(bad_param.group(2), params, n=3)
        hint = f"Did you mean {', '.join(close)}? " if close else ""
        return f"{message}\n{hint}Parameters of {name}: {', '.join(params)}."
    return message


