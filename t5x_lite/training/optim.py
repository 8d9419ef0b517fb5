"""The optimizers a run chooses in gin (`train.optimizer = @AdamW()` or `@Adafactor()`).

Each takes its learning-rate schedule as a gin-bound object (`AdamW.learning_rate =
@WarmupCosine()`, schedules.py) and an optional global-norm gradient clipping, which the train
step applies (`clip_by_global_norm`) before the update. `build(total_steps, logical_axes)` gives
the optax transformation of a run (Adafactor needs the params' logical
axes: its factoring and its per-layer statistics follow them, see adafactor.py), `schedule` the
learning rate the run reports, `check` every bad value by its gin name. `state_logical_specs`
gives the optimizer state's logical PartitionSpecs, for the trainer's shardings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax
from jax.sharding import PartitionSpec

from t5x_lite.training import adafactor
from t5x_lite.training.schedules import (  # noqa: F401 (the schedules, importable from here too)
    SCHEDULES,
    Schedule,
    Constant,
    Problems,
    RsqrtDecay,
    WarmupCosine,
    WarmupLinear,
    WarmupStableDecay,
    warmup_cosine_schedule,
)


def weight_decay_mask(params):
    """True for matrices (kernels, embeddings), False for norm scales, scanned or not."""
    def is_matrix(path, _):
        return getattr(path[-1], "key", None) in ("kernel", "embedding")
    return jax.tree_util.tree_map_with_path(is_matrix, params)


def clip_by_global_norm(grads: Any, *, grad_norm: jax.Array, max_norm: float | None) -> Any:
    """`grads` scaled to the global norm `max_norm` where their global norm `grad_norm` exceeds it
    (unchanged when `max_norm` is 0 or None).

    optax.clip_by_global_norm's arithmetic, given the norm the train step computes anyway: one
    pass over the gradients fewer, and the step clips before its guarded update, where XLA can
    scale the gradients in place (inside the update it kept a float32 copy of every gradient).
    """
    if not max_norm:
        return grads
    trigger = grad_norm < max_norm
    return jax.tree.map(lambda g: jax.lax.select(trigger, g, (g / grad_norm.astype(g.dtype)) * max_norm), grads)


def _with_clipping_slot(tx: optax.GradientTransformation, clip_grad_norm: float | None) -> optax.GradientTransformation:
    """`tx` behind the empty state slot of `optax.chain(optax.clip_by_global_norm(...), tx)` when
    clipping is on, so the optimizer state (and its checkpoints) keep that layout; the clipping
    itself is the train step's (`clip_by_global_norm`)."""
    return optax.chain(optax.identity(), tx) if clip_grad_norm else tx


def _check_schedule(problems: Problems, name: str, schedule: Any) -> None:
    if isinstance(schedule, Schedule):
        schedule.check(problems)
    else:
        problems.add(f"{name}.learning_rate", schedule, "must be a schedule: " + ", ".join(
            f"@{name}()" for name in SCHEDULES))


# Every optimizer config class, in the order they are defined: subclassing `Optimizer` registers
# one (gin binds it under its class name and the configuration reference documents it).
OPTIMIZERS: dict[str, type["Optimizer"]] = {}


class Optimizer:
    """Base of the optimizer configs `train.optimizer` takes: a frozen dataclass with a
    `learning_rate` schedule and `clip_grad_norm` (None: no clipping)."""

    learning_rate: Any
    clip_grad_norm: float | None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        OPTIMIZERS.setdefault(cls.__name__, cls)  # the first of a name: gin's own subclass of it is not another

    def schedule(self, total_steps: int) -> optax.Schedule:
        """The learning rate of a run of `total_steps` optimizer steps."""
        return self.learning_rate.build(total_steps)

    def build(self, total_steps: int, logical_axes: Any = None) -> optax.GradientTransformation:
        """The optax transformation for a run of `total_steps` steps, without the gradient clipping
        (the train step clips: `clip_by_global_norm`). `logical_axes`: the params' logical PartitionSpecs."""
        raise NotImplementedError

    def check(self, problems: Problems) -> None:
        """Adds each bad value, named as gin binds it, to `problems`."""
        _check_schedule(problems, type(self).__name__, self.learning_rate)

    def state_note(self) -> str:
        """What it keeps per parameter, for `t5x-lite estimate`'s report."""
        return f"{type(self).__name__} state, float32, sharded like the params"


