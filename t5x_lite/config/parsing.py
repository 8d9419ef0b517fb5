"""Gin configuration: T5X-style flags, search paths, and the registry of configurables.

Flags (same as t5x): `--gin_file=FILE` (repeatable, applied in order), `--gin.KEY=VALUE`
(a binding, applied after all files), `--gin_search_paths=DIR[,DIR...]`. Files are looked up
in the search paths, then the current directory, then the project's own gin/ folder, which
is found both in a checkout and in an installed package. A leading UTF-8 byte-order mark (as
some editors save) is skipped; a configurable or parameter that was renamed is reported with
its successor (renames.py).
"""

from __future__ import annotations

import contextlib
import difflib
import io
import logging
import os
import re
import tokenize
from pathlib import Path
from typing import Sequence

import gin
from gin import resource_reader

from t5x_lite.config import registry, renames
from t5x_lite.data import task_modules
from t5x_lite.errors import UserError


BYTE_ORDER_MARK = "\ufeff"


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


# Macros a run may leave unset (macro_defaults.py): name -> (gin value, why it is the default).
MACRO_DEFAULTS: dict[str, tuple[str, str]] = {
    "MESH_AXES": ("None", "no mesh file given: data parallel when the model and its optimizer state fit "
                          "one device, else FSDP; docs/partitioning.md"),
    "LOGICAL_AXIS_RULES": ("None", "no mesh file given: the standard rule table, "
                                   "parallel/partitioning.DEFAULT_RULES"),
    # Read by every gin/models file; a run file or flag may set it before or after the model file.
    "DROPOUT_RATE": ("0.0", "no file or flag sets it: no dropout"),
}


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
    task_modules.make_current_directory_importable()  # a gin file's `import` of the user's own module
    reading: list[str] = []  # the gin file being parsed (innermost include last), while it is
    for name, (value, _) in MACRO_DEFAULTS.items():  # first: any file or flag that sets one wins
        gin.parse_config(f"{name} = {value}")
    try:
        with _quiet_search_misses(), _noting_files(reading):
            gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings), finalize_config=False,
                                                skip_unknown=skip_unknown)
    except IOError as e:
        raise ConfigError(f"{e}\nGin files are searched in: {', '.join(gin_search_paths) or '(no --gin_search_paths)'}, "
                          f"the current directory, and {builtin_gin_dir()}.") from None
    except tokenize.TokenError as e:  # an unclosed bracket or string: gin's tokenizer names no file
        raise ConfigError(_unclosed_message(e, reading[-1] if reading else None, gin_bindings)) from None
    except ImportError as e:  # an `import` statement in a gin file
        raise ConfigError(f"{e}\nA gin file's `import` needs a module Python can import (check its name and "
                          "PYTHONPATH).") from None
    except UnicodeDecodeError as e:
        where = f"{reading[-1]} is not a text file" if reading else "A binding is not text"
        raise ConfigError(f"{where} (UTF-8): {e}.") from None
    except (ValueError, SyntaxError) as e:
        raise ConfigError(_with_suggestion(_with_binding(str(e), None if reading else gin_bindings))) from None


@contextlib.contextmanager
def _noting_files(reading: list[str]):
    """Keeps `reading` naming the gin file gin is parsing (a failed one stays named) while it parses;
    refuses a file that includes itself (gin would recurse until Python's stack runs out)."""
    def noted(reader):
        @contextlib.contextmanager
        def read(path):
            if path in reading:
                cycle = " -> ".join([*reading[reading.index(path):], path])
                raise ConfigError(f"{path} includes itself: {cycle}; remove the `include` that closes the cycle.")
            with reader(path) as f:
                reading.append(path)
                _skip_byte_order_mark(f)
                yield f
                reading.pop()  # only when parsed without an error
        return read

    readers = gin.config._FILE_READERS  # noqa: SLF001 - gin has no API to wrap its readers
    original = list(readers)
    readers[:] = [(noted(reader), exists) for reader, exists in original]
    try:
        yield
    finally:
        readers[:] = original


def _skip_byte_order_mark(f) -> None:
    """Moves text file `f` past a leading UTF-8 byte-order mark, which gin's tokenizer would
    report as an 'Unexpected token' on a line that looks right."""
    with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
        if f.read(1) != BYTE_ORDER_MARK:
            f.seek(0)


def _unclosed_message(error: tokenize.TokenError, path: str | None, bindings: Sequence[str]) -> str:
    """Where a bracket or string opened and never closed, by file and line (or binding)."""
    if path is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = Path(path).read_text(encoding="utf-8-sig")
            line, what = _unclosed(text) or (error.args[1][0], "a bracket or string is never closed")
            return f"Cannot parse {path}, line {line}: {what}; the file ends inside it."
        return f"Cannot parse {path}: {error.args[0]}."
    line, what = _unclosed("\n".join(bindings)) or (error.args[1][0], "a bracket or string is never closed")
    binding = bindings[line - 1] if 0 < line <= len(bindings) else "\n".join(bindings)
    return f"Cannot parse the binding --gin.{binding.replace(' = ', '=', 1)}: {what}."


def _unclosed(text: str) -> tuple[int, str] | None:
    """(line, description) of the bracket or string that `text` never closes, as Python tokenizes it."""
    opened: list[tuple[int, str]] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.OP and token.string in "([{":
                opened.append((token.start[0], token.string))
            elif token.type == tokenize.OP and token.string in ")]}" and opened:
                opened.pop()
    except tokenize.TokenError as e:
        if "string" in e.args[0]:
            return e.args[1][0], "a string opened here is never closed"
        if opened:
            return opened[-1][0], f"'{opened[-1][1]}' opened here is never closed"
        return max(e.args[1][0] - 1, 1), "the statement continues past the end (a trailing backslash?)"
    return None


def _with_binding(message: str, bindings: Sequence[str] | None) -> str:
    """Names the --gin.X=V binding of an error gin locates only by line; says how to write a
    string that lacks its quotes."""
    located = re.search(r"\((?:([^()]*), )?line (\d+)\)", message)
    if bindings and located and not located.group(1) and 0 < int(located.group(2)) <= len(bindings):
        binding = bindings[int(located.group(2)) - 1].replace(" = ", "=", 1)
        message = message.replace(located.group(0), f"(in --gin.{binding})")
    unparsed = re.search(r"Failed to parse token '([^']*)' (\(.*\))", message)
    if not unparsed:
        return message
    token, where = unparsed.groups()
    return (f"Cannot read the value {token!r} {where}: a string needs quotes ('{token}'; on the command line "
            f"--gin.NAME=\"'{token}'\"), a configurable is @name() and a macro %NAME.")


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
    """Adds 'did you mean' for an unknown configurable or parameter named in a gin error; one
    that was renamed is one line naming its successor instead."""
    renamed = renames.renamed_message(message)
    if renamed:
        return renamed
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


