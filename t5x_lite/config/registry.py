"""The registration table: every function and class a gin file may bind, by name, in sections.

One table (`table()`) drives both gin's registration (`register_configurables`) and the
sections of the generated configuration reference (config/reference.py). Families of
extensions register themselves by subclassing their base, and the table lists every
subclass: a model family (`models.BaseModel`, its `FAMILIES`), an optimizer
(`training.optim.Optimizer`), a learning-rate schedule (`training.schedules.Schedule`), a
metric writer (`metrics.tracking.MetricWriter`). A new one of those is one class in its module;
a new module of them is one import line below.

This is the one place where config/ reaches down into every job (training, evaluation,
inference, data, checkpoints, metrics, models): the registry sits above them all in the import layers.
"""

from __future__ import annotations

import inspect
from typing import Any

import gin


def table() -> dict[str, tuple[Any, ...]]:
    """Section title -> its configurables, in order; each is bound in gin under its `__name__`."""
    # Imported here, not at the top, for start-up time: these modules load jax and flax (seconds),
    # and `--help` or `config` commands must not wait for them.
    from t5x_lite.checkpoints import init_from, retention
    from t5x_lite.data import task_access, task_factories
    from t5x_lite.evaluation import eval_loop
    from t5x_lite.inference import infer_loop, predict
    from t5x_lite.metrics import mlflow_writer, tracking, wandb_writer  # noqa: F401 (each defines its writer)
    from t5x_lite.models import FAMILIES
    from t5x_lite.training import loop as training_loop
    from t5x_lite.training import optim, schedules, trainer

    return {
        "Runs": (training_loop.train, eval_loop.evaluate, infer_loop.infer),
        "Models": tuple(FAMILIES.values()),
        "Data and tasks": (task_access.DataConfig, task_factories.lm_task, task_factories.span_corruption_task,
                           task_factories.prefix_lm_task, task_factories.text_task, task_factories.text_to_text_task,
                           task_factories.mixture),
        "Optimization": (*optim.OPTIMIZERS.values(), trainer.LossConfig),
        "Learning-rate schedules": tuple(schedules.SCHEDULES.values()),
        "Checkpoints": (retention.RetentionPolicy, init_from.InitFrom),
        "Evaluation and decoding": (eval_loop.PerplexityEval, eval_loop.MultipleChoiceEval, eval_loop.SeqioEval,
                                    predict.DecodingConfig),
        "Metric writers": tuple(sorted(tracking.WRITERS.values(), key=lambda writer: writer.__name__)),
    }


def register_configurables() -> None:
    """Makes every configurable of the table bindable by its name (once per process)."""
    if any(selector.split(".")[-1] == "train" for selector, _ in registry_items()):
        return
    for configurables in table().values():
        for fn_or_cls in configurables:
            gin.external_configurable(fn_or_cls, fn_or_cls.__name__)


def sections() -> dict[str, tuple[str, ...]]:
    """Section title -> the names of its configurables (the configuration reference's order)."""
    return {title: tuple(c.__name__ for c in configurables) for title, configurables in table().items()}


def is_own(fn_or_cls) -> bool:
    """A configurable of t5x_lite, not one of gin's, t5's, seqio's or a user's module."""
    return getattr(fn_or_cls, "__module__", "").split(".")[0] == "t5x_lite"


def own_configurables() -> dict:
    """Registered name -> function or class, for every configurable t5x_lite registers."""
    return {c.name: c.wrapped for _, c in registry_items() if is_own(c.wrapped)}


def registry_items():
    return gin.config._REGISTRY.items()  # noqa: SLF001


def params_of(fn_or_cls) -> list[str]:
    target = fn_or_cls.__init__ if inspect.isclass(fn_or_cls) else fn_or_cls
    return [p for p in inspect.signature(target).parameters if p != "self"]
