"""Adafactor layer by layer: `optax.adafactor` applied to each parameter as t5x applies its own.

optax's Adafactor sees each leaf of the params tree as one block. Two things then go wrong for
this package's models, and t5x's own Adafactor gets both right through its logical factor rules:

* Scanned layers. `scan_with_axes` stacks a block's parameters on a leading `layers` axis. A
  stacked kernel is L matrices, not one array: its second-moment factors, its update clipping
  (`clipping_threshold`, on the RMS of the update) and its parameter scale (the parameter's RMS)
  must each be computed per layer, or a scanned model and the same model unrolled
  (`scan_layers=False`) train differently. Here every stacked leaf runs optax's transformation
  under `jax.vmap` over its `layers` axis: each layer is its own matrix, exactly as unrolled.
* Which dims are factored. optax factors the two largest dims of a leaf, treating any others
  as independent rows; for an attention kernel [embed, heads, head_dim] that depends on which of
  heads and head_dim is larger. Here a kernel is factored as the 2-D matrix it applies, split at
  its `embed` axis: [embed] x [heads * head_dim] for query/key/value, [heads * head_dim] x [embed]
  for the output projection, [embed] x [mlp], [vocab] x [embed]. This is t5x's
  `standard_logical_factor_rules` (embed is ROW; heads, kv, mlp, vocab are COLUMN; layers is
  BATCH): the second-moment row and column statistics are the same numbers. A leaf without an
  `embed` axis (norm scales, T5's relative position biases) keeps a full second moment, as in t5x.
  A matrix is factored when both its sides have at least `min_dim_size_to_factor` elements, the
  rule t5x applies to 2-D parameters, here applied alike to scanned and unrolled models (t5x
  itself factors any parameter with an explicit rule, scanned ones included, whatever its size).

The state keeps each parameter's own optax.adafactor state in the params' tree (`LayerwiseState`),
its arrays laid out per layer matrix: stacked ones batched on a leading layers axis, a factored
kernel's `v_row` / `v_col` one vector per side of each layer's matrix. `state_specs` gives their
logical PartitionSpecs: each statistic keeps the logical axis of the side it describes (a merged
side, heads x head_dim, takes its leading axis), so FSDP and tensor meshes split it as they split
the parameter; counters and the placeholder (1,) arrays are replicated.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

LAYERS_AXIS = "layers"
MATRIX_SPLIT_AXIS = "embed"


@dataclasses.dataclass(frozen=True)
class MatrixView:
    """How Adafactor sees one parameter.

    Attributes:
      layer_axis: the axis of stacked layers (vmapped over), or None.
      split: each layer's dims [:split] form the matrix's first side and [split:] its second;
        None when the parameter is no matrix (no `embed` axis, or it does not lead or trail).
      factored: whether the second moment is factored (else a full one is kept).
    """

    layer_axis: int | None
    split: int | None
    factored: bool


def matrix_split(axes: Sequence[str | None]) -> int | None:
    """Where one layer's dims split into the two sides of the matrix they form: at `embed`, which
    must lead or trail (None when it does not, or there is nothing on the other side)."""
    embed = [i for i, name in enumerate(axes) if name == MATRIX_SPLIT_AXIS]
    if not embed or len(embed) == len(axes):
        return None
    if embed == list(range(len(embed))):
        return len(embed)
    if embed == list(range(len(axes) - len(embed), len(axes))):
        return len(axes) - len(embed)
    return None


def matrix_view(axes: Sequence[str | None] | None, shape: Sequence[int], *, factored: bool,
                min_dim_size_to_factor: int) -> MatrixView:
    """The view of a parameter of this shape and these logical axes (None: unnamed dims)."""
    axes = tuple(axes) if axes is not None else (None,) * len(shape)
    if len(axes) != len(shape):
        raise ValueError(f"Logical axes {axes} do not match the parameter's shape {tuple(shape)}.")
    layer_axis = axes.index(LAYERS_AXIS) if LAYERS_AXIS in axes else None
    layer_axes = [a for i, a in enumerate(axes) if i != layer_axis]
    layer_shape = [d for i, d in enumerate(shape) if i != layer_axis]
    split = matrix_split(layer_axes)
    sides = (math.prod(layer_shape[:split]), math.prod(layer_shape[split:])) if split else (0, 0)
    return MatrixView(layer_axis=layer_axis, split=split,
                      factored=bool(factored and split and min(sides) >= min_dim_size_to_factor))


def _as_matrix(x: jax.Array, view: MatrixView) -> jax.Array:
    """One layer of a parameter (or of its gradient) as the matrix Adafactor factors."""
    if not view.factored:
        return x
    return x.reshape(math.prod(x.shape[:view.split]), math.prod(x.shape[view.split:]))


class LayerwiseState(NamedTuple):
    """Each parameter's optax.adafactor state, in the params' tree (stacked layers on axis 0)."""

    per_param: Any


def _counter_axes(state_shapes: Any) -> Any:
    """vmap axes of one layer's state: counters (integers, shared by all layers) unbatched."""
    return jax.tree.map(lambda x: None if jnp.issubdtype(x.dtype, jnp.integer) else 0, state_shapes)


