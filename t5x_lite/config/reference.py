"""docs/config_reference.md, generated from the configurables' signatures and docstrings.

Every gin-configurable parameter must have a line in its docstring's `Args:` (functions) or
`Attributes:` (config dataclasses) section; `--check` fails when one has none or when the file
on disk differs from what this module generates (CI runs it).

    t5x-lite config reference --out=docs/config_reference.md           regenerate
    t5x-lite config reference --out=docs/config_reference.md --check   fail if stale or undocumented
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from typing import Any, Sequence

from t5x_lite import host_memory
from t5x_lite.config import registry

HEADINGS = ("Args:", "Attributes:")
MAX_DEFAULT_CHARS = 60


def configurables() -> dict[str, Any]:
    """Registered name → function or class, for every configurable t5x_lite registers."""

    registry.register_configurables()
    return registry.own_configurables()


def parameters(fn_or_cls: Any) -> dict[str, Any]:
    """Parameter → default (inspect.Parameter.empty when required), in signature order."""
    signature = inspect.signature(fn_or_cls)
    return {name: p.default for name, p in signature.parameters.items()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}


def parameter_docs(docstring: str | None) -> dict[str, str]:
    """Parameter → its description, from a Google-style `Args:` or `Attributes:` section.

    An entry may document several parameters at once: `train_data / eval_data: ...`.
    """
    lines = inspect.cleandoc(docstring or "").splitlines()
    docs: dict[str, str] = {}
    in_section, entry_indent, current = False, None, []
    for line in lines:
        stripped = line.strip()
        if stripped in HEADINGS:
            in_section, entry_indent, current = True, None, []
            continue
        if not in_section:
            continue
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:  # the section ended
            in_section = False
            continue
        entry = re.match(r"^([\w*]+(?:\s*[/,]\s*[\w*]+)*)\s*:\s*(.*)$", stripped)
        if entry and (entry_indent is None or indent == entry_indent):
            entry_indent = indent
            current = [name.strip("* ") for name in re.split(r"[/,]", entry.group(1))]
            for name in current:
                docs[name] = entry.group(2)
        elif current:
            for name in current:
                docs[name] = f"{docs[name]} {stripped}".strip()
    return docs


def summary(fn_or_cls: Any) -> str:
    """The docstring's first paragraph, on one line."""
    doc = inspect.cleandoc(fn_or_cls.__doc__ or "")
    return " ".join(doc.split("\n\n", 1)[0].split())


def missing_docs() -> list[str]:
    """'Configurable.param' for each parameter with no docstring line."""
    missing = []
    for name, target in configurables().items():
        documented = parameter_docs(target.__doc__)
        missing += [f"{name}.{p}" for p in parameters(target) if p not in documented]
    return missing


def _format_default(default: Any) -> str:
    if default is inspect.Parameter.empty:
        return "required"
    text = repr(default)
    if len(text) > MAX_DEFAULT_CHARS:
        text = text[:MAX_DEFAULT_CHARS - 3] + "..."
    return f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The whole reference as markdown."""
    found = configurables()
    sections = {title: [n for n in names if n in found] for title, names in registry.sections().items()}
    listed = {n for names in sections.values() for n in names}
    sections["Other"] = sorted(n for n in found if n not in listed)
    out = ["# Configuration reference", "",
           "Every gin-configurable function and class of t5x_lite: each parameter, its default and what it",
           "does. Bind one with `NAME.PARAMETER = VALUE` in a gin file or `--gin.NAME.PARAMETER=VALUE` on the",
           "command line; `t5x-lite config explain` shows where a run's values came from (see gin.md).", "",
           "Generated from the signatures and docstrings by "
           "`t5x-lite config reference --out=docs/config_reference.md`; do not edit by hand.", ""]
    for title, names in sections.items():
        if not names:
            continue
        out += [f"## {title}", ""]
        for name in names:
            target = found[name]
            docs = parameter_docs(target.__doc__)
            out += [f"### `{name}`", "", f"`{target.__module__}.{target.__qualname__}`: {summary(target)}", ""]
            if not parameters(target):
                out += ["No parameters.", ""]
                continue
            out += ["| parameter | default | description |", "| --- | --- | --- |"]
            for param, default in parameters(target).items():
                out.append(f"| `{param}` | {_cell(_format_default(default))} | {_cell(docs.get(param, ''))} |")
            out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="t5x-lite config reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the reference here (default: print it)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if --out differs from the generated text or a parameter is undocumented")
    args = parser.parse_args(argv)
    missing = missing_docs()
    if missing:
        print(f"error: {len(missing)} gin-configurable parameter(s) have no docstring line "
              f"(add them to the Args:/Attributes: section): {', '.join(missing)}", file=sys.stderr)
        return 1
    text = render()
    if args.check:
        if not args.out:
            parser.error("--check needs --out=FILE to compare against")
        try:
            with open(args.out, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print(f"error: {args.out} is out of date; regenerate it with "
                  f"`t5x-lite config reference --out={args.out}`.", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date.")
        return 0
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    host_memory.run_program(main)
