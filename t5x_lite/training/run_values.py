"""Every value of a training run, checked once, up front, for its type and its range.

`check_values(spec, **settings)` checks what a RunSpec holds (train, estimate and launch call
it before anything uses the values) and, for `train`, the rest of its arguments by name;
`check_model_dir` checks where the run will write (train calls it before reading any data).
Each bad value is named as a user binds it (the macro of gin/runs/pretrain.gin where there is
one, else the gin parameter) with what it must be; several are reported together, on one line:
one RunConfigError, exit 2, before anything is written, read or compiled.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping

from t5x_lite import storage
from t5x_lite.errors import ConfigValueError, RunConfigError
from t5x_lite.metrics import tracking
from t5x_lite.parallel import partitioning
from t5x_lite.training import optim
from t5x_lite.training.periods import parse_period


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _typo_hint(value: Any) -> str:
    """Why a value of the wrong type is wrong, when that is not obvious from its repr."""
    if isinstance(value, bool):
        return " (not True/False)"
    if isinstance(value, float) and value.is_integer():
        return f" (write {int(value)}: a whole number without a decimal point or exponent)"
    if isinstance(value, str):
        return " (a number, without quotes)"
    return ""


class Problems:
    """The bad values found so far; `raise_if_any` reports them all as one RunConfigError."""

    def __init__(self):
        self.found: list[str] = []

    def add(self, name: str, value: Any, need: str, hint: str = "") -> None:
        self.found.append(f"{name}={value!r} {need}{hint}")

    def integer(self, name: str, value: Any, *, minimum: int = 1, optional: bool = False) -> None:
        if (optional and value is None) or (_is_int(value) and value >= minimum):
            return
        need = "must be a positive integer" if minimum == 1 else f"must be an integer >= {minimum}"
        self.add(name, value, need + (" or None" if optional else ""), "" if _is_int(value) else _typo_hint(value))

    def number(self, name: str, value: Any, *, low: float, high: float = math.inf, low_open: bool = False,
               high_open: bool = False, optional: bool = False) -> None:
        if optional and value is None:
            return
        if _is_number(value) and (low < value if low_open else low <= value) and (
                value < high if high_open else value <= high):
            return
        if high == math.inf:
            need = f"must be a number {'>' if low_open else '>='} {low:g}"
        else:
            need = (f"must be a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}")
        hint = " (a number, without quotes)" if isinstance(value, str) else ""
        self.add(name, value, need + (" or None" if optional else ""), hint)

    def boolean(self, name: str, value: Any, *, optional: bool = False) -> None:
        if not (isinstance(value, bool) or (optional and value is None)):
            self.add(name, value, "must be True or False" + (" or None" if optional else ""))

    def text(self, name: str, value: Any, *, optional: bool = False) -> None:
        if not ((isinstance(value, str) and value) or (optional and value is None)):
            self.add(name, value, "must be a non-empty string in quotes" + (" or None" if optional else ""),
                     f", e.g. --gin.{name}=\"'...'\"")

    def check(self, validate: Callable[[], Any]) -> None:
        """Runs a validator of its own (a period, ...), keeping its message."""
        try:
            validate()
        except ConfigValueError as e:
            self.found.append(str(e).rstrip("."))

    def raise_if_any(self) -> None:
        if len(self.found) == 1:
            raise RunConfigError(f"{self.found[0]}.")
        if self.found:
            raise RunConfigError(f"{len(self.found)} values are invalid: " + "; ".join(self.found) + ".")


def _check_mesh_axes(problems: Problems, axes: Any) -> None:
    """(name, size) pairs (or a dict) over the known mesh axes; sizes positive, one may be -1."""
    example = "e.g. --gin.MESH_AXES=\"[('data', -1), ('fsdp', 1), ('tensor', 1)]\""
    try:
        items = list(axes.items()) if isinstance(axes, Mapping) else [tuple(a) for a in axes]
        names = [name for name, _ in items]
        sizes = [size for _, size in items]
    except (TypeError, ValueError):
        problems.add("MESH_AXES", axes, f"must be a list of (axis name, size) pairs; {example}")
        return
    unknown = [n for n in names if n not in partitioning.MESH_AXIS_NAMES]
    if unknown or len(set(names)) != len(names) or not names:
        problems.add("MESH_AXES", axes, f"must name each of the mesh axes {list(partitioning.MESH_AXIS_NAMES)} at most "
                     f"once" + (f" ({', '.join(map(repr, unknown))} is not one)" if unknown else "") + f"; {example}")
    if any(not (_is_int(s) and (s >= 1 or s == -1)) for s in sizes) or sizes.count(-1) > 1:
        problems.add("MESH_AXES", axes, "needs sizes that are positive integers, with at most one -1 (the devices the "
                     f"others leave); {example}")


def _check_rules(problems: Problems, rules: Any) -> None:
    """(logical axis, None | mesh axis | tuple of mesh axes) pairs over the known mesh axes."""
    known = partitioning.MESH_AXIS_NAMES
    try:
        pairs = [tuple(r) for r in rules]
        ok = all(len(p) == 2 and isinstance(p[0], str) for p in pairs)
    except TypeError:
        ok = False
    if not ok:
        problems.add("LOGICAL_AXIS_RULES", rules, "must be a list of (logical axis, mesh axes) pairs, as in "
                     "gin/mesh/*.gin")
        return
    for logical, target in pairs:
        targets = () if target is None else (target,) if isinstance(target, str) else target
        if not isinstance(targets, (tuple, list)) or any(t not in known for t in targets):
            problems.add(f"LOGICAL_AXIS_RULES entry {logical!r}", target,
                         f"must be None, a mesh axis or a tuple of mesh axes among {list(known)}")


def _check_data(problems: Problems, scope: str, cfg: Any, *, train: Any = None) -> None:
    """One split's DataConfig (train/DataConfig or eval/DataConfig in gin/runs/pretrain.gin); for
    eval, only the values that differ from train's (a shared macro's bad value is named once).
    The task is looked up later (task_access.get_task names the known ones)."""
    name = f"{scope}/DataConfig"
    checks = {
        "split": lambda label, v: problems.text(label, v),
        "sequence_length": lambda label, v: problems.integer(f"{label} (SEQUENCE_LENGTH)", v),
        "inputs_length": lambda label, v: problems.integer(f"{label} (INPUTS_LENGTH)", v, optional=True),
        "batch_size": lambda label, v: problems.integer(f"{label} (BATCH_SIZE)", v),
        "seed": lambda label, v: problems.integer(f"{label} (SEED)", v, minimum=0),
        "shuffle": lambda label, v: problems.boolean(label, v),
        "pack": lambda label, v: problems.boolean(label, v),
        "use_cached": lambda label, v: problems.boolean(label, v),
    }
    for field, check in checks.items():
        value = getattr(cfg, field)
        if train is None or value != getattr(train, field) or type(value) is not type(getattr(train, field)):
            check(f"{name}.{field}", value)


def _sample_prompt(problems: Problems, value: Any) -> None:
    prompts = [value] if isinstance(value, str) else value
    if value is not None and not (isinstance(prompts, (list, tuple)) and all(isinstance(p, str) for p in prompts)):
        problems.add("train.sample_prompt", value, "must be a string in quotes, a list of them, or None")


def _metric_writers(problems: Problems, value: Any) -> None:
    problem = tracking.bad_writers(value)
    if problem:
        problems.add("train.metric_writers", value, problem)


# train's own arguments (beyond the RunSpec), each with its check.
SETTINGS: dict[str, Callable[[Problems, Any], None]] = {
    "eval_period": lambda p, v: p.check(lambda: parse_period(v, name="train.eval_period")),
    "checkpoint_period": lambda p, v: p.check(lambda: parse_period(v, name="train.checkpoint_period")),
    "eval_batches": lambda p, v: p.integer("train.eval_batches", v, optional=True),
    "log_period": lambda p, v: p.integer("train.log_period", v),
    "seed": lambda p, v: p.integer("train.seed (SEED)", v, minimum=0),
    "init_loss_tolerance": lambda p, v: p.number("train.init_loss_tolerance", v, low=0),
    "sample_prompt": _sample_prompt,
    "sample_max_new_tokens": lambda p, v: p.integer("train.sample_max_new_tokens", v),
    "async_checkpoints": lambda p, v: p.boolean("train.async_checkpoints", v),
    "progress_bar": lambda p, v: p.boolean("train.progress_bar", v, optional=True),
    "task_module": lambda p, v: p.text("MIXTURE_OR_TASK_MODULE", v, optional=True),
    "metric_writers": _metric_writers,
}


def check_values(spec: Any, **settings: Any) -> None:
    """A RunConfigError naming every value of the run (a RunSpec) and of `settings` (train's other
    arguments, by name: see SETTINGS) whose type or range is wrong."""
    problems = Problems()
    problems.integer("TRAIN_STEPS", spec.train_steps, optional=True)
    problems.integer("train.num_epochs (NUM_EPOCHS)", spec.num_epochs, optional=True)
    problems.integer("train.microbatches", spec.microbatches)
    problems.number("train.peak_flops_per_device", spec.peak_flops_per_device, low=0, low_open=True, optional=True)
    problems.text("MODEL_DIR", spec.model_dir, optional=True)
    if spec.mesh_axes is not None:  # None: chosen by run_spec.with_default_mesh
        _check_mesh_axes(problems, spec.mesh_axes)
    _check_rules(problems, spec.logical_axis_rules)
    _check_data(problems, "train", spec.train_data)
    if spec.eval_data is not None:
        _check_data(problems, "eval", spec.eval_data, train=spec.train_data)
    optim.check_optimizer(problems, spec.optimizer)  # the optimizer's values and its schedule's
    problems.number("LossConfig.z_loss", spec.loss.z_loss, low=0)
    problems.number("LossConfig.label_smoothing", spec.loss.label_smoothing, low=0, high=1, high_open=True)
    for name, value in settings.items():
        SETTINGS[name](problems, value)
    problems.raise_if_any()


def check_model_dir(model_dir: str) -> None:
    """Where the run writes: a local MODEL_DIR must be a directory (or one that can be made, below
    a writable directory); a remote one must be reachable. Reads, never writes."""
    if storage.is_url(model_dir):
        storage.check_bucket(model_dir)  # a missing bucket, an unreachable store or no credentials: one line
        return
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise RunConfigError(f"MODEL_DIR {model_dir!r} is a file, not a directory; choose a directory for the run's "
                             "checkpoints, e.g. --gin.MODEL_DIR=\"'/tmp/my_run'\".")
    existing = storage.nearest_existing(model_dir)
    if not os.path.isdir(existing):
        raise RunConfigError(f"MODEL_DIR {model_dir!r} cannot be created: {existing!r} is a file, not a directory; "
                             "choose a MODEL_DIR whose parent folders are directories.")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = f"MODEL_DIR {model_dir!r}" if existing == model_dir else (
            f"{existing!r}, where MODEL_DIR {model_dir!r} would be made,")
        raise RunConfigError(f"{where} is not writable by this user (its permissions, or a read-only file "
                             "system); choose a MODEL_DIR you can write to.")