def _per_parameter(inner: optax.GradientTransformation, view: MatrixView, like: Any):
    """(init, update) of one parameter: `inner` on each layer's matrix, vmapped over the layers."""

    def init(param):
        return inner.init(_as_matrix(param, view))

    def update(grad, state, param):
        new, state = inner.update(_as_matrix(grad, view), state, _as_matrix(param, view))
        return new.reshape(grad.shape), state

    if view.layer_axis is None:
        return init, update
    layer = jax.ShapeDtypeStruct(tuple(d for i, d in enumerate(like.shape) if i != view.layer_axis), like.dtype)
    axes = _counter_axes(jax.eval_shape(init, layer))
    return (jax.vmap(init, in_axes=view.layer_axis, out_axes=axes),
            jax.vmap(update, in_axes=(view.layer_axis, axes, view.layer_axis), out_axes=(view.layer_axis, axes)))


def layerwise_adafactor(
    logical_axes: Any, *, learning_rate: optax.Schedule, decay_rate: float = 0.8, step_offset: int = 0,
    clipping_threshold: float | None = 1.0, multiply_by_parameter_scale: bool = True,
    momentum: float | None = None, weight_decay: float = 0.0,
    weight_decay_mask: Callable[[Any], Any] | None = None, eps: float = 1e-30, factored: bool = True,
    min_dim_size_to_factor: int = 128,
) -> optax.GradientTransformation:
    """`optax.adafactor` with these settings, applied to each layer of each parameter as its own
    matrix (see the module docstring). `logical_axes` is the params' tree of logical
    PartitionSpecs (the model's `params_axes`); weight decay applies where `weight_decay_mask(params)`
    is True (all leaves when None)."""

    def transformations(params):
        leaves, treedef = jax.tree.flatten(params)
        axes = treedef.flatten_up_to(logical_axes)
        decays = (treedef.flatten_up_to(weight_decay_mask(params)) if weight_decay_mask else [True] * len(leaves))
        result = []
        for leaf, leaf_axes, decay in zip(leaves, axes, decays):
            view = matrix_view(leaf_axes, leaf.shape, factored=factored, min_dim_size_to_factor=min_dim_size_to_factor)
            inner = optax.adafactor(
                learning_rate=learning_rate, min_dim_size_to_factor=min_dim_size_to_factor, decay_rate=decay_rate,
                decay_offset=step_offset, multiply_by_parameter_scale=multiply_by_parameter_scale,
                clipping_threshold=clipping_threshold, momentum=momentum,
                weight_decay_rate=weight_decay if (weight_decay and decay) else None, eps=eps,
                factored=view.factored)
            result.append(_per_parameter(inner, view, leaf))
        return leaves, treedef, result

    def init(params):
        leaves, treedef, fns = transformations(params)
        states = [leaf_init(leaf) for leaf, (leaf_init, _) in zip(leaves, fns)]
        return LayerwiseState(jax.tree.unflatten(treedef, states))

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("Adafactor's update needs the params (its parameter scale is their RMS).")
        leaves, treedef, fns = transformations(params)
        grads, states = treedef.flatten_up_to(updates), treedef.flatten_up_to(state.per_param)
        out = [leaf_update(g, s, p) for g, s, p, (_, leaf_update) in zip(grads, states, leaves, fns)]
        return (jax.tree.unflatten(treedef, [u for u, _ in out]),
                LayerwiseState(jax.tree.unflatten(treedef, [s for _, s in out])))

    return optax.GradientTransformation(init, update)


