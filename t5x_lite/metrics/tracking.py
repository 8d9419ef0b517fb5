"""Metric writers chosen in gin: specs that open a sink for one run (TensorBoard here; Weights &
Biases and MLflow in wandb_writer.py and mlflow_writer.py).

A writer spec is a frozen dataclass bound in gin (`train.metric_writers = [@TensorBoardWriter()]`).
`check()` runs up front, before anything is written (an optional package that is missing is one
`MissingExtraError`); `open(run)` starts writing for the run and returns a `Sink`, whose
`scalars` the `MetricsWriter` calls at each report and whose `close` ends the run with a status.
A tracking service's run id is kept in MODEL_DIR/tracking/<kind>_run_id, so that a resumed run
(the same MODEL_DIR) continues the same tracked run. Only process 0 opens sinks (writer.py); a
remote writer's sink is written from a background thread (background.py).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import re
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

from t5x_lite import storage
from t5x_lite.errors import ConfigValueError, MissingExtraError, UserError
from t5x_lite.metrics.remote_logdir import RemoteLogdir

TRACKING_SUBDIR = "tracking"
INSTALL_HINT = "make install-tracking (or pip install 't5x_lite[tracking]')"


class TrackingError(UserError):
    """A tracking service refused the run or could not be reached; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a sink needs to know of the run it writes for.

    Attributes:
      model_dir: the run's directory (local, gs:// or s3://): the tracked run's id is kept under
        its tracking/ folder.
      local_dir: where files go (tb/, wandb/): MODEL_DIR itself, or an s3:// run's local staging
        copy (a gs:// one is written through TensorFlow; W&B uses a local folder instead).
      config_text: the run's operative gin config (what MODEL_DIR/config.gin holds).
      initial_step: the step the run starts from (0: a new run; else the checkpoint resumed).
      say: prints one line for the user (process 0's stdout).
    """

    model_dir: str
    local_dir: str
    config_text: str = ""
    initial_step: int = 0
    say: Callable[[str], None] = print

    @property
    def config(self) -> dict[str, str]:
        return flat_config(self.config_text)


class Sink(Protocol):
    """One open destination of one run's scalars."""

    def scalars(self, name: str, step: int, values: Mapping[str, float]) -> None: ...

    def close(self, status: str) -> None: ...


# Every metric writer class, in the order they are defined: subclassing `MetricWriter` registers
# one (gin binds it under its class name and the configuration reference documents it).
WRITERS: dict[str, type["MetricWriter"]] = {}


class MetricWriter:
    """Base of the writer specs: where a run's scalars go. Subclasses are frozen dataclasses."""

    kind: ClassVar[str] = ""  # names the tracking/<kind>_run_id file
    # True (a network backend): its sink runs on a background thread (background.py), so the loop
    # never waits for it, and a failed write is a warning line, not the end of the run.
    remote: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        WRITERS.setdefault(cls.__name__, cls)  # the first of a name: gin's own subclass of it is not another

    def check(self) -> None:
        """Raises a UserError if this writer cannot work here (a missing package or setting). Writes nothing."""

    def open(self, run: RunInfo) -> Sink:
        """Starts writing `run`'s scalars here."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class TensorBoardWriter(MetricWriter):
    """TensorBoard event files: MODEL_DIR/tb/<name>/ (train, eval, each multiple-choice set)."""

    kind: ClassVar[str] = "tensorboard"

    def open(self, run: RunInfo) -> Sink:
        return _TensorBoardSink(storage.join(run.local_dir, "tb"))


class _TensorBoardSink:
    def __init__(self, logdir: str):
        # A gs:// or s3:// logdir is written locally and copied up (remote_logdir.py).
        self._remote = RemoteLogdir(logdir) if storage.is_url(logdir) else None
        self._logdir = self._remote.local if self._remote else logdir
        self._writers: dict[str, Any] = {}

    def scalars(self, name: str, step: int, values: Mapping[str, float]) -> None:
        if name not in self._writers:
            from tensorboard.summary import Writer  # only the chief process writes TensorBoard events

            self._writers[name] = Writer(os.path.join(self._logdir, name))
        writer = self._writers[name]
        for key, value in values.items():
            writer.add_scalar(key, float(value), step=step)
        writer.flush()
        if self._remote:
            self._remote.sync()

    def close(self, status: str) -> None:
        for writer in self._writers.values():
            writer.close()
        if self._remote:
            self._remote.close()


def import_extra(module: str, writer: str) -> Any:
    """`module`, imported; a MissingExtraError naming `writer` and the install command if it cannot be."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(f"{writer} needs the {module!r} package, which cannot be imported "
                                f"({first_line(e)}): install it with {INSTALL_HINT}, or drop @{writer}() from "
                                "metric_writers.") from None


def first_line(error: BaseException) -> str:
    """An error's message on one line (its first), for a one-line report."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def bad_writers(value: Any) -> str | None:
    """Why `value` is not a list of metric writers (None when it is one), for a message."""
    example = "e.g. [@TensorBoardWriter(), @MlflowWriter()]"
    if not isinstance(value, (list, tuple)) or not all(isinstance(w, MetricWriter) for w in value):
        return f"must be a list of metric writers, {example}"
    kinds = [type(w).__name__ for w in value]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if twice:
        return f"names {', '.join(twice)} more than once: give each writer at most once"
    return None


def check_writers(writers: Any, *, name: str) -> None:
    """Up front, before anything is written: a ConfigValueError for a bad list (`name` is its gin
    parameter), a MissingExtraError for a writer whose package is missing, or the writer's own error."""
    problem = bad_writers(writers)
    if problem:
        raise ConfigValueError(f"{name}={writers!r} {problem}.")
    for writer in writers:
        writer.check()


def run_id_path(model_dir: str, kind: str) -> str:
    return storage.join(model_dir, TRACKING_SUBDIR, f"{kind}_run_id")


def stored_run_id(model_dir: str, kind: str) -> str | None:
    """The id of the tracked run that `model_dir` belongs to (None: none yet)."""
    path = run_id_path(model_dir, kind)
    if not storage.exists(path):
        return None
    with storage.open(path, "r") as f:
        return f.read().strip() or None


def store_run_id(model_dir: str, kind: str, run_id: str) -> None:
    """Keeps `run_id` in MODEL_DIR/tracking/<kind>_run_id (written whole), for a resumed run."""
    storage.makedirs(storage.join(model_dir, TRACKING_SUBDIR))
    storage.write_whole(run_id_path(model_dir, kind), run_id + "\n")


_MACRO_REFERENCE = re.compile(r"^%([\w.]+)$")


def flat_config(config_text: str) -> dict[str, str]:
    """{binding: value text} of an operative gin config (config.gin): every macro (`MODEL_DIR`) and
    every parameter (`train/DataConfig.batch_size`), a value that is just a macro reference replaced
    by the macro's value. Values keep gin's syntax (strings quoted, `@X()` references as written)."""
    statements: list[list[str]] = []
    for line in config_text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line[0].isspace() and statements:  # a continuation of a value gin's printer split
            statements[-1].append(stripped)
        elif " = " in line and not stripped.startswith(("import ", "from ")):
            key, _, value = line.partition(" = ")
            statements.append([key.strip(), value.strip()])
    flat = {}
    for key, first, *rest in statements:
        parts = ([] if first == "\\" else [first]) + rest
        flat[key] = " ".join(parts)
    for key, value in flat.items():
        match = _MACRO_REFERENCE.match(value)
        if match and match.group(1) in flat:
            flat[key] = flat[match.group(1)]
    return flat


def literal(value: str) -> Any:
    """The Python value of a config value's text when it is a literal (8, 'x', [1, 2]), else the text."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def exit_status(exc: BaseException | None, stopped_by: Sequence[type[BaseException]] = ()) -> str:
    """FINISHED (no exception), KILLED (stopped: a signal, Ctrl-C, a preemption) or FAILED."""
    if exc is None:
        return "FINISHED"
    if isinstance(exc, tuple(stopped_by)) or not isinstance(exc, Exception):
        return "KILLED"
    return "FAILED"
