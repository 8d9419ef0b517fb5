"""One description of a training run, and the one place that checks its sizes fit together.

`train` builds a `RunSpec` from its gin-bound arguments; `t5x-lite estimate` and `t5x-lite
launch slurm` build the same `RunSpec` from a resolved gin config without running anything.
All three call `check_layout`, so a run that `estimate` accepts is one that `train` starts,
with the same message when it is not.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax

from t5x_lite.data import task_access
from t5x_lite.data.task_access import DataConfig
from t5x_lite.errors import RunConfigError
from t5x_lite.inference import sample
from t5x_lite.models import BaseModel, stack
from t5x_lite.parallel import partitioning, placement
from t5x_lite.training.optim import AdamW, Optimizer
from t5x_lite.training.trainer import LossConfig

DEFAULT_MESH_AXES = (("data", -1), ("fsdp", 1), ("tensor", 1))


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The resolved settings of a training run that train, estimate and launch read.

    The field names are those of `train`'s parameters (and so of the `train.*` gin bindings).
    """

    model: BaseModel
    train_data: DataConfig
    eval_data: DataConfig | None = None
    optimizer: Optimizer = AdamW()
    loss: LossConfig = LossConfig()
    mesh_axes: Sequence[tuple[str, int]] | None = DEFAULT_MESH_AXES  # None: with_default_mesh chooses
    logical_axis_rules: partitioning.LogicalRules | None = partitioning.DEFAULT_RULES
    train_steps: int | None = None
    num_epochs: int | None = None
    microbatches: int = 1
    peak_flops_per_device: float | None = None
    model_dir: Any = None

    def __post_init__(self):
        if self.logical_axis_rules is None:  # no mesh file (config/macro_defaults.py)
            object.__setattr__(self, "logical_axis_rules", partitioning.DEFAULT_RULES)
        # The data configs with the feature converter the model reads (encoder-decoder: inputs and targets).
        object.__setattr__(self, "train_data", self.train_data.for_model(self.model))
        if self.eval_data is not None:
            object.__setattr__(self, "eval_data", self.eval_data.for_model(self.model))


def with_default_mesh(spec: RunSpec, *, device_bytes: int | None) -> tuple[RunSpec, str | None]:
    """`spec` with its mesh chosen when the config gave none (MESH_AXES None), and why; else as it is.

    Data parallel when the float32 params and optimizer state take at most
    placement.FITS_FRACTION of one device's `device_bytes` (None: a CPU, whose devices share the
    host's memory, always fits), else FSDP: t5x's default is data parallel too, but a model
    too large for it should not fail for want of a mesh file.
    """
    if spec.mesh_axes is not None:
        return spec, None
    _, state_bytes = train_state_bytes(spec)
    axes = placement.choose_mesh_axes(param_bytes=state_bytes, device_bytes=device_bytes)
    kind = "data parallel" if axes == placement.DATA_PARALLEL_AXES else "FSDP"
    room = ("the devices share the host's memory" if device_bytes is None else
            f"{state_bytes / 1e9:.2f} GB of params and optimizer state vs {device_bytes / 1e9:.1f} GB per device")
    return dataclasses.replace(spec, mesh_axes=axes), f"{kind}, chosen as no mesh file was given ({room})"


def train_state_bytes(spec: RunSpec) -> tuple[int, int]:
    """(float32 params, params and optimizer state) in bytes, whole: shapes only, nothing allocated."""
    params, logical_axes = placement.params_abstract(spec.model)
    optimizer_state = jax.eval_shape(spec.optimizer.build(1, logical_axes=logical_axes).init, params)
    size = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
    return size(params), size(params) + size(optimizer_state)


def check_layout(spec: RunSpec, *, batch_shards: int, num_processes: int = 1) -> None:
    """Raises RunConfigError when the steps, sequence lengths, batch, mesh and processes do not fit."""
    if spec.train_steps is None and spec.num_epochs is None:
        raise RunConfigError("Set TRAIN_STEPS or train.num_epochs (or both: the run stops at the first).")
    model = spec.model
    for cfg in filter(None, (spec.train_data, spec.eval_data)):
        model.check_lengths(sequence_length=cfg.sequence_length, split=cfg.split)
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


def max_model_vocab_size(vocab_size: int) -> int:
    """The largest embedding a vocabulary of `vocab_size` may have: padded to a multiple of 128,
    or by up to 1% (published models pad their tokenizer's ids so: Qwen2's 151,665 to 151,936)."""
    return max(-(-vocab_size // 128) * 128, vocab_size + vocab_size // 100)


def check_vocabulary(model: BaseModel, vocab_size: int) -> None:
    """The model's vocab_size must hold the task's vocabulary, padded by at most max_model_vocab_size."""
    largest = max_model_vocab_size(vocab_size)
    if not vocab_size <= model.vocab_size <= largest:
        name = type(model).__name__
        raise RunConfigError(
            f"The task's vocabulary has {vocab_size} entries but {name}.vocab_size="
            f"{model.vocab_size}; set --gin.{name}.vocab_size={vocab_size} (or up to "
            f"{largest}: padded to a multiple of 128, or by up to 1%).")


def check_model_and_data(spec: RunSpec, *, multiple_choice: bool, sample_prompt: str | Sequence[str] | None) -> dict:
    """Checks the model against the backend (its remat policy), the task's vocabulary, and what the
    evaluations during training ask of it (multiple choice and samples need a causal LM; each sample
    prompt leaves room for a new token: the model's one prompt-length rule); returns the
    checkpoint metadata, all before anything is written."""
    model = spec.model
    stack.check_backend_supports(model.remat_policy)
    vocabulary = task_access.targets_vocabulary(spec.train_data)
    check_vocabulary(model, vocabulary.vocab_size)
    if multiple_choice and (not model.continues_text or spec.eval_data is None):
        raise RunConfigError("train.multiple_choice scores decoder-only models at each evaluation: it needs "
                             "a decoder-only model and train.eval_data.")
    if sample_prompt and model.continues_text:
        model.check_prompts(sample.encode_prompts(vocabulary, sample.prompt_list(sample_prompt)),
                            what="train.sample_prompt", max_new_tokens=1)
    return checkpoint_metadata(spec, vocab_size=vocabulary.vocab_size)


def checkpoint_metadata(spec: RunSpec, *, vocab_size: int) -> dict:
    """What `checkpoint info` shows and what a resumed run is checked against. 'attention' is the
    implementation the model's attention resolved to here ('auto' resolved; their numerics
    differ in the last bits): a record only, since a run resumed elsewhere may resolve otherwise."""
    mesh_axes = spec.mesh_axes
    return {
        **spec.model.metadata(),
        "attention": spec.model.attention(),
        "task": spec.train_data.mixture_or_task_name,
        "vocab_size": vocab_size,
        "sequence_length": spec.train_data.sequence_length,
        "mesh_axes": [list(a) for a in (mesh_axes.items() if isinstance(mesh_axes, dict) else mesh_axes)],
        "num_params": spec.model.num_params(),
    }
