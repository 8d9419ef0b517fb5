"""TensorFlow is for data only: import it quietly and keep it off every accelerator.

Quiet takes two things. TensorFlow reads `TF_CPP_MIN_LOG_LEVEL` when it loads, but JAX, which
is usually imported first, sets it to 1 when it is unset (for XLA's own log): so unless the user
set it (t5x_lite/__init__.py noted that before anything imported JAX), TensorFlow is loaded with
2 and the variable is put back as it was, leaving XLA's warnings to JAX's setting. And some of
TensorFlow's lines ignore that level altogether: those it logs while its shared libraries load,
before absl's logging is initialised ("All log messages before absl::InitializeLog()", the
oneDNN notice, "Could not find cuda drivers"), and the failed `cuInit` of a machine without
a GPU when the GPUs are hidden from it. The process's stderr is captured while TensorFlow
loads, and what it printed is passed on without those lines (all of it with a user's
`TF_CPP_MIN_LOG_LEVEL=0`). tensorflow_text loads in the same window: its op libraries read the
level again as they load.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import tempfile
import threading

import t5x_lite

LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
# Lines TensorFlow prints on every start of a machine without a GPU; nothing to act on.
STARTUP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|\] oneDNN custom operations are on\."
    r"|\] Could not find cuda drivers on your machine, GPU will not be used\."
    r"|\] failed call to cuInit: "
)

_tf = None
_LOCK = threading.Lock()  # one thread captures stderr while TensorFlow loads


def import_tensorflow():
    """Imports TensorFlow with its C++ logging quieted and all GPUs hidden from it."""
    global _tf
    if _tf is not None:
        return _tf
    with _LOCK:
        if _tf is None:
            _tf = _quiet_import()
    return _tf


def _quiet_import():
    user_level = t5x_lite.USER_TF_CPP_MIN_LOG_LEVEL
    current = os.environ.get(LOG_LEVEL)
    if user_level is None:
        os.environ[LOG_LEVEL] = "2"
    try:
        with _without_startup_noise(enabled=user_level != "0"):
            import tensorflow as tf  # TensorFlow loads in seconds: only the data path imports it

            try:
                tf.config.set_visible_devices([], "GPU")
            except RuntimeError:  # TensorFlow already initialised its devices; they stay as they are
                pass
            # Its op libraries set TensorFlow's log level again, from the variable, as they load;
            # seqio imports it anyway.
            if importlib.util.find_spec("tensorflow_text") is not None:
                import tensorflow_text  # noqa: F401
    finally:
        if user_level is None:  # TensorFlow has read it; XLA's level stays JAX's (or unset)
            if current is None:
                os.environ.pop(LOG_LEVEL, None)
            else:
                os.environ[LOG_LEVEL] = current
    return tf


_capturing = threading.Event()


def capturing_stderr() -> bool:
    """Whether stderr is being captured now: a signal handler must not raise then (the capture would
    not be undone; training/preemption.py sends the signal again a moment later)."""
    return _capturing.is_set()


@contextlib.contextmanager
def _without_startup_noise(*, enabled: bool):
    """Captures file descriptor 2 (C++ and Python writes alike) and passes on all but STARTUP_NOISE."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable stderr: nothing to filter
        enabled = False
    if not enabled:
        yield
        return
    with tempfile.TemporaryFile() as captured:
        _capturing.set()
        try:
            os.dup2(captured.fileno(), 2)
            yield
        finally:
            try:
                sys.stderr.flush()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                _capturing.clear()
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not STARTUP_NOISE.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
