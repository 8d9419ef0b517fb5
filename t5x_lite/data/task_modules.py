"""User modules: seqio task registrations (t5x's MIXTURE_OR_TASK_MODULE), and the rule that a
user's own modules are found in the current directory (a gin file's `import` too)."""

from __future__ import annotations

import importlib
import os
import sys

from t5x_lite.errors import RunConfigError


def make_current_directory_importable() -> None:
    """A user's modules (tasks, model families, optimizers, hooks) import from the current directory,
    as with `python -m`, also under the `t5x-lite` console script."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def import_task_module(name: str) -> None:
    """Imports a user's module of seqio task registrations (t5x's MIXTURE_OR_TASK_MODULE)."""
    make_current_directory_importable()
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise RunConfigError(f"Cannot import the task module {name!r} ({e}); make it importable from "
                             "the current directory or PYTHONPATH.") from None
