"""One place for layer stacking: `scan_with_axes` (or a plain loop) and remat policies."""

from __future__ import annotations

from typing import Any, Callable

import jax
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning

# Remat policies by name. `none` keeps every activation; `full` recomputes the whole block in
# the backward pass; the others save the named intermediates and recompute the rest.
REMAT_POLICIES: dict[str, Callable[..., Any] | None] = {
    "none": None,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_dots": jax.checkpoint_policies.checkpoint_dots,
    "full": jax.checkpoint_policies.nothing_saveable,
}


def remat_policy(name: str) -> Callable[..., Any] | None:
    """The jax checkpoint policy called `name`; a clear error lists the valid names."""
    if name not in REMAT_POLICIES:
        raise ValueError(f"Unknown remat_policy {name!r}; choose one of {sorted(REMAT_POLICIES)}.")
    return REMAT_POLICIES[name]


def stack_layers(
    block: type[nn.Module],
    *,
    num_layers: int,
    scan: bool,
    remat: str,
    name: str = "layers",
) -> Callable[..., nn.Module]:
    """Returns a factory for `num_layers` copies of `block` applied in sequence.

    `block(...)(x, *broadcast_args)` must return `(x, None)`. With `scan=True` the copies share
    one traced body and their parameters gain a leading `layers` axis; with `scan=False` they
    are separate submodules `{name}_0 ... {name}_{n-1}`. Both compute the same function.
    """
    policy = remat_policy(remat)
    layer_cls = block
    if remat != "none":
        # prevent_cse is only needed outside scan; inside scan it blocks useful optimisation.
        layer_cls = nn.remat(block, policy=policy, prevent_cse=not scan)

    if scan:

        def make_scanned(*args, **kwargs):
            scanned = nn_partitioning.scan_with_axes(
                layer_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=num_layers,
                axis_name="layers",
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