# --------------------------------------------------------------------------- shardings


def _factored_sides(matrix_shape: tuple[int, int]) -> tuple[int, int]:
    """optax's (d1, d0) of a factored matrix: v_row keeps side d1, v_col keeps side d0."""
    order = np.argsort(matrix_shape)
    return int(order[-2]), int(order[-1])


def _parameter_specs(leaf_state: Any, shape: Sequence[int], spec: Any) -> Any:
    """Logical PartitionSpecs of one parameter's state, from the parameter's own."""
    axes = tuple(spec) if spec is not None else (None,) * len(shape)
    layer_axis = axes.index(LAYERS_AXIS) if LAYERS_AXIS in axes else None
    lead = () if layer_axis is None else (axes[layer_axis],)
    lead_shape = () if layer_axis is None else (shape[layer_axis],)
    layer_axes = tuple(a for i, a in enumerate(axes) if i != layer_axis)
    layer_shape = tuple(d for i, d in enumerate(shape) if i != layer_axis)
    factored_states = [x for x in jax.tree.leaves(leaf_state, is_leaf=lambda x: isinstance(x, optax.FactoredState))
                       if isinstance(x, optax.FactoredState)]
    factored = bool(factored_states) and tuple(factored_states[0].v.shape) != lead_shape + layer_shape
    split = matrix_split(layer_axes) if factored else None
    if split:
        sides_axes = (layer_axes[0], layer_axes[split])  # a merged side takes its leading axis
        sides_shape = (math.prod(layer_shape[:split]), math.prod(layer_shape[split:]))
        d1, d0 = _factored_sides(sides_shape)
        row, col = PartitionSpec(*lead, sides_axes[d1]), PartitionSpec(*lead, sides_axes[d0])
        full_axes, full_shape = sides_axes, sides_shape
    else:
        row = col = PartitionSpec()
        full_axes, full_shape = layer_axes, layer_shape
    full = PartitionSpec(*lead, *full_axes)

    def of(x):
        if isinstance(x, optax.FactoredState):
            return optax.FactoredState(count=PartitionSpec(), v_row=row if split else PartitionSpec(),
                                       v_col=col if split else PartitionSpec(), v=PartitionSpec() if split else full)
        return full if tuple(x.shape) == lead_shape + tuple(full_shape) else PartitionSpec()

    return jax.tree.map(of, leaf_state, is_leaf=lambda x: isinstance(x, optax.FactoredState))


def state_specs(state: LayerwiseState, params: Any, param_specs: Any) -> LayerwiseState:
    """Logical PartitionSpecs of a `LayerwiseState`, from the params' shapes and logical specs."""
    leaves, treedef = jax.tree.flatten(params)
    specs = treedef.flatten_up_to(param_specs)
    states = treedef.flatten_up_to(state.per_param)
    return LayerwiseState(jax.tree.unflatten(
        treedef, [_parameter_specs(s, leaf.shape, spec) for s, leaf, spec in zip(states, leaves, specs)]))
