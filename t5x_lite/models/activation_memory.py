"""Bytes a layer stack keeps for the backward pass, by remat policy and attention implementation.

Pure functions of explicit keyword arguments: the activation and logits arithmetic of `t5x-lite
estimate` (estimate/arithmetic.py names them; docs/estimate.md writes out each formula), which
the layer-layout choice at start-up (parallel/layer_layout.py) reads too. Each family says what
its stacks are (`BaseModel.activation_stacks`).
"""

from __future__ import annotations

# Float32 [tokens, vocab] buffers the loss keeps per device: the logits, their softmax, the gradient.
LOGITS_BUFFERS = 3


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
