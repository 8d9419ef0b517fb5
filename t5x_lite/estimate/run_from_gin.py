"""The run that `t5x-lite train` would start, read from a resolved gin config without calling `train`.

The estimate and `t5x-lite launch slurm` need the run's model, data, mesh and limits before its
data exists: task factories are not called (registering a task imports TensorFlow and reads its
data directory); their arguments say where the data is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from t5x_lite.config.resolve import REQUIRED, DeferredCall
from t5x_lite.errors import ConfigValueError
from t5x_lite.training import run_spec

# Task factories whose data directory was written by `t5x-lite prepare` (metadata.json).
PREPARED_TASK_FACTORIES = ("lm_task", "span_corruption_task", "prefix_lm_task")
TASK_FACTORIES = (*PREPARED_TASK_FACTORIES, "text_task", "text_to_text_task", "mixture")


@dataclasses.dataclass(frozen=True)
class TaskSource:
    """What the gin config says about the train task, read without registering it."""

    name: str | None
    factory: str | None  # the task factory's gin name (lm_task, ...); None for a plain task name
    data_dir: str | None  # a `t5x-lite prepare` directory, when the factory reads one
    call: DeferredCall | None = None  # the factory call, its arguments built (nested factory calls deferred)


@dataclasses.dataclass(frozen=True)
class RunSettings(run_spec.RunSpec):
    """The run as `train` would start it, and where its task's data is (read without registering it)."""

    task: TaskSource = TaskSource(name=None, factory=None, data_dir=None)


def _task_source(value: Any) -> TaskSource:
    """Where the train task's data is, from the task factory call the config would make."""

    if isinstance(value, DeferredCall):
        data_dir = value.kwargs.get("data_dir") if value.name in PREPARED_TASK_FACTORIES else None
        return TaskSource(name=value.kwargs.get("name"), factory=value.name, data_dir=data_dir, call=value)
    if not isinstance(value, str):  # None, or a macro (MIXTURE_OR_TASK_NAME) the config leaves unset
        return TaskSource(name=None, factory=None, data_dir=None)
    return TaskSource(name=value, factory=None, data_dir=None)


def model_from_gin(resolved: Any, macro: str = "MODEL") -> Any:
    """The model config a gin macro (MODEL in gin/models/*.gin) builds."""

    model = resolved.build_macro(macro)
    if model is REQUIRED:
        raise ConfigValueError(f"The gin config binds no macro {macro}.")
    return model


def run_settings(resolved: Any, *, device_bytes: int | None = None) -> RunSettings:
    """The run that `t5x-lite train` would start with this resolved config (train is not called).

    With no mesh file, the mesh is chosen as train chooses it for devices of `device_bytes`
    (run_spec.with_default_mesh; None: CPU devices, which share the host's memory).

    Task factories are not called: registering a task imports TensorFlow and reads its data
    directory, and the estimate must work before the data exists. Their arguments say where
    the data is. Unbound parameters of `train` take their defaults from its signature.
    """

    _, params = resolved.calls[0]
    raw = {p.name: p.setting.binding.value if p.setting else p.value for p in params}
    for name in ("model", "train_data"):
        if raw[name] is REQUIRED:
            raise ConfigValueError(f"The gin files do not bind train.{name}; compose a run file such as "
                                   "--gin_file=runs/quickstart.gin (a model file alone describes no run).")
    values = {name: resolved.build(value, defer=TASK_FACTORIES) for name, value in raw.items()}
    if not isinstance(values.get("model_dir"), str):  # MODEL_DIR left unset: the estimate needs none
        values["model_dir"] = None
    train_data = values["train_data"]
    task = _task_source(train_data.mixture_or_task_name)
    train_data = dataclasses.replace(train_data, mixture_or_task_name=task.name or "(unnamed task)")
    spec_fields = {f.name for f in dataclasses.fields(run_spec.RunSpec)}
    settings = RunSettings(**{name: values[name] for name in spec_fields if name != "train_data"},
                           train_data=train_data, task=task)
    return run_spec.with_default_mesh(settings, device_bytes=device_bytes)[0]
