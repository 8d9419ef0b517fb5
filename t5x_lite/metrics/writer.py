"""Metric writers: stdout lines with a progress bar, and TensorBoard event files."""

from __future__ import annotations

import os
import sys
from typing import Mapping

from tqdm import tqdm


class MetricsWriter:
    """Writes scalars to TensorBoard (MODEL_DIR/tb/<name>) and shows a progress bar on stdout.

    Only the process with `enabled=True` (process 0) writes anything.
    """

    def __init__(self, model_dir: str, *, total_steps: int | None, initial_step: int, enabled: bool = True,
                 progress_bar: bool | None = None):
        self.enabled = enabled
        self._writers: dict = {}
        self._logdir = os.path.join(model_dir, "tb")
        show_bar = sys.stderr.isatty() if progress_bar is None else progress_bar
        # A terminal that reports no size (some pseudo-terminals) would get an empty bar.
        sized = _terminal_columns() > 0
        self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=sized,
                         ncols=None if sized else 100, nrows=None if sized else 40,
                         disable=not (enabled and show_bar), file=sys.stderr)

    def _writer(self, name: str):
        if name not in self._writers:
            from tensorboard.summary import Writer  # only the chief process writes TensorBoard events

            self._writers[name] = Writer(os.path.join(self._logdir, name))
        return self._writers[name]

    def scalars(self, name: str, step: int, values: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        writer = self._writer(name)
        for key, value in values.items():
            writer.add_scalar(key, float(value), step=step)
        writer.flush()

    def progress(self, step: int, values: Mapping[str, float]) -> None:
        """Advances the bar to `step` and shows loss and tokens/s on it (or prints a line)."""
        if not self.enabled:
            return
        if self._bar.disable:
            self.print(f"step {step}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()))
            return
        self._bar.update(step - self._bar.n)
        self._bar.set_postfix({k: _fmt(v) for k, v in values.items()}, refresh=True)

    def print(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message, file=sys.stdout)
            sys.stdout.flush()

    def close(self) -> None:
        self._bar.close()
        for writer in self._writers.values():
            writer.close()


def _terminal_columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        return 0


def _fmt(value: float) -> str:
    if isinstance(value, int) or (abs(value) >= 100 and float(value).is_integer()):
        return f"{int(value)}"
    return f"{value:.4g}"
