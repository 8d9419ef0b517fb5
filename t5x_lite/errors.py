"""The errors that mean "bad input", and how entry points report them: one message, exit 2.

Every error whose message is meant for the user (a traceback would only distract) subclasses
`UserError`; `reported()` catches that base, so a new error type needs no registration. This
module imports nothing from the package: every layer may import it.
"""

from __future__ import annotations

import contextlib
import re
import sys

EXIT_BAD_INPUT = 2


class UserError(Exception):
    """Bad input: a configuration, file or value the user can fix; the message names the fix."""


class ConfigValueError(UserError, ValueError):
    """A configured value is invalid (an unknown choice, sizes that do not fit together)."""


class RunConfigError(ConfigValueError):
    """The configuration of a run cannot work; the message names the fix. Raised before any compute."""


class MissingExtraError(ConfigValueError):
    """The run asks for something whose optional package is not installed; the message names
    the package and how to install it (e.g. `make install-tracking`)."""


class TaskDataError(UserError, ValueError):
    """A task's data is missing, empty or malformed (raised by the task modules in data/tasks/)."""


class EvalDataError(TaskDataError):
    """An evaluation file is malformed (the message names the file and line)."""


class EmptyEvalSetError(EvalDataError):
    """An evaluation set has nothing to score: no tokens, no examples."""


@contextlib.contextmanager
def reported():
    """Turns a `UserError` into `error: <message>` on stderr and a SystemExit(2)."""
    try:
        yield
    except UserError as e:
        print(f"error: {without_gin_call_note(str(e))}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None


def without_gin_call_note(message: str) -> str:
    """Drops the "In call to configurable 'x' (<function ...>) [in scope 's']" lines gin appends: noise to a user."""
    return re.sub(r"\n\s*In call to configurable '[^']*' \(.*$", "", message, flags=re.MULTILINE)
