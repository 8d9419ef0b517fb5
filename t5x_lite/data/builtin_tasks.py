"""The project's own seqio task modules (the top-level tasks/ folder), imported under a name of their own.

They are loaded as the package `t5x_lite_tasks`, never as `tasks`: a user's own `tasks`
package (a common name for a folder of task registrations, imported through
MIXTURE_OR_TASK_MODULE) then neither hides them nor is hidden by them. The folder is tasks/
of a checkout, or its copy inside an installed package (t5x_lite/builtin_tasks).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = "t5x_lite_tasks"


def folder() -> Path:
    """tasks/ of a checkout, or the copy shipped inside the installed package."""
    package_dir = Path(__file__).resolve().parents[1]
    for candidate in (package_dir.parent / "tasks", package_dir / "builtin_tasks"):
        if (candidate / "lm.py").is_file():
            return candidate
    raise ImportError(f"The task modules (tasks/) were not found beside {package_dir}; reinstall t5x_lite.")


def load(name: str) -> ModuleType:
    """The task module `name` (lm, text, mixtures, ...), importing its package first if needed."""
    if PACKAGE not in sys.modules:
        path = folder()
        spec = importlib.util.spec_from_file_location(PACKAGE, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{PACKAGE}.{name}")
