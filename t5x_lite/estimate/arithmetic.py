"""The arithmetic of `t5x-lite estimate`: mesh shapes, shards, FLOPs, epochs, time; activations and
logits from models/activation_memory.py.

Pure functions of explicit keyword arguments, tested directly; docs/estimate.md writes out each
formula.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from t5x_lite.errors import ConfigValueError
# The activation and logits arithmetic lives with the models (the layer-layout choice at start-up
# reads it too); the estimate reads it under these names.
from t5x_lite.models.activation_memory import (  # noqa: F401
    LOGITS_BUFFERS, activation_bytes, logits_bytes, mlp_hidden_arrays, saved_activation_bytes, score_bytes)
from t5x_lite.parallel.partitioning import mesh_axes_of


def resolve_mesh_shape(*, mesh_axes: Mapping[str, int] | Sequence[tuple[str, int]], num_devices: int) -> dict[str, int]:
    """{axis: size} with the one -1 axis (if any) taking the devices the fixed axes leave.

    Fails (ConfigValueError) where `num_devices` cannot be laid out as `mesh_axes` asks.
    """
    items = list(mesh_axes.items()) if isinstance(mesh_axes, Mapping) else [tuple(a) for a in mesh_axes]
    sizes = [size for _, size in items]
    if sizes.count(-1) > 1:
        raise ConfigValueError(f"MESH_AXES {dict(items)}: at most one axis may have size -1.")
    if any(size < 1 and size != -1 for size in sizes):
        raise ConfigValueError(f"MESH_AXES {dict(items)}: sizes must be positive (or -1 for the rest).")
    fixed = math.prod(size for size in sizes if size != -1)
    if -1 in sizes:
        if num_devices % fixed:
            raise ConfigValueError(
                f"--num_devices={num_devices} cannot be used by MESH_AXES {dict(items)}: the fixed axes "
                f"need a multiple of {fixed} devices.")
        sizes[sizes.index(-1)] = num_devices // fixed
    elif fixed != num_devices:
        raise ConfigValueError(f"MESH_AXES {dict(items)} need exactly {fixed} devices, not --num_devices="
                               f"{num_devices}; set one axis to -1 or change the sizes.")
    return {name: size for (name, _), size in zip(items, sizes)}


def spec_shards(spec: Sequence[Any], mesh_shape: Mapping[str, int]) -> tuple[int, ...]:
    """How many ways each dimension is split by a mesh PartitionSpec (entries None, 'axis' or ('a', 'b'))."""
    return tuple(math.prod(mesh_shape.get(name, 1) for name in mesh_axes_of(entry)) for entry in spec)


def per_device_elements(*, shape: Sequence[int], shards: Sequence[int]) -> int:
    """Elements of the largest shard of an array: prod(ceil(dim / shards)) (XLA pads uneven shards)."""
    shards = tuple(shards) + (1,) * (len(shape) - len(shards))
    return math.prod(-(-dim // s) for dim, s in zip(shape, shards))


def without_axes(spec: Sequence[Any], axes: Sequence[str]) -> tuple[Any, ...]:
    """A PartitionSpec with the mesh axes `axes` taken out: the layout of an array once gathered over them."""
    return tuple(tuple(n for n in mesh_axes_of(entry) if n not in axes) or None for entry in spec)


def gathered_bytes(*, unscanned: Sequence[float], layer_stacks: Sequence[float]) -> float:
    """Bytes of the whole weights a step materialises when parameters are sharded over batch axes (FSDP).

    unscanned: bytes of each unscanned array that is sharded over a batch axis, once gathered;
    layer_stacks: for each scanned stack, the bytes of one layer's gathered arrays. Counted where
    the step peaks, with every saved activation still live: outside the layer loops, at the loss
    and the logits' backward pass, the unscanned arrays are whole on each device (gathered, or as
    gradients not yet reduced), the largest once more (compiled steps on 8 host devices:
    bench/NOTES.md, large models); inside a loop one layer's gathered weights and their whole
    gradient, which count instead when larger.
    """
    outside = sum(unscanned) + max(unscanned, default=0.0)
    return max(outside, 2 * max(layer_stacks, default=0.0))


def flops_split(*, flops_per_token: float, flops_per_token_doubled_lengths: float) -> tuple[float, float]:
    """(6N part, attention part) of training FLOPs per token.

    The attention term of `train_flops_per_token` grows linearly with the lengths and the 6N term
    does not, so doubling every length gives 6N = 2 f(L) - f(2L).
    """
    six_n = 2 * flops_per_token - flops_per_token_doubled_lengths
    return six_n, flops_per_token - six_n


def lm_pieces(*, corpus_tokens: int, documents: int, sequence_length: int) -> int:
    """At least how many pieces lm_task makes of the documents: it splits each into pieces of at most
    sequence_length - 1 tokens (room for the EOS it appends), so max(documents, ceil(tokens / (L - 1)))."""
    return max(documents, -(-corpus_tokens // max(sequence_length - 1, 1)))


def steps_per_epoch(*, tokens_per_epoch: int, batch_size: int, sequence_length: int) -> int:
    """Steps of one epoch if packing filled every row: ceil(tokens / (batch_size x sequence_length)).

    Packing leaves padding at the end of rows, so the real count is this or a little more.
    """
    return -(-tokens_per_epoch // (batch_size * sequence_length))


def planned_steps(*, train_steps: int | None, num_epochs: int | None, steps_per_epoch: int | None) -> int | None:
    """The run's length in steps as `t5x-lite train` plans it: the first of the step and epoch limits."""
    limits = [train_steps] if train_steps else []
    if num_epochs:
        if steps_per_epoch is None:
            return train_steps or None
        limits.append(num_epochs * steps_per_epoch)
    return min(limits) if limits else None


def train_seconds(*, tokens: float, flops_per_token: float, peak_flops_per_device: float, num_devices: int,
                  mfu: float) -> float:
    """Wall-clock seconds: tokens x FLOPs per token / (MFU x peak FLOP/s per device x devices)."""
    return tokens * flops_per_token / (mfu * peak_flops_per_device * num_devices)
