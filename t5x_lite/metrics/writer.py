"""`MetricsWriter`: a run's scalars to the metric writers chosen in gin (tracking.py), and a
progress bar or printed lines on stdout."""

from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence

from tqdm import tqdm

from t5x_lite.metrics import tracking

DEFAULT_WRITERS = (tracking.TensorBoardWriter(),)


class MetricsWriter:
    """Sends scalars to each writer's sink (TensorBoard under MODEL_DIR/tb/<name> by default) and
    shows a progress bar on stdout. A context manager: leaving it closes the sinks with the run's
    status (FINISHED, FAILED, or KILLED for the exceptions in `stopped_by` and signals).

    Only the process with `enabled=True` (process 0) opens sinks and writes anything. A remote
    writer (W&B, MLflow) that fails to write prints a warning line; training goes on.
    """

    def __init__(self, log_dir: str, *, total_steps: int | None, initial_step: int, enabled: bool = True,
                 progress_bar: bool | None = None, writers: Sequence[tracking.MetricWriter] = DEFAULT_WRITERS,
                 model_dir: str | None = None, config_text: str = "",
                 stopped_by: tuple[type[BaseException], ...] = ()):
        """`log_dir`: a local directory for files (tb/, wandb/); `model_dir`: where the tracked runs'
        ids are kept (default `log_dir`); `config_text`: the run's operative gin config."""
        self.enabled = enabled
        self._stopped_by = stopped_by
        show_bar = sys.stderr.isatty() if progress_bar is None else progress_bar
        # A terminal that reports no size (some pseudo-terminals) would get an empty bar.
        sized = _terminal_columns() > 0
        self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=sized,
                         ncols=None if sized else 100, nrows=None if sized else 40,
                         disable=not (enabled and show_bar), file=sys.stderr)
        self._sinks: list[tuple[tracking.MetricWriter, tracking.Sink]] = []
        if not enabled:
            return
        run = tracking.RunInfo(model_dir=model_dir or log_dir, local_dir=log_dir, config_text=config_text,
                               initial_step=initial_step, say=self.print)
        try:
            for spec in writers:
                self._sinks.append((spec, spec.open(run)))
        except BaseException:
            self.close("FAILED")
            raise

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(tracking.exit_status(exc, self._stopped_by))

    def scalars(self, name: str, step: int, values: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        for spec, sink in self._sinks:
            try:
                sink.scalars(name, step, values)
            except Exception as e:  # noqa: BLE001 - a tracking server that is down must not stop training
                if not spec.remote:
                    raise
                self.print(f"warning: {type(spec).__name__} could not write {name} at step {step}: "
                           f"{tracking.first_line(e)}")

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

    def close(self, status: str = "FINISHED") -> None:
        """Closes the bar and each sink (`status`: FINISHED, FAILED or KILLED); a sink that fails to
        close prints a warning line (its error must not hide the run's own)."""
        self._bar.close()
        sinks, self._sinks = self._sinks, []
        for spec, sink in sinks:
            try:
                sink.close(status)
            except Exception as e:  # noqa: BLE001
                self.print(f"warning: {type(spec).__name__} could not close its run: {tracking.first_line(e)}")


def _terminal_columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        return 0


def _fmt(value: float) -> str:
    if isinstance(value, int) or (abs(value) >= 100 and float(value).is_integer()):
        return f"{int(value)}"
    return f"{value:.4g}"
