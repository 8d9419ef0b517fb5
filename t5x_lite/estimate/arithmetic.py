"""The arithmetic of `t5x-lite estimate`: mesh shapes, shards, FLOPs, epochs, time, activations.

Pure functions of explicit keyword arguments, tested directly; docs/estimate.md writes out each
formula.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from t5x_lite.errors import ConfigValueError
from t5x_lite.parallel.partitioning import mesh_axes_of

# Float32 [tokens, vocab] buffers the loss keeps per device: the logits, their softmax, the gradient.
LOGITS_BUFFERS = 3

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


def score_bytes(attention: str, *, dtype_bytes: int) -> tuple[float, float, float]:
    """Bytes per attention-score entry (heads x attended length per token) that one layer keeps
    without remat, keeps under `save_dots`, and holds while its backward pass runs (with remat),
    for each attention implementation:

    'xla' (jax.nn.dot_product_attention differentiated by JAX): scores, mask-added scores,
    softmax and its mask, in the compute dtype; 'explicit' (models/explicit_attention.py): one
    float32 probability array (also under `save_dots`, its output being a dot's), and four float32
    arrays while the backward pass runs ('explicit_blas', the fused CPU kernel: the same saved
    array; its backward pass works in per-thread scratch, so its four arrays are an upper bound
    that did not move the compiled peak); 'cudnn': a flash kernel, nothing that size.
    """
    table = {"xla": (4 * dtype_bytes, dtype_bytes, 4 * dtype_bytes), "explicit": (4, 4, 16),
             "explicit_blas": (4, 4, 16), "cudnn": (0, 0, 0)}
    return table[attention]


def mlp_hidden_arrays(n_mlp_in: int) -> int:
    """Arrays of the MLP's hidden size one layer keeps without remat: each input projection's output
    and the activation's (its input to the output projection); a gated MLP also keeps act(x W0)
    for the product's gradient (layers.MLP)."""
    return n_mlp_in + 1 + (n_mlp_in > 1)


def _layer_elements(policy: str, *, width: int, q: float, kv: float, mlp: float, n_mlp_in: int,
                    attention_blocks: int = 1) -> tuple[float, float]:
    """(device, host) elements one layer keeps per token for the backward pass under `policy`,
    attention scores aside (what jax saves: tests/estimate/test_saved_activations.py).

    width: emb_dim; q: the query widths of the layer's `attention_blocks` attention blocks (heads x
    head_dim per device, summed); kv: their keys and values per token (a cross-attention's over the
    encoder's tokens, scaled to the layer's); mlp: MLP hidden width per device, n_mlp_in of them
    (2 for gated MLPs). Without remat each sublayer (attention blocks and the MLP) keeps its norm's
    input and output; with remat the saved projections and each sublayer's input.
    """
    sublayers = attention_blocks + 1
    minimal = sublayers * width + q + kv + n_mlp_in * mlp
    saved = {
        "none": 2 * sublayers * width + 2 * q + kv + mlp_hidden_arrays(n_mlp_in) * mlp,
        "save_dots": minimal + q,  # + each attention's output before its projection
        "minimal": minimal,
        "save_qkv_proj": width + q + kv,
        "full": width,
    }
    offloaded = {"minimal_offloaded": saved["minimal"] - width, "qkv_proj_offloaded": q + kv}
    if policy in offloaded:
        return width, offloaded[policy]
    return saved[policy], 0.0


def activation_bytes(*, policy: str, attention: str, dtype_bytes: int, num_layers: int, tokens: int, width: int,
                     q: float, kv: float, mlp: float, n_mlp_in: int, scores: float, attention_blocks: int = 1,
                     saved_bytes: int | None = None) -> tuple[float, float]:
    """Rough (device, host) bytes of one layer stack's saved activations for one (micro)batch on one device.

    layers x tokens x (the policy's per-layer bytes), plus, with remat, one layer's working set
    while it is recomputed. `attention`: 'xla', 'explicit', 'explicit_blas' or 'cudnn' (score_bytes); `scores`:
    attention-score entries per token (heads per device x attended length); q, kv,
    attention_blocks: as in _layer_elements. `saved_bytes`: bytes per saved element on the device
    when not the compute dtype's (XLA:CPU keeps a scanned bfloat16 stack's saved activations in
    float32: saved_activation_bytes). A rough guide, not XLA's buffer assignment.
    """
    kept, kept_by_dots, working = score_bytes(attention, dtype_bytes=dtype_bytes)
    layer = dict(width=width, q=q, kv=kv, mlp=mlp, n_mlp_in=n_mlp_in, attention_blocks=attention_blocks)
    device, host = _layer_elements(policy, **layer)
    device = device * (saved_bytes or dtype_bytes) + {"none": kept, "save_dots": kept_by_dots}.get(policy, 0) * scores
    recompute = 0.0 if policy == "none" else _layer_elements("none", **layer)[0] * dtype_bytes + working * scores
    return ((num_layers * device + recompute) * tokens, num_layers * host * tokens * dtype_bytes)


def saved_activation_bytes(*, platform: str, dtype_bytes: int, scanned: bool) -> int:
    """Bytes per saved activation element on the device. XLA:CPU has no bfloat16 dynamic slice: it
    computes each read of a layer's slice of a saved bfloat16 stack in float32, and the backward
    loop's converts, being the same every iteration, are hoisted out of it, so the whole stack is
    held in float32 (bench/NOTES.md, large models). Other backends keep the compute dtype."""
    return 4 if platform == "cpu" and scanned and dtype_bytes < 4 else dtype_bytes


def logits_bytes(*, tokens: int, vocab_size: int, vocab_shards: int) -> float:
    """Float32 logits, softmax and their gradient for `tokens` target tokens on one device."""
    return LOGITS_BUFFERS * 4 * tokens * -(-vocab_size // vocab_shards)
