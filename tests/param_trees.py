"""Param-tree helpers shared by tests that compare a scanned model with its unrolled twin."""

import jax


def unrolled_params(params):
    """A scanned model's params for its unrolled twin: every `layers` [layers, ...] subtree sliced per layer."""
    if not isinstance(params, dict):
        return params
    out = {k: unrolled_params(v) for k, v in params.items() if k != "layers"}
    if "layers" in params:
        num_layers = jax.tree.leaves(params["layers"])[0].shape[0]
        out["layers_unrolled"] = {f"layers_{i}": jax.tree.map(lambda x, i=i: x[i], params["layers"])
                                  for i in range(num_layers)}
    return out
