"""`MetricsWriter`: a run's scalars to the metric writers chosen in gin (tracking.py), and a
progress bar or printed lines on stdout."""

from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence

from tqdm import tqdm

from t5x_lite.metrics import background, tracking

DEFAULT_WRITERS = (tracking.TensorBoardWriter(),)


class MetricsWriter:
    """Sends scalars to each writer's sink (TensorBoard under MODEL_DIR/tb/<name> by default) and
    shows a progress bar on stdout. A context manager: leaving it closes the sinks with the run's
    status (FINISHED, FAILED, or KILLED for the exceptions in `stopped_by` and signals).

    Only the process with `enabled=True` (process 0) opens sinks and writes anything. A remote
    writer's sink (W&B, MLflow) runs on a thread of its own (background.py): a report is queued,
    never waited for; a full queue drops it, a failed write is a warning line, and closing waits
    a few seconds at most. TensorBoard writes local files synchronously (under a millisecond
    a report): a failure there stops the run.
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
                sink = spec.open(run)
                if spec.remote:
                    sink = background.BackgroundSink(sink, name=type(spec).__name__, say=self.print)
                self._sinks.append((spec, sink))
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
        for _, sink in self._sinks:
            sink.scalars(name, step, values)  # a remote writer's only queues it (its failures are warnings)

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
        close prints a warning line (its error must not hide the run's own). The remote sinks close
        together, in a few seconds at most (background.CLOSE_TIMEOUT_S), whatever their backend."""
        self._bar.close()
        sinks, self._sinks = self._sinks, []
        for _, sink in sinks:
            if isinstance(sink, background.BackgroundSink):
                sink.begin_close(status)
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
