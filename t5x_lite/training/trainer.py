"""The jitted train and eval steps, and the sharded train state they update.

A step sees a global batch in seqio's feature names; the model's family computes its loss sums
and target weight (`BaseModel.loss_sums`, `loss_weight`: by default `decoder_target_tokens` and
`decoder_loss_weights` are the labels and every other feature is passed to the module by name),
so the same trainer serves every family. The loss is normalised per non-padding target token
over the whole global batch, so gradient accumulation and the device count do not change it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5x_lite.models import BaseModel
from t5x_lite.parallel import partitioning
from t5x_lite.parallel import placement as placement_lib
from t5x_lite.parallel.placement import Placement
from t5x_lite.training import optim

Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    """Everything a training step reads and writes; all of it is checkpointed."""

    step: jax.Array
    params: Any
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """How per-token losses become the training objective.

    Attributes:
      z_loss: coefficient of the log(Z)^2 auxiliary loss (0 disables it).
      label_smoothing: mass spread uniformly over the vocabulary (0 disables it).
    """

    z_loss: float = 0.0
    label_smoothing: float = 0.0


def model_inputs(batch: Batch) -> Batch:
    """The features a model reads (everything but the labels), by seqio name."""
    return BaseModel.model_inputs(batch)


def loss_sums(model: nn.Module, params: Any, batch: Batch, loss_config: LossConfig, *,
              deterministic: bool, rng=None) -> dict[str, jax.Array]:
    """Summed loss, z-loss and target weight of one (micro)batch, as the module's family computes them."""
    return model.config.loss_sums(params, batch, z_loss=loss_config.z_loss,
                                  label_smoothing=loss_config.label_smoothing, deterministic=deterministic,
                                  rng=rng, module=model)


def _unchanged(params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any]:
    del grads
    return params, opt_state


