"""One place for layer stacking: `scan_with_axes` (or a plain loop) and remat policies."""

from __future__ import annotations

from typing import Any, Callable

import jax
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning

from t5x_lite.errors import ConfigValueError
from t5x_lite.models import layers

_policies = jax.checkpoint_policies
# Activations tagged with checkpoint_name in layers.Attention.
QKV_NAMES = ("query_proj", "key_proj", "value_proj")

# Remat policies by name. `none` keeps every activation; `full` recomputes the whole block in
# the backward pass; the others save the named intermediates and recompute the rest:
#   minimal        the projections' outputs (q, k, v, attention out, MLP): matmuls without batch dims
#   save_dots      every matmul output: the projections, and the attention scores of the 'xla'
#                  implementation ('explicit', 'explicit_blas' and 'cudnn' attention is recomputed)
#   save_qkv_proj  only the q, k and v projections
# Projections are found by their name (layers.PROJECTION_NAME): their dot sits inside a
# custom_vjp (projection.py), which jax's dot-matching policies do not look into.
# The `_offloaded` variants keep the same activations in pinned host memory instead of on
# the device (backends with a `pinned_host` memory space: GPU and TPU).
_PROJECTIONS = _policies.save_only_these_names(layers.PROJECTION_NAME)
REMAT_POLICIES: dict[str, Callable[..., Any] | None] = {
    "none": None,
    "minimal": _policies.save_from_both_policies(_PROJECTIONS, _policies.dots_with_no_batch_dims_saveable),
    "save_dots": _policies.save_from_both_policies(_PROJECTIONS, _policies.checkpoint_dots),
    "save_qkv_proj": _policies.save_only_these_names(*QKV_NAMES),
    "full": _policies.nothing_saveable,
    "minimal_offloaded": _policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=[layers.PROJECTION_NAME],
        offload_src="device", offload_dst="pinned_host"),
    "qkv_proj_offloaded": _policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(QKV_NAMES),
        offload_src="device", offload_dst="pinned_host"),
}
OFFLOADING_POLICIES = ("minimal_offloaded", "qkv_proj_offloaded")


def remat_policy(name: str) -> Callable[..., Any] | None:
    """The jax checkpoint policy called `name`; a clear error lists the valid names."""
    if name not in REMAT_POLICIES:
        raise ConfigValueError(f"Unknown remat_policy {name!r}; choose one of {list(REMAT_POLICIES)}.")
    return REMAT_POLICIES[name]


def check_backend_supports(name: str, device: jax.Device | None = None) -> None:
    """Fails clearly when an offloading policy is asked of a device without pinned host memory."""
    if name not in OFFLOADING_POLICIES:
        return
    device = device or jax.devices()[0]
    kinds = {memory.kind for memory in device.addressable_memories()}
    if "pinned_host" not in kinds:
        raise ConfigValueError(
            f"remat_policy {name!r} offloads activations to pinned host memory, which the "
            f"{device.platform} backend does not have (memory kinds: {sorted(kinds)}); use "
            f"{name.replace('_offloaded', '')!r} instead."
        )


def stack_layers(
    block: type[nn.Module],
    *,
    num_layers: int,
    scan: bool,
    remat: str,
    num_broadcast: int,
    unroll: int = 1,
    name: str = "layers",
) -> Callable[..., nn.Module]:
    """Returns a factory for `num_layers` copies of `block` applied in sequence.

    `block(...)(x, *broadcast_args)` must return `(x, None)`, with `num_broadcast` arguments
    (masks, biases, encoder outputs) that every layer sees unchanged. With `scan=True` the copies share
    one traced body and their parameters gain a leading `layers` axis; with `scan=False` they
    are separate submodules `{name}_0 ... {name}_{n-1}`. Both compute the same function.
    `unroll` (scanned only) is how many layers one iteration of the compiled loop runs;
    `unroll >= num_layers` compiles straight-line code over the stacked parameters, as fast as
    unrolled layers for shallow models, with the scanned checkpoint layout.
    A 'cache' collection (decoding) is laid out like the params: scanned leaves gain a leading
    `layers` axis.
    """
    policy = remat_policy(remat)
    layer_cls = block
    if remat != "none":
        # prevent_cse keeps XLA from merging the backward pass's recomputation with the forward
        # pass (undoing remat) where both are straight-line code: unrolled layers, or a scan
        # compiled without its loop (unroll > 1). Inside a loop it only blocks useful optimisation.
        layer_cls = nn.remat(block, policy=policy, prevent_cse=not scan or unroll != 1)

    if scan:

        def make_scanned(*args, **kwargs):
            scanned = nn_partitioning.scan_with_axes(
                layer_cls,
                # A decoding KV cache ('cache' collection) is stacked on the layer axis like the params.
                variable_axes={"params": 0, "cache": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast,) * num_broadcast,
                length=num_layers,
                unroll=unroll,
                axis_name="layers",
                axes_collections=("params", "cache"),
            )
            return scanned(*args, name=name, **kwargs)

        return make_scanned

    class Unrolled(nn.Module):
        layer_args: tuple
        layer_kwargs: dict

        @nn.compact
        def __call__(self, x, *broadcast):
            for i in range(num_layers):
                x, _ = layer_cls(*self.layer_args, name=f"{name}_{i}", **self.layer_kwargs)(x, *broadcast)
            return x, None

    def make_unrolled(*args, **kwargs):
        return Unrolled(args, kwargs, name=f"{name}_unrolled")

    return make_unrolled
