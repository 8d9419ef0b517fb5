"""`t5x-lite config show | explain | diff | reference`: what a gin config resolves to and why.

    t5x-lite config show --gin_file=F [--gin.K=V ...]       every parameter of every call, resolved
    t5x-lite config explain --gin_file=F ... [NAME ...]    the file:line (or flag) behind each value
    t5x-lite config diff A B                                two configs (gin files or model dirs)
    t5x-lite config reference [--out=FILE] [--check]        the generated configurables reference
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Sequence

from t5x_lite import errors, host_memory
from t5x_lite.config import parsing
from t5x_lite.config import reference as config_reference
from t5x_lite.config import resolve as config_resolve
from t5x_lite.config import t5x_macros
from t5x_lite.config.parsing import builtin_gin_dir
from t5x_lite.config.resolve import format_value

USAGE = __doc__.split("\n\n", 1)[1].rstrip()
INDENT = "    "


def load_dir_or_file(path: str, *, entry: str | None = None):
    """A model directory (its config.gin, as the run wrote it) or a gin file, resolved.

    Bindings of configurables that are not registered here (t5's preprocessors, say, which a
    run's config.gin also records) are kept as 'not checked' instead of failing the parse.
    """

    if os.path.isdir(path):
        path = os.path.join(path, "config.gin")
        if not os.path.isfile(path):
            raise parsing.ConfigError(f"{os.path.dirname(path)} holds no config.gin; give a model directory "
                                     "(a training run writes config.gin there) or a .gin file.")
    return config_resolve.load_run(gin_files=[path], entry=entry, skip_unknown=True)


# ----------------------------------------------------------------------------- show


def show_text(resolved) -> str:
    """Gin text, one block per call in the order the run makes them; defaults marked."""

    blocks = []
    for call, params in resolved.calls:
        lines = [f"# {call.label}" + ("   (entry point)" if not call.scope and call.name == resolved.entry else "")]
        for p in params:
            line = f"{call.label}.{p.name} = {format_value(p.value)}"
            lines.append(f"{line}  # default" if p.setting is None else line)
        blocks.append("\n".join(lines))
    if resolved.not_checked:
        blocks.append("\n".join(["# Bound for configurables that library code calls (not followed from the entry point):",
                                 *(f"{s.key} = {format_value(s.binding.value)}" for s in resolved.not_checked)]))
    return "\n\n".join(blocks) + "\n"


# ----------------------------------------------------------------------------- explain


def explain_text(resolved, *, names: Sequence[str] = (), include_defaults: bool = False) -> str:
    """Each bound value, the binding that set it and every binding it overrode (in the order applied)."""

    wanted = [n.lower() for n in names]
    lines = []
    for call, params in resolved.calls:
        for p in params:
            label = f"{call.label}.{p.name}"
            if wanted and not any(w in label.lower() or _mentions_macro(p, resolved, w) for w in wanted):
                continue
            if p.setting is None:
                if include_defaults:
                    lines.append(f"{label} = {format_value(p.value)}\n{INDENT}default of {call.configurable}")
                continue
            lines.append(f"{label} = {format_value(p.value)}")
            lines.extend(_setting_lines(p.setting, resolved, depth=1))
            for shadowed in p.shadowed:
                lines.append(f"{INDENT}wins over {_where(shadowed.binding)}  (a less specific scope)")
    return "\n".join(lines) + ("\n" if lines else "")


def _setting_lines(setting, resolved, *, depth: int, seen: frozenset = frozenset()) -> list[str]:
    """'set by' and 'overrode' lines of a setting, then the same for each macro its value uses."""

    pad = INDENT * depth
    binding = setting.binding
    lines = [f"{pad}set by   {_where(binding)}"]
    lines += [f"{pad}overrode {_where(old)}" for old in setting.overridden]
    for name in config_resolve.macros_used(binding.value):
        macro = resolved.macro(name)
        if macro is None or name in seen:
            continue
        value = config_resolve.substitute_macros(macro.binding.value, resolved)
        lines.append(f"{pad}%{name} = {config_resolve.format_value(value)}")
        lines += _setting_lines(macro, resolved, depth=depth + 1, seen=seen | {name})
    return lines


def _where(binding) -> str:
    """'FILE:LINE  statement', or just the flag for a command-line binding."""
    return binding.source if binding.source.startswith("--gin.") else f"{binding.source}  {binding.text}"


def _mentions_macro(param, resolved, wanted: str) -> bool:

    if param.setting is None:
        return False
    return any(wanted in name.lower() for name in config_resolve.macros_used(param.setting.binding.value))


# ----------------------------------------------------------------------------- unused


def unused_warnings(resolved) -> list[str]:
    """One line per binding that the run never uses, with a hint at what was meant.

    Bindings from t5x_lite's own gin/ files are left out: those are defaults for parts that a
    run switches on (PerplexityEval's settings in runs/eval.gin, say), not typos; so are t5x
    macros set to what this project does anyway (t5x_macros.py).
    """

    builtin = str(builtin_gin_dir().resolve())
    lines = []
    for setting in resolved.unused:
        binding = setting.binding
        path = binding.source.rsplit(":", 1)[0]
        if not binding.source.startswith("--gin.") and os.path.abspath(path).startswith(builtin):
            continue
        if t5x_macros.accepted_unused(binding):  # t5x's USE_HARDWARE_RNG = False: what is done here anyway
            continue
        lines.append(f"{binding.key} ({binding.source}): {_hint(binding, resolved)}")
    return lines


def _hint(binding, resolved) -> str:
    if binding.is_macro:
        t5x_hint = t5x_macros.unused_hint(binding.key, resolved.entry)
        if t5x_hint:
            return t5x_hint
        unused = {id(s) for s in resolved.unused}
        used_macros = [key[1] for key, s in resolved.settings.items() if key[0] == "macro" and id(s) not in unused]
        close = difflib.get_close_matches(binding.key, used_macros, n=2)
        return "no binding uses this macro" + (f"; did you mean {' or '.join(close)}?" if close else ".")
    scopes = [call.label for call, _ in resolved.calls if call.configurable == binding.configurable]
    if scopes:
        return f"{binding.selector} is called as {', '.join(scopes)}, never in scope {binding.scope!r}."
    return f"this {resolved.entry} run never calls {binding.selector}."


def print_unused_warnings(resolved, *, stream=None) -> None:
    lines = unused_warnings(resolved)
    if lines:
        stream = stream or sys.stderr
        print(f"warning: {len(lines)} binding(s) set but never used by this {resolved.entry} run "
              "(a typo, or a scope that no call uses):", file=stream)
        for line in lines:
            print(f"{INDENT}{line}", file=stream)


# ----------------------------------------------------------------------------- diff


def diff_lines(a, b) -> list[str]:
    """'name: A -> B' for each value that differs; values only one side sets are shown as <unset>."""
    values_a, values_b = _comparable(a), _comparable(b)
    lines = []
    for name in sorted(set(values_a) | set(values_b)):
        va, vb = values_a.get(name, "<unset>"), values_b.get(name, "<unset>")
        if va != vb:
            lines.append(f"{name}: {va} -> {vb}")
    return lines


def _comparable(resolved) -> dict[str, str]:
    values = resolved.values()
    values.update({s.key: format_value(s.binding.value) for s in resolved.not_checked})
    return values


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage:\n{USAGE}")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    with errors.reported():
        if command in ("show", "explain"):
            return _show_or_explain(command, rest)
        if command == "diff":
            return _diff(rest)
        if command == "reference":
            return config_reference.main(rest)
    print(f"error: unknown config command {command!r}\nusage:\n{USAGE}", file=sys.stderr)
    return 2


def _show_or_explain(command: str, argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"t5x-lite config {command}", add_help=True)
    parser.add_argument("--entry", help="the run's entry point (train, evaluate, infer); default: the one bound")
    if command == "explain":
        parser.add_argument("names", nargs="*", help="only values whose name (or macro) contains one of these")
        parser.add_argument("--defaults", action="store_true", help="also list parameters left at their default")

    files, bindings, paths, rest = parsing.split_gin_flags(argv)
    own = parser.parse_args(rest)
    resolved = config_resolve.load_run(gin_files=files, gin_bindings=bindings, gin_search_paths=paths,
                                       entry=own.entry)
    if command == "show":
        print(show_text(resolved), end="")
    else:
        print(explain_text(resolved, names=own.names, include_defaults=own.defaults), end="")
    print_unused_warnings(resolved)
    return 0


def _diff(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="t5x-lite config diff",
                                     description="Value by value: exit 0 when equal, 1 when they differ.")
    parser.add_argument("a", help="a model directory (its config.gin) or a .gin file")
    parser.add_argument("b", help="a model directory (its config.gin) or a .gin file")
    parser.add_argument("--entry", help="the runs' entry point (train, evaluate, infer); default: the one bound")
    args = parser.parse_args(argv)
    lines = diff_lines(load_dir_or_file(args.a, entry=args.entry), load_dir_or_file(args.b, entry=args.entry))
    print("\n".join(lines) if lines else "no differences")
    return 1 if lines else 0


if __name__ == "__main__":
    host_memory.run_program(main)
