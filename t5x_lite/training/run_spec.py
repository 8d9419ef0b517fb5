"""One description of a training run, and the one place that checks its sizes fit together.

`train` builds a `RunSpec` from its gin-bound arguments; `t5x-lite estimate` and `t5x-lite
launch slurm` build the same `RunSpec` from a resolved gin config without running anything.
All three call `check_layout`, so a run that `estimate` accepts is one that `train` starts,
with the same message when it is not.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from t5x_lite.data.task_access import DataConfig
from t5x_lite.errors import RunConfigError
from t5x_lite.models import ModelConfig
from t5x_lite.parallel import partitioning
from t5x_lite.training.optim import OptimizerConfig
from t5x_lite.training.trainer import LossConfig

DEFAULT_MESH_AXES = (("data", -1), ("fsdp", 1), ("tensor", 1))


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The resolved settings of a training run that train, estimate and launch read.

    The field names are those of `train`'s parameters (and so of the `train.*` gin bindings).
    """

    model: ModelConfig
    train_data: DataConfig
    eval_data: DataConfig | None = None
    optimizer: OptimizerConfig = OptimizerConfig()
    loss: LossConfig = LossConfig()
    mesh_axes: Sequence[tuple[str, int]] = DEFAULT_MESH_AXES
    logical_axis_rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES
    train_steps: int | None = None
    num_epochs: int | None = None
    microbatches: int = 1
    peak_flops_per_device: float | None = None
    model_dir: Any = None

    def __post_init__(self):
        # The data configs as the model family reads them (encoder-decoder: inputs and targets).
        family = self.model.family
        object.__setattr__(self, "train_data", self.train_data.for_model_family(family))
        if self.eval_data is not None:
            object.__setattr__(self, "eval_data", self.eval_data.for_model_family(family))


def check_layout(spec: RunSpec, *, batch_shards: int, num_processes: int = 1) -> None:
    """Raises RunConfigError when the steps, sequence lengths, batch, mesh and processes do not fit."""
    if spec.train_steps is None and spec.num_epochs is None:
        raise RunConfigError("Set TRAIN_STEPS or train.num_epochs (or both: the run stops at the first).")
    model = spec.model
    for cfg in filter(None, (spec.train_data, spec.eval_data)):
        if model.family == "decoder_only" and cfg.sequence_length > model.max_len:
            raise RunConfigError(
                f"{cfg.split} sequence_length={cfg.sequence_length} does not fit the model's "
                f"max_len={model.max_len}; lower SEQUENCE_LENGTH or raise DecoderConfig.max_len.")
        if cfg.batch_size % num_processes:
            raise RunConfigError(f"batch_size={cfg.batch_size} must divide over {num_processes} processes.")
        if cfg.batch_size % batch_shards:
            raise RunConfigError(
                f"{cfg.split} batch_size={cfg.batch_size} must be a multiple of the {batch_shards} "
                "batch shards of the mesh; change BATCH_SIZE or the mesh.")
    batch_size = spec.train_data.batch_size
    if batch_size % (spec.microbatches * batch_shards):
        raise RunConfigError(f"batch_size={batch_size} must be a multiple of microbatches x batch shards "
                             f"= {spec.microbatches} x {batch_shards}.")


def check_vocabulary(model: ModelConfig, vocab_size: int) -> None:
    """The model's vocab_size must hold the task's vocabulary, padded to at most a multiple of 128."""
    padded = -(-vocab_size // 128) * 128
    if not vocab_size <= model.vocab_size <= padded:
        name = type(model).__name__
        raise RunConfigError(
            f"The task's vocabulary has {vocab_size} entries but {name}.vocab_size="
            f"{model.vocab_size}; set --gin.{name}.vocab_size={vocab_size} (or up to "
            f"{padded}, padded to a multiple of 128).")


def checkpoint_metadata(spec: RunSpec, *, vocab_size: int) -> dict:
    """What `checkpoint info` shows and what a resumed run is checked against."""
    mesh_axes = spec.mesh_axes
    return {
        "family": spec.model.family,
        # Through JSON, so it compares equal to what a checkpoint's metadata reads back (lists, not tuples).
        "model": json.loads(json.dumps(spec.model.to_dict())),
        "task": spec.train_data.mixture_or_task_name,
        "vocab_size": vocab_size,
        "sequence_length": spec.train_data.sequence_length,
        "mesh_axes": [list(a) for a in (mesh_axes.items() if isinstance(mesh_axes, dict) else mesh_axes)],
        "num_params": spec.model.num_params(),
    }
