"""The errors that mean "bad input", and how entry points report them: one message, exit 2."""

from __future__ import annotations

import contextlib
import sys

EXIT_BAD_INPUT = 2


class ConfigValueError(ValueError):
    """A configured value is invalid (an unknown choice, sizes that do not fit together)."""


def bad_input_types() -> tuple[type[BaseException], ...]:
    """Exception types whose message is meant for the user (a traceback would only distract)."""
    from t5x_lite import checkpoint, config, loops

    types: list[type[BaseException]] = [config.ConfigError, loops.RunConfigError,
                                        checkpoint.CheckpointMismatchError, ConfigValueError]
    try:
        from tasks import lm

        types.append(lm.TaskDataError)
    except ImportError:
        pass
    from t5x_lite import prepare

    types.append(prepare.PrepareError)
    return tuple(types)


@contextlib.contextmanager
def reported():
    """Turns a bad-input exception into `error: <message>` on stderr and a SystemExit(2)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - filtered just below
        if not isinstance(e, bad_input_types()):
            raise
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