@dataclasses.dataclass
class Trainer:
    """Owns the model, optimizer and mesh; builds sharded state and compiled steps.

    `optimizer` is the optax transformation without gradient clipping; `clip_grad_norm` (the
    optimizer config's, see `for_run`) clips the gradients to that global norm before it. It has
    no default: an optimizer config's `build()` leaves the clipping out, so a trainer made from it
    by hand must pass the config's `clip_grad_norm` (None: no clipping) or would train unclipped.
    """

    model: nn.Module
    optimizer: optax.GradientTransformation
    learning_rate_fn: optax.Schedule
    clip_grad_norm: float | None
    placement: Placement | None = None  # where the state and batches live; else built from mesh and rules
    mesh: Mesh | None = None
    rules: partitioning.LogicalRules | None = None
    loss_config: LossConfig = LossConfig()
    microbatches: int = 1

    @classmethod
    def for_run(cls, *, model: Any, optimizer: Any, total_steps: int, placement: Placement | None = None,
                mesh: Mesh | None = None, rules: partitioning.LogicalRules | None = None,
                loss: LossConfig = LossConfig(), microbatches: int = 1) -> "Trainer":
        """The trainer of a run: the model config's module and the optimizer config's transformation
        and schedule built for `total_steps`, on `placement` (or a placement of `mesh` and `rules`)."""
        logical_axes = placement_lib.params_abstract(model)[1]
        return cls(model=model.make_module(), optimizer=optimizer.build(total_steps, logical_axes=logical_axes),
                   learning_rate_fn=optimizer.schedule(total_steps), placement=placement, mesh=mesh, rules=rules,
                   loss_config=loss,
                   microbatches=microbatches, clip_grad_norm=optimizer.clip_grad_norm)

    def __post_init__(self):
        if self.placement is None:
            self.placement = Placement(mesh=self.mesh, rules=tuple(self.rules or partitioning.DEFAULT_RULES))
        # One owner of the mesh, its rules (resolved for the mesh once) and the batch sharding.
        self.mesh, self.rules = self.placement.mesh, self.placement.rules
        self.batch_sharding = self.placement.batch_sharding
        self._replicated = NamedSharding(self.mesh, PartitionSpec())
        self.state_shardings = None
        self._train_step = None
        self._eval_step = None

    def place_batch(self, batch: dict[str, np.ndarray]) -> Batch:
        """A host batch, checked by the model's config (`check_batch`: bad input is refused here, on
        the host, before any step), as one global batch laid out over the mesh."""
        config = getattr(self.model, "config", None)
        if config is not None:
            config.check_batch(batch)
        return partitioning.host_batch_to_global(batch, self.batch_sharding)

    @contextlib.contextmanager
    def _context(self):
        """Mesh + logical rules, so `with_logical_constraint` inside the model resolves."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(tuple(self.rules)):
            yield

    def abstract_state(self, example_batch: Batch) -> TrainState:
        """Shapes and shardings of the train state, without allocating it.

        `example_batch` needs only the model's input features, with the global batch shape.
        """
        def init_variables(rng):
            return self.model.init(rng, **model_inputs(example_batch))

        with self._context():
            variables = jax.eval_shape(init_variables, jax.random.PRNGKey(0))
        param_specs = partitioning.params_logical_axes(variables["params_axes"])
        params = variables["params"]
        opt_state = jax.eval_shape(self.optimizer.init, params)
        # Adam's moments are split like the params; Adafactor's factored statistics (shaped unlike
        # the params) by the axis of the side they describe, its counters replicated.
        opt_specs = optim.state_logical_specs(self.optimizer, opt_state, params, param_specs)
        specs = TrainState(step=PartitionSpec(), params=param_specs, opt_state=opt_specs)
        self.state_shardings = partitioning.tree_shardings(specs, self.mesh, self.rules)
        shapes = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, opt_state=opt_state)
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, self.state_shardings
        )

    def replicated(self, value: Any) -> jax.Array:
        """A host value (the same in every process) as a global array copied to every device.

        With several processes, a jitted step takes only global arrays; a plain `jax.random.PRNGKey`
        lives on one local device.
        """
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, self._replicated, lambda index: value[index])

    def init_state(self, rng: jax.Array, example_batch: Batch) -> TrainState:
        """Initialises parameters and optimizer state directly in their shardings."""
        if self.state_shardings is None:
            self.abstract_state(example_batch)
        shapes = {k: (v.shape, v.dtype) for k, v in model_inputs(example_batch).items()}

        def init(rng):
            inputs = {k: jnp.zeros(shape, dtype) for k, (shape, dtype) in shapes.items()}
            params = self.model.init(rng, **inputs)["params"]
            return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(params))

        with self._context():
            return jax.jit(init, out_shardings=self.state_shardings)(self.replicated(rng))

    def _train_step_fn(self, state: TrainState, batch: Batch, dropout_rng: jax.Array):
        rng = jax.random.fold_in(dropout_rng, state.step)
        total_weight = jnp.maximum(self.model.config.loss_weight(batch), 1.0)

        def micro_loss(params, micro, micro_rng):
            sums = loss_sums(self.model, params, micro, self.loss_config, deterministic=False, rng=micro_rng)
            return sums["loss_sum"] / total_weight, sums

        grad_fn = jax.grad(micro_loss, has_aux=True)
        if self.microbatches == 1:
            grads, sums = grad_fn(state.params, batch, rng)
        else:
            micro_batches = jax.tree.map(
                lambda x: x.reshape(self.microbatches, -1, *x.shape[1:]), batch
            )

            def accumulate(carry, inputs):
                index, micro = inputs
                grads, sums = grad_fn(state.params, micro, jax.random.fold_in(rng, index))
                return jax.tree.map(jnp.add, carry, (grads, sums)), None

            zeros = jax.tree.map(jnp.zeros_like, (state.params, {
                "loss_sum": jnp.zeros(()), "z_loss_sum": jnp.zeros(()), "weight_sum": jnp.zeros(())}))
            (grads, sums), _ = jax.lax.scan(
                accumulate, zeros, (jnp.arange(self.microbatches), micro_batches)
            )

        grad_norm = optax.tree.norm(grads)
        # A step whose loss or gradients are not finite leaves parameters and optimizer state as
        # they were; the loop decides whether to stop. The update runs inside the conditional
        # (selecting between old and new state instead, XLA:CPU copied every donated moment before
        # overwriting it), the clipping before it (so the clipped gradients overwrite the raw ones).
        finite = jnp.isfinite(sums["loss_sum"]) & jnp.isfinite(grad_norm)
        grads = optim.clip_by_global_norm(grads, grad_norm=grad_norm, max_norm=self.clip_grad_norm)
        params, opt_state = jax.lax.cond(finite, self._updated, _unchanged, state.params, state.opt_state, grads)
        metrics = {
            "loss_sum": sums["loss_sum"],
            "z_loss_sum": sums["z_loss_sum"],
            "weight_sum": sums["weight_sum"],
            "grad_norm": grad_norm,
            "learning_rate": self.learning_rate_fn(state.step),
            "nonfinite_steps": 1.0 - finite.astype(jnp.float32),
        }
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def _updated(self, params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any]:
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def _jitted_train_step(self):
        if self._train_step is None:
            self._train_step = jax.jit(
                self._train_step_fn,
                in_shardings=(self.state_shardings, self.batch_sharding, self._replicated),
                out_shardings=(self.state_shardings, self._replicated),
                donate_argnums=(0,),
            )
        return self._train_step

    def train_step(self, state: TrainState, batch: Batch, dropout_rng: jax.Array):
        """One optimizer step on a global batch; returns the new state and device-side metrics."""
        with self._context():
            return self._jitted_train_step()(state, batch, dropout_rng)

    def lower_train_step(self, example_batch: Batch) -> jax.stages.Lowered:
        """The train step lowered for a batch of this shape, allocating nothing.

        `.compile()` on the result gives XLA's program, whose `memory_analysis()` and
        `cost_analysis()` describe the real step; `train_step` reuses the same jitted function.
        """
        abstract_state = self.abstract_state(example_batch)
        abstract_batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.batch_sharding)
                          for k, v in example_batch.items()}
        with self._context():
            return self._jitted_train_step().lower(abstract_state, abstract_batch, jax.random.PRNGKey(0))

    def _eval_step_fn(self, params: Any, batch: Batch):
        return loss_sums(self.model, params, batch, LossConfig(), deterministic=True)

    def eval_step(self, params: Any, batch: Batch) -> dict[str, jax.Array]:
        """Summed cross entropy and token count of a global batch (no z-loss, no dropout)."""
        if self._eval_step is None:
            self._eval_step = jax.jit(
                self._eval_step_fn,
                in_shardings=(self.state_shardings.params, self.batch_sharding),
                out_shardings=self._replicated,
            )
        with self._context():
            return self._eval_step(params, batch)


def compiled_memory_bytes(stats: Any) -> dict[str, int]:
    """Bytes of a compiled step's `memory_analysis()` (XLA's buffer assignment per device).

    `total` is the usual estimate of the step's peak: arguments + outputs - aliased (donated)
    + temp. XLA's own `peak_memory_in_bytes` is kept as `xla_peak`; on CPU it leaves out temp
    (0 where the backend does not report it).
    """
    arg, out, alias, temp = (stats.argument_size_in_bytes, stats.output_size_in_bytes,
                             stats.alias_size_in_bytes, stats.temp_size_in_bytes)
    return {"arguments": arg, "outputs": out, "aliased": alias, "temp": temp, "total": arg + out - alias + temp,
            "xla_peak": getattr(stats, "peak_memory_in_bytes", 0),
            "host_temp": getattr(stats, "host_temp_size_in_bytes", 0)}