@dataclasses.dataclass(frozen=True)
class AdamW(Optimizer):
    """AdamW with a learning-rate schedule and global-norm clipping (bound in gin/runs/pretrain.gin).

    Attributes:
      learning_rate: the schedule, e.g. @WarmupCosine() (the default: its own defaults).
      b1: Adam's first-moment decay rate.
      b2: Adam's second-moment decay rate.
      eps: Adam's epsilon.
      weight_decay: decoupled weight decay, applied to matrices only (not norms' scales).
      clip_grad_norm: clip gradients to this global norm; 0 or None disables clipping.
    """

    learning_rate: Any = WarmupCosine()
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_grad_norm: float | None = 1.0

    def build(self, total_steps: int, logical_axes: Any = None) -> optax.GradientTransformation:
        """The optax transformation for a run of `total_steps` optimizer steps (`logical_axes` unused).

        Without the gradient clipping: the train step clips (`clip_by_global_norm`)."""
        del logical_axes
        adamw = optax.adamw(self.schedule(total_steps), b1=self.b1, b2=self.b2, eps=self.eps,
                            weight_decay=self.weight_decay, mask=weight_decay_mask)
        return _with_clipping_slot(adamw, self.clip_grad_norm)

    def state_note(self) -> str:
        return "AdamW mu and nu, float32, sharded like the params"

    def check(self, problems: Problems) -> None:
        """Adds each bad value, named as gin binds it, to `problems`."""
        _check_schedule(problems, "AdamW", self.learning_rate)
        problems.number("AdamW.b1", self.b1, low=0, high=1, high_open=True)
        problems.number("AdamW.b2", self.b2, low=0, high=1, high_open=True)
        problems.number("AdamW.eps", self.eps, low=0, low_open=True)
        problems.number("AdamW.weight_decay", self.weight_decay, low=0)
        problems.number("AdamW.clip_grad_norm", self.clip_grad_norm, low=0, optional=True)


