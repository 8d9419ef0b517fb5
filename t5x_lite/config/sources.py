"""Every gin binding of a run, in the order gin applies it, with the file and line that set it.

gin itself keeps only the final value of each binding. To say where a value came from (and what
it overrode) the same files are read again with gin's own parser: each file's statements in
order, an `include` read in place where it stands, then the `--gin.KEY=VALUE` flags.
"""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import gin
from gin import config_parser

from t5x_lite.config.parsing import ConfigError, builtin_gin_dir

MAX_INCLUDE_DEPTH = 20


@dataclasses.dataclass(frozen=True)
class Binding:
    """One `[scope/]selector.param = value` (or `MACRO = value`) statement and where it stands.

    Attributes:
      scope: the binding's scope ('' for none), e.g. 'train' in `train/DataConfig.split`.
      selector: the configurable's name as written, or the macro's name for a macro.
      param: the parameter name; '' for a macro.
      value: the parsed value; references to configurables and macros stay gin references.
      source: 'FILE:LINE' for a file, or the command-line flag that set it.
      text: the statement as written (first line of it for a multi-line value).
      configurable: gin's full selector of the configurable (for matching calls); '' for a macro.
    """

    scope: str
    selector: str
    param: str
    value: Any
    source: str
    text: str
    configurable: str = ""

    @property
    def is_macro(self) -> bool:
        return not self.param

    @property
    def key(self) -> str:
        """The binding as written on the left of `=`, e.g. 'train/DataConfig.split' or 'MODEL'."""
        name = f"{self.selector}.{self.param}" if self.param else self.selector
        return f"{self.scope}/{name}" if self.scope else name


def search_paths(extra: Sequence[str] = ()) -> list[str]:
    """Where gin files are looked up, in order (the same order config.parse gives gin)."""
    return [*extra, os.getcwd(), str(builtin_gin_dir())]


def find_gin_file(name: str, paths: Sequence[str]) -> Path:
    """The file gin reads for `name` (an absolute path, or the first search path that has it)."""
    candidates = [Path(name)] if os.path.isabs(name) else [Path(p) / name for p in paths]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"Gin file {name!r} not found in: {', '.join(paths)}.")


def display_path(path: Path) -> str:
    """A path relative to the current directory when it lies under it (shorter, still exact)."""
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)


def read_bindings(*, gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
                  gin_search_paths: Sequence[str] = (), skip_unknown: bool = False) -> list[Binding]:
    """All bindings of the files (includes in place) and then the flags, in application order.

    The configurables must be registered (config.register_configurables) for references to
    parse; config.parse, run first, has already reported any syntax error with its location.
    skip_unknown: keep bindings of unregistered configurables (as config.parse skips them).
    """
    paths = search_paths(gin_search_paths)
    delegate = gin.config.ParserDelegate(skip_unknown=skip_unknown)
    found: list[Binding] = []
    for name in gin_files:
        found.extend(_file_bindings(find_gin_file(name, paths), paths, delegate, depth=0))
    for flag in gin_bindings:
        found.extend(_statements(flag, delegate, source=f"--gin.{_flag_text(flag)}"))
    return found


def _flag_text(binding: str) -> str:
    key, _, value = binding.partition("=")
    return f"{key.strip()}={value.strip()}"


def _file_bindings(path: Path, paths: Sequence[str], delegate, *, depth: int) -> Iterator[Binding]:
    if depth > MAX_INCLUDE_DEPTH:
        raise ConfigError(f"{path}: includes nest deeper than {MAX_INCLUDE_DEPTH} levels (an include cycle?).")
    shown = display_path(path)
    for statement in _parse(path.read_text(encoding="utf-8-sig"), delegate, filename=str(path)):
        if isinstance(statement, config_parser.IncludeStatement):
            yield from _file_bindings(find_gin_file(statement.filename, paths), paths, delegate, depth=depth + 1)
        elif isinstance(statement, config_parser.BindingStatement):
            yield _binding(statement, source=f"{shown}:{statement.location.line_num}")


def _statements(text: str, delegate, *, source: str) -> Iterator[Binding]:
    for statement in _parse(text, delegate, filename=None):
        if isinstance(statement, config_parser.BindingStatement):
            yield _binding(statement, source=source)


def _parse(text: str, delegate, *, filename: str | None):
    stream = io.StringIO(text)
    stream.name = filename  # gin's parser takes the file name for its locations from here
    return config_parser.ConfigParser(stream, delegate)


def _binding(statement: config_parser.BindingStatement, *, source: str) -> Binding:
    configurable = ""
    if statement.arg_name:  # a parameter binding: the configurable's full selector, as gin matches calls
        match = gin.config._REGISTRY.get_match(statement.selector)  # noqa: SLF001 - gin's own name lookup
        configurable = match.selector if match else statement.selector
    return Binding(scope=statement.scope, selector=statement.selector, param=statement.arg_name,
                   value=statement.value, source=source, text=statement.location.line_content.strip(),
                   configurable=configurable)
