"""Configurables and parameters that were renamed, and what replaced them.

`parsing.py` consults this table when gin reports an unknown configurable or parameter: a config
written for an older t5x_lite then fails with one line naming the successor (and, where the old
parameter moved, its new binding) instead of gin's list of every configurable. Pure data and
string work: imports nothing from the package.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class Renamed:
    """What replaced a configurable.

    Attributes:
      successor: what to write instead, as gin text.
      doc: the page that describes the successor.
      params: each old parameter -> the binding that now holds it ('Configurable.param').
    """

    successor: str
    doc: str
    params: Mapping[str, str] = dataclasses.field(default_factory=dict)


RENAMED_CONFIGURABLES: dict[str, Renamed] = {
    # Split into an optimizer and a learning-rate schedule (Adafactor and the other schedules came with it).
    "OptimizerConfig": Renamed(
        successor="train.optimizer = @AdamW() with AdamW.learning_rate = @WarmupCosine()",
        doc="docs/optimizers.md",
        params={"peak_learning_rate": "WarmupCosine.peak_learning_rate",
                "warmup_steps": "WarmupCosine.warmup_steps",
                "decay_steps": "WarmupCosine.decay_steps",
                "final_learning_rate_fraction": "WarmupCosine.final_learning_rate_fraction",
                "b1": "AdamW.b1", "b2": "AdamW.b2", "eps": "AdamW.eps", "weight_decay": "AdamW.weight_decay",
                "clip_grad_norm": "AdamW.clip_grad_norm"}),
}

# (configurable, old parameter) -> what replaced the parameter.
RENAMED_PARAMETERS: dict[tuple[str, str], Renamed] = {
    ("train", "keep_checkpoints"): Renamed(successor="train.retention = @RetentionPolicy() with "
                                           "RetentionPolicy.keep_last", doc="docs/checkpoints.md"),
}

_UNKNOWN_CONFIGURABLE = re.compile(r"No configurable matching (?:reference '@|')(?:[\w.]+/)*([\w.]+)")
_UNKNOWN_PARAMETER = re.compile(r"Configurable '(?:[\w.]+/)*([\w.]+)' doesn't have a parameter named '(\w+)'")
_IN_FILE = re.compile(r'In file "([^"]+)", line (\d+)\n\s*(.*)')
_IN_BINDING = re.compile(r"In bindings string line \d+\n\s*(.*)")


def renamed_message(gin_message: str) -> str | None:
    """One line naming the successor of the renamed configurable or parameter that `gin_message`
    (gin's "No configurable matching ..." or "... doesn't have a parameter named ...") reports
    unknown; None when the name was never renamed."""
    unknown = _UNKNOWN_CONFIGURABLE.search(gin_message)
    if unknown and unknown.group(1).split(".")[-1] in RENAMED_CONFIGURABLES:
        name = unknown.group(1).split(".")[-1]
        return _configurable_message(name, RENAMED_CONFIGURABLES[name], gin_message)
    bad_param = _UNKNOWN_PARAMETER.search(gin_message)
    if bad_param:
        key = (bad_param.group(1).split(".")[-1], bad_param.group(2))
        if key in RENAMED_PARAMETERS:
            renamed = RENAMED_PARAMETERS[key]
            return f"{key[0]}.{key[1]}{_where(gin_message)} was replaced by {renamed.successor} ({renamed.doc})."
    return None


def _configurable_message(name: str, renamed: Renamed, gin_message: str) -> str:
    line = _line(gin_message)
    param = re.search(rf"\b{name}\.(\w+)\s*=", line or "")
    if param and param.group(1) in renamed.params:  # a binding of one of its parameters
        return (f"{name}.{param.group(1)}{_where(gin_message)} is now {renamed.params[param.group(1)]}: "
                f"{name} was replaced by {renamed.successor} ({renamed.doc}).")
    by_target: dict[str, list[str]] = {}
    for old, new in renamed.params.items():
        by_target.setdefault(new.split(".")[0], []).append(old)
    moved = "; ".join(f"its {', '.join(olds)} are {target}'s" for target, olds in by_target.items())
    return (f"{name}{_where(gin_message)} was replaced by {renamed.successor}"
            + (f"; {moved}" if moved else "") + f" ({renamed.doc}).")


def _line(gin_message: str) -> str | None:
    """The text of the line gin names, if it names one."""
    located = _IN_FILE.search(gin_message) or _IN_BINDING.search(gin_message)
    return located.group(located.lastindex).strip() if located else None


def _where(gin_message: str) -> str:
    """' (in FILE, line N)' or ' (in --gin.BINDING)', as gin locates the error; '' if it does not."""
    in_file = _IN_FILE.search(gin_message)
    if in_file:
        return f" (in {in_file.group(1)}, line {in_file.group(2)})"
    in_binding = _IN_BINDING.search(gin_message)
    if in_binding:
        key, _, value = in_binding.group(1).strip().partition("=")
        return f" (in --gin.{key.strip()}={value.strip()})"
    return ""