@dataclasses.dataclass(frozen=True)
class Adafactor(Optimizer):
    """Adafactor as t5x trains T5: factored second moments, no momentum, update clipping, steps
    relative to each parameter's scale (`optax.adafactor`, applied per layer: adafactor.py).

    Defaults are t5x's: decay_rate 0.8, clipping_threshold 1.0, multiply_by_parameter_scale, no
    momentum, epsilon1 1e-30 (`eps`; the parameter-scale floor is optax's 1e-3, t5x's epsilon2),
    min_dim_size_to_factor 128, no weight decay, and the rsqrt schedule
    (gin/optimizers/adafactor_t5.gin writes the recipe out).

    Attributes:
      learning_rate: the schedule, e.g. @RsqrtDecay() (the default: t5x's base 1.0, 10,000 warmup steps).
      decay_rate: exponent of the second-moment decay, 1 - (step + 1)^-decay_rate.
      step_offset: steps subtracted from the step in that decay (to restart it when fine-tuning).
      clipping_threshold: clip each layer's update to this RMS; None disables it.
      multiply_by_parameter_scale: scale each layer's update by the RMS of its parameter (at least 1e-3).
      momentum: first-moment decay rate (t5x's beta1); None keeps no first moment.
      weight_decay: decoupled weight decay on matrices only (not norms' scales); 0 disables it.
      eps: added to the squared gradients (t5x's epsilon1).
      factored: factor the second moments of matrices; False keeps a full second moment everywhere.
      min_dim_size_to_factor: factor a matrix only when both its sides have at least this many elements.
      clip_grad_norm: clip gradients to this global norm first; 0 or None disables it (t5x's default).
    """

    learning_rate: Any = RsqrtDecay()
    decay_rate: float = 0.8
    step_offset: int = 0
    clipping_threshold: float | None = 1.0
    multiply_by_parameter_scale: bool = True
    momentum: float | None = None
    weight_decay: float = 0.0
    eps: float = 1e-30
    factored: bool = True
    min_dim_size_to_factor: int = 128
    clip_grad_norm: float | None = None

    def build(self, total_steps: int, logical_axes: Any = None) -> optax.GradientTransformation:
        """The optax transformation for a run of `total_steps` steps on params with these
        `logical_axes` (their tree of logical PartitionSpecs, e.g. placement.params_abstract's).
        Without the gradient clipping: the train step clips (`clip_by_global_norm`)."""
        if logical_axes is None:
            raise ValueError("Adafactor.build needs the params' logical axes: it factors and scales each "
                             "layer's matrix by them (Trainer.for_run passes them).")
        tx = adafactor.layerwise_adafactor(
            logical_axes, learning_rate=self.schedule(total_steps), decay_rate=self.decay_rate,
            step_offset=self.step_offset, clipping_threshold=self.clipping_threshold,
            multiply_by_parameter_scale=self.multiply_by_parameter_scale, momentum=self.momentum,
            weight_decay=self.weight_decay, weight_decay_mask=weight_decay_mask, eps=self.eps,
            factored=self.factored, min_dim_size_to_factor=self.min_dim_size_to_factor)
        return _with_clipping_slot(tx, self.clip_grad_norm)

    def state_note(self) -> str:
        momentum = ", a first moment per parameter" if self.momentum is not None else ""
        return f"Adafactor row and column second moments per layer matrix, full for vectors{momentum}; float32"

    def check(self, problems: Problems) -> None:
        """Adds each bad value, named as gin binds it, to `problems`."""
        _check_schedule(problems, "Adafactor", self.learning_rate)
        problems.number("Adafactor.decay_rate", self.decay_rate, low=0)
        problems.integer("Adafactor.step_offset", self.step_offset, minimum=0)
        problems.number("Adafactor.clipping_threshold", self.clipping_threshold, low=0, low_open=True, optional=True)
        problems.boolean("Adafactor.multiply_by_parameter_scale", self.multiply_by_parameter_scale)
        problems.number("Adafactor.momentum", self.momentum, low=0, high=1, high_open=True, optional=True)
        problems.number("Adafactor.weight_decay", self.weight_decay, low=0)
        problems.number("Adafactor.eps", self.eps, low=0, low_open=True)
        problems.boolean("Adafactor.factored", self.factored)
        problems.integer("Adafactor.min_dim_size_to_factor", self.min_dim_size_to_factor)
        problems.number("Adafactor.clip_grad_norm", self.clip_grad_norm, low=0, optional=True)


def check_optimizer(problems: Problems, optimizer: Any) -> None:
    """Adds each bad value of `train.optimizer` (and of its schedule) to `problems`."""
    if isinstance(optimizer, Optimizer):
        optimizer.check(problems)
    else:
        problems.add("train.optimizer", optimizer, "must be " + " or ".join(f"@{name}()" for name in OPTIMIZERS))


def state_logical_specs(optimizer: optax.GradientTransformation, opt_state: Any, params: Any,
                        param_specs: Any) -> Any:
    """The logical PartitionSpec of every array of an optimizer state (shapes, e.g. from eval_shape).

    Adafactor's per-layer states get theirs from adafactor.state_specs (their factored statistics
    are not shaped like the params); elsewhere every copy of the params' tree in the state (Adam's
    moments) is split like the params, and everything else (counters) is replicated.
    """
    def is_layerwise(x):
        return isinstance(x, adafactor.LayerwiseState)

    if any(is_layerwise(x) for x in jax.tree.leaves(opt_state, is_leaf=is_layerwise)):
        return jax.tree.map(lambda x: adafactor.state_specs(x, params, param_specs) if is_layerwise(x)
                            else PartitionSpec(), opt_state, is_leaf=is_layerwise)
    return optax.tree_map_params(
        optimizer, lambda _, spec: spec, opt_state, param_specs,
        transform_non_params=lambda _: PartitionSpec(),
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )
