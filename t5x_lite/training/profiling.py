"""Profiling: a jax.profiler trace of chosen train steps, written for TensorBoard's profile plugin.

`train.profile_steps = (10, 15)` (or `--gin.PROFILE_STEPS=(10,15)`) traces the steps that
start at step 10 up to, not including, 15: after compilation and warm-up, so the trace shows
steady-state steps. Each process writes its own trace under MODEL_DIR/profile/process_<i>/
(traced to local disk first and copied up when MODEL_DIR is gs:// or s3://).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Callable, Sequence

import jax

from t5x_lite import storage
from t5x_lite.errors import ConfigValueError


def check_profile_steps(steps: Sequence[int] | None) -> tuple[int, int] | None:
    """(start, stop) of `train.profile_steps`, or None; a ConfigValueError naming the fix."""
    if steps is None:
        return None
    if (not isinstance(steps, (tuple, list)) or len(steps) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps)):
        raise ConfigValueError(f"train.profile_steps={steps!r}: give (start, stop), e.g. "
                               "--gin.PROFILE_STEPS=(10,15) to trace steps 10 to 14.")
    start, stop = steps
    if not 0 <= start < stop:
        raise ConfigValueError(f"train.profile_steps={tuple(steps)!r}: need 0 <= start < stop, e.g. (10, 15).")
    return start, stop


def trace_dir(model_dir: str, process_index: int) -> str:
    return storage.join(model_dir, "profile", f"process_{process_index}")


class StepProfiler:
    """Starts a trace before step `start` and stops it once step `stop - 1` has finished.

    Args:
      steps: (start, stop) or None (never traces).
      log_dir: where the trace goes (a local directory, gs:// or s3://).
      first_step: the step the run starts at (a resumed run may already be past `start`).
      print_fn: where the start and end of the trace are announced.
    """

    def __init__(self, steps: Sequence[int] | None, *, log_dir: str, first_step: int,
                 print_fn: Callable[[str], None]):
        self._range = check_profile_steps(steps)
        self._log_dir = log_dir
        self._local_dir = log_dir
        self._print = print_fn
        self._active = False
        self._last_traced: int | None = None
        if self._range and first_step > self._range[0]:
            print_fn(f"profile: steps {self._range[0]}-{self._range[1] - 1} not traced: the run resumed at "
                     f"step {first_step}; choose later steps.")
            self._range = None

    @contextlib.contextmanager
    def step(self, step: int, outputs: Callable[[], Any]):
        """Wraps the train step that starts at `step`; `outputs()` gives what it computed, so the
        trace ends only after the device has finished it."""
        if self._range and step == self._range[0]:
            self._local_dir = tempfile.mkdtemp(prefix="t5x_lite_profile_") if storage.is_url(self._log_dir) else self._log_dir
            os.makedirs(self._local_dir, exist_ok=True)
            jax.profiler.start_trace(self._local_dir)
            self._active = True
        if self._active:
            self._last_traced = step
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                yield
        else:
            yield
        if self._active and step == self._range[1] - 1:
            jax.block_until_ready(outputs())
            self.stop()

    def stop(self) -> None:
        """Ends the trace (also when the run ends or fails inside the range)."""
        if not self._active:
            return
        jax.profiler.stop_trace()
        self._active = False
        if self._local_dir != self._log_dir:
            _upload(self._local_dir, self._log_dir)
        self._print(f"profile: trace of steps {self._range[0]}-{self._last_traced} written to {self._log_dir} "
                    f"(tensorboard --logdir {self._log_dir.rsplit('/', 1)[0]})")
        self._range = None


def _upload(local_dir: str, destination: str) -> None:
    """Copies a finished trace directory to object storage, then removes the local copy."""
    for root, _, files in os.walk(local_dir):
        relative = os.path.relpath(root, local_dir)
        target = destination if relative == "." else storage.join(destination, *relative.split(os.sep))
        storage.makedirs(target)
        for name in files:
            storage.copy(os.path.join(root, name), storage.join(target, name))
    shutil.rmtree(local_dir, ignore_errors=True)
