"""The errors that mean "bad input", and how entry points report them: one message, exit 2."""

from __future__ import annotations

import contextlib
import re
import sys

EXIT_BAD_INPUT = 2


class ConfigValueError(ValueError):
    """A configured value is invalid (an unknown choice, sizes that do not fit together)."""


class TaskDataError(ValueError):
    """A task's data is missing, empty or malformed (raised by the task modules in tasks/)."""


class EvalDataError(TaskDataError):
    """An evaluation file is malformed (the message names the file and line)."""


class EmptyEvalSetError(EvalDataError):
    """An evaluation set has nothing to score: no tokens, no examples."""


def bad_input_types() -> tuple[type[BaseException], ...]:
    """Exception types whose message is meant for the user (a traceback would only distract)."""
    from t5x_lite import (cache_tasks, checkpoint, config, distributed, init_from, input_pipeline, loops, prepare,
                          storage)
    from t5x_lite.hf.errors import ConversionError

    return (config.ConfigError, loops.RunConfigError, loops.NonFiniteLossError, checkpoint.CheckpointMismatchError,
            checkpoint.NoUsableCheckpointError, checkpoint.CheckpointNotFoundError, init_from.InitFromError, ConfigValueError,
            TaskDataError, input_pipeline.DataReadError, input_pipeline.EmptySplitError,
            input_pipeline.MissingSplitError, prepare.PrepareError, cache_tasks.CacheError, storage.StorageError,
            distributed.DistributedConfigError, distributed.CoordinatorUnreachableError, ConversionError)


@contextlib.contextmanager
def reported():
    """Turns a bad-input exception into `error: <message>` on stderr and a SystemExit(2)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - filtered just below
        if not isinstance(e, bad_input_types()):
            raise
        print(f"error: {without_gin_call_note(str(e))}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None


def without_gin_call_note(message: str) -> str:
    """Drops the "In call to configurable 'x' (<function ...>) [in scope 's']" lines gin appends: noise to a user."""
    return re.sub(r"\n\s*In call to configurable '[^']*' \(.*$", "", message, flags=re.MULTILINE)
