"""Macros a run may leave unset, and two names for one macro (t5x's and this project's).

Mesh files are composed with run files in any order, so a run file cannot give MESH_AXES a
default (a later `MESH_AXES = None` would undo a mesh file read before it); nor can a model
file give DROPOUT_RATE one (it would undo a run file's, as t5x's run files set it). Instead a macro in
`DEFAULTS` that the run uses and nothing sets takes its default here, and `config explain`
names it as set by "default (...)" with the reason.

Run files also accept t5x's names by aliasing, e.g. `MODEL_DIR = %CHECKPOINT_PATH` in
runs/eval.gin. `check_aliases` refuses a run that sets both names to different values, which
gin would otherwise settle silently in favour of whichever name the run file reads.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import gin

from t5x_lite.config.parsing import MACRO_DEFAULTS, ConfigError
from t5x_lite.config.sources import Binding

# name: (gin value, a Python literal; why it is the default). `parsing.parse` binds them before
# any file, so that gin itself has them wherever a file reads one that nothing sets.
DEFAULTS = MACRO_DEFAULTS

def bind_unset_defaults(bindings: Sequence[Binding], macros_used: Callable[[object], list[str]]) -> list[Binding]:
    """Binds each macro of DEFAULTS that `bindings` read but never set, in gin too; returns those bindings."""
    defined = {b.key for b in bindings if b.is_macro}
    used = {name for b in _effective(bindings) for name in macros_used(b.value)}
    added = []
    for name, (text, why) in DEFAULTS.items():
        if name in used and name not in defined:
            gin.parse_config(f"{name} = {text}")
            added.append(Binding(scope="", selector=name, param="", value=ast.literal_eval(text),
                                 source=f"default ({why})", text=f"{name} = {text}"))
    return added


def _effective(bindings: Iterable[Binding]) -> list[Binding]:
    """The last binding of each key: the ones gin will use."""
    return list({b.key: b for b in bindings}.values())


def _file_of(binding: Binding) -> str | None:
    """The file a binding stands in ('FILE:LINE' source), or None for a flag or a default."""
    if binding.source.startswith(("--gin.", "default")):
        return None
    return str(Path(binding.source.rsplit(":", 1)[0]).resolve())


def check_aliases(bindings: Sequence[Binding], macros_used: Callable[[object], list[str]]) -> None:
    """A ConfigError when a macro and the alias a run file gave it (`A = %B`) are both set, differently.

    B counts as set when a binding outside the aliasing file sets it (a flag or another file);
    A when its last binding is not the alias itself.
    """
    final: Mapping[str, Binding] = {b.key: b for b in bindings if b.is_macro}
    problems = []
    for alias in (b for b in bindings if b.is_macro):
        names = macros_used(alias.value)
        if len(names) != 1 or not isinstance(alias.value, gin.config.ConfigurableReference):
            continue
        ours, theirs = alias.key, names[0]
        mine, other = final.get(ours), final.get(theirs)
        if mine is None or other is None or mine is alias or _file_of(other) == _file_of(alias):
            continue
        if mine.value != other.value:
            problems.append(f"{ours}={mine.value!r} (at {mine.source}) and {theirs}={other.value!r} (at {other.source}) "
                            f"name the same setting ({alias.source}: {alias.text}); set only one of them.")
    if problems:
        raise ConfigError("\n".join(dict.fromkeys(problems)))
