"""The layer layout a run compiles when `scan_unroll='auto'`: the scanned loop, or no loop at all.

Scanned layers (`scan_layers=True`) keep one stacked parameter layout whatever `scan_unroll` says;
it sets only how many layers one iteration of the compiled loop runs, and `num_layers` compiles
no loop (docs/models.md, "Scanned or unrolled layers"). Without the loop a model of moderate depth
trains faster on a GPU, but XLA then keeps every layer's saved activations at once and, under
FSDP, gathers every layer's weights at once. `choose` decides once, at start-up, in this order:

- the backend: on CPU the loop (compile time dominates there); on other non-GPU backends the
  loop too (unrolling was measured on GPUs only);
- the mesh: the loop when an axis that shards the parameters (`fsdp`, `tensor`: any axis but
  `replica` and `data`) has more than one device;
- the device's memory: no loop when the step without it (`unrolled_step_bytes`: the estimate's
  arithmetic) takes at most FITS_FRACTION of what one device may allocate; else the loop.

Pure functions: the train loop gives them the platform, the mesh shape, the device's memory
(`placement.device_memory_bytes`) and the train state's bytes (training/startup.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from t5x_lite.models import activation_memory

# No loop when the step without it takes at most this share of a device's memory: the activation
# arithmetic is rough (XLA's compiled step took up to 1.39x of it: docs/estimate.md, "Limits").
FITS_FRACTION = 0.7
# Mesh axes that split only the batch: every device holds the whole parameters.
BATCH_ONLY_AXES = ("replica", "data")
GIB = 2**30


@dataclasses.dataclass(frozen=True)
class LayerLayout:
    """The `scan_unroll` chosen (1: the loop; num_layers: no loop) and why, in a few words."""

    scan_unroll: int
    reason: str

    def describe(self) -> str:
        """'scanned (cpu backend)' or 'unrolled x24 (fits: ~31 GiB of 141 GiB)', for the start-up line."""
        kind = "scanned" if self.scan_unroll == 1 else f"unrolled x{self.scan_unroll}"
        return f"{kind} ({self.reason})"


def size(n: float) -> str:
    """Bytes in words: '141 GiB', '8.7 GiB', '512 MiB'."""
    if n >= 10 * GIB:
        return f"{n / GIB:,.0f} GiB"
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:,.0f} MiB"


def choose(*, platform: str, mesh_shape: Mapping[str, int], num_layers: int | None, device_bytes: int | None,
           unrolled_bytes: Callable[[], float]) -> LayerLayout:
    """The layout for `scan_unroll='auto'` on `platform` ('cpu', 'gpu', 'tpu') and a mesh of
    `mesh_shape` ({axis: size}), for a model whose deepest stack has `num_layers` layers (None:
    a family without the activation arithmetic, `BaseModel.activation_stacks`).

    `device_bytes`: what one device may allocate (None: unknown); `unrolled_bytes`: the bytes per
    device of the step without the loop, called only when the backend and mesh leave the choice to
    the device's memory.
    """
    if platform != "gpu":
        return LayerLayout(1, f"{platform} backend")
    sharded = [f"{axis} axis of {size}" for axis, size in mesh_shape.items()
               if axis not in BATCH_ONLY_AXES and size > 1]
    if sharded:
        return LayerLayout(1, ", ".join(sharded))
    if num_layers is None:
        return LayerLayout(1, "no activation arithmetic for this model family")
    if num_layers <= 1:
        return LayerLayout(1, "one layer: no loop either way")
    if device_bytes is None:
        return LayerLayout(1, "the device's memory is unknown")
    needed = unrolled_bytes()
    if needed > FITS_FRACTION * device_bytes:
        return LayerLayout(1, f"unrolled would need ~{size(needed)} of {size(device_bytes)}")
    return LayerLayout(num_layers, f"fits: ~{size(needed)} of {size(device_bytes)}")


def num_layers(model: Any) -> int:
    """Layers of the model's deepest stack (`BaseModel.activation_stacks`): the `scan_unroll` that
    compiles no loop for any of its stacks."""
    return max(int(stack["num_layers"]) for stack in model.activation_stacks(rows=1, length=1, inputs_length=1))


def unrolled_step_bytes(model: Any, *, rows: int, length: int, inputs_length: int | None, state_bytes: float,
                        gradient_bytes: float, platform: str) -> float:
    """Bytes per device of the train step without the loop, on a mesh that splits only the batch.

    What `t5x-lite estimate` adds up for remat_policy 'none', whatever the policy: the train state
    (`state_bytes`: params, optimizer state, step), the gradients (`gradient_bytes`), every layer's
    saved activations for `rows` rows of `length` tokens (and `inputs_length` encoder tokens) in
    the compute dtype, and the logits. Without the loop remat frees little (docs/models.md,
    "Scanned or unrolled layers"), so this counts as if nothing were recomputed.
    """
    dtype_bytes = model.compute_dtype.itemsize
    attention = model.attention(platform=platform)
    activations = 0.0
    for stack in model.activation_stacks(rows=rows, length=length, inputs_length=inputs_length):
        activations += activation_memory.activation_bytes(
            policy="none", attention=attention, dtype_bytes=dtype_bytes, saved_bytes=dtype_bytes,
            num_layers=stack["num_layers"], tokens=stack["tokens"], width=stack["width"], mlp=stack["mlp"],
            n_mlp_in=stack["n_mlp_in"], q=stack["q"], kv=stack["kv"], scores=stack["scores"],
            attention_blocks=stack.get("attention_blocks", 1))[0]
    logits = activation_memory.logits_bytes(tokens=rows * length, vocab_size=model.vocab_size, vocab_shards=1)
    return state_bytes + gradient_bytes + activations + logits
