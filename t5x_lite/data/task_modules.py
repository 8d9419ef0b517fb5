"""User modules of seqio task registrations (t5x's MIXTURE_OR_TASK_MODULE)."""

from __future__ import annotations

import importlib
import os
import sys

from t5x_lite.errors import RunConfigError


def import_task_module(name: str) -> None:
    """Imports a user's module of seqio task registrations (t5x's MIXTURE_OR_TASK_MODULE)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise RunConfigError(f"Cannot import the task module {name!r} ({e}); make it importable from "
                             "the current directory or PYTHONPATH.") from None
