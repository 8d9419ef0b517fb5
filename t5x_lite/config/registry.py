"""The registry of configurables: every function and class a gin file may bind, by name.

This is the one place where config/ reaches down into every job (training, evaluation,
inference, data, checkpoints, metrics, models): the registry sits above them all in the import layers.
"""

from __future__ import annotations

import gin


def register_configurables() -> None:
    """Makes the library's functions and config classes bindable by these gin names."""
    if any(selector.split(".")[-1] == "train" for selector, _ in registry_items()):
        return
    # Imported here, not at the top, for start-up time: these modules load jax, flax, seqio and
    # TensorFlow (seconds), and `--help` or `config` commands must not wait for them.
    from t5x_lite.checkpoints import init_from, retention
    from t5x_lite.data import task_access, task_factories
    from t5x_lite.evaluation import eval_loop
    from t5x_lite.inference import infer_loop, predict
    from t5x_lite.metrics import mlflow_writer, tracking, wandb_writer
    from t5x_lite.models import decoder_only, encoder_decoder
    from t5x_lite.training import loop as training_loop
    from t5x_lite.training import optim, trainer

    gin.external_configurable(training_loop.train, "train")
    gin.external_configurable(decoder_only.DecoderConfig, "DecoderConfig")
    gin.external_configurable(encoder_decoder.T5Config, "T5Config")
    gin.external_configurable(task_access.DataConfig, "DataConfig")
    gin.external_configurable(optim.AdamW, "AdamW")
    gin.external_configurable(optim.Adafactor, "Adafactor")
    for schedule in optim.SCHEDULES:  # WarmupCosine, WarmupLinear, RsqrtDecay, Constant, WarmupStableDecay
        gin.external_configurable(schedule, schedule.__name__)
    gin.external_configurable(trainer.LossConfig, "LossConfig")
    gin.external_configurable(retention.RetentionPolicy, "RetentionPolicy")
    gin.external_configurable(init_from.InitFrom, "InitFrom")
    gin.external_configurable(task_factories.lm_task, "lm_task")
    gin.external_configurable(task_factories.span_corruption_task, "span_corruption_task")
    gin.external_configurable(task_factories.prefix_lm_task, "prefix_lm_task")
    gin.external_configurable(task_factories.text_task, "text_task")
    gin.external_configurable(task_factories.text_to_text_task, "text_to_text_task")
    gin.external_configurable(task_factories.mixture, "mixture")
    gin.external_configurable(eval_loop.evaluate, "evaluate")
    gin.external_configurable(eval_loop.PerplexityEval, "PerplexityEval")
    gin.external_configurable(eval_loop.MultipleChoiceEval, "MultipleChoiceEval")
    gin.external_configurable(eval_loop.SeqioEval, "SeqioEval")
    gin.external_configurable(predict.DecodingConfig, "DecodingConfig")
    gin.external_configurable(infer_loop.infer, "infer")
    gin.external_configurable(tracking.TensorBoardWriter, "TensorBoardWriter")
    gin.external_configurable(wandb_writer.WandbWriter, "WandbWriter")
    gin.external_configurable(mlflow_writer.MlflowWriter, "MlflowWriter")


def is_own(fn_or_cls) -> bool:
    """A configurable of t5x_lite (or its tasks/), not one of gin's, t5's or seqio's."""
    return getattr(fn_or_cls, "__module__", "").split(".")[0] in ("t5x_lite", "tasks")


def own_configurables() -> dict:
    """Registered name -> function or class, for every configurable t5x_lite registers."""
    return {c.name: c.wrapped for _, c in registry_items() if is_own(c.wrapped)}


def registry_items():
    return gin.config._REGISTRY.items()  # noqa: SLF001


def params_of(fn_or_cls) -> list[str]:
    import inspect

    target = fn_or_cls.__init__ if inspect.isclass(fn_or_cls) else fn_or_cls
    return [p for p in inspect.signature(target).parameters if p != "self"]
