"""The estimate's saved activations per remat policy equal what JAX saves for the backward pass.

A tiny scanned model in bfloat16 (the explicit attention, as on CPU) is differentiated and the
residuals stacked by its layer loops (`jax.ad_checkpoint.print_saved_residuals`, arrays with a
leading layers axis) are summed: the arithmetic of `estimate_math.activation_bytes` must give the
same bytes, layer stacks only (its working set of one recomputed layer aside).
"""

import contextlib
import io
import math
import re

import jax
import jax.numpy as jnp
import pytest

from t5x_lite.estimate import arithmetic as estimate_math
from t5x_lite.models import decoder_only, encoder_decoder

LAYERS, ROWS, LENGTH, INPUTS = 3, 2, 16, 24
HEADS, HEAD_DIM, WIDTH, MLP = 4, 8, 32, 48
POLICIES = ["none", "minimal", "save_dots", "save_qkv_proj", "full"]
_DTYPE_BYTES = {"bf16": 2, "f32": 4}


def _stacked_bytes(loss, params) -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(loss, params)
    total = 0
    for dtype, dims in re.findall(r"^(\w+)\[([\d,]+)\] output of scan", out.getvalue(), re.MULTILINE):
        shape = [int(d) for d in dims.split(",")]
        if shape[0] == LAYERS:
            total += math.prod(shape) * _DTYPE_BYTES[dtype]
    return total


def _stack_arithmetic(policy: str, *, tokens: int, **layer) -> float:
    """Bytes of a stack's saved layers: activation_bytes less its working set (num_layers=0)."""
    args = dict(policy=policy, attention="explicit", dtype_bytes=2, width=WIDTH, mlp=MLP, tokens=tokens, **layer)
    return (estimate_math.activation_bytes(num_layers=LAYERS, **args)[0]
            - estimate_math.activation_bytes(num_layers=0, **args)[0])


@pytest.mark.parametrize("activations,kv_heads", [(("silu", "linear"), HEADS), (("gelu",), HEADS),
                                                  (("silu", "linear"), 2), (("silu", "linear"), 1)])
@pytest.mark.parametrize("policy", POLICIES)
def test_decoder_layers_save_what_the_estimate_counts(policy, activations, kv_heads):
    """Grouped-query heads too: the attention keeps each key and value head once, not per query head."""
    cfg = decoder_only.DecoderConfig(vocab_size=64, emb_dim=WIDTH, num_heads=HEADS, num_kv_heads=kv_heads,
                                     head_dim=HEAD_DIM, mlp_dim=MLP, num_layers=LAYERS, max_len=LENGTH,
                                     dtype="bfloat16", remat_policy=policy, mlp_activations=activations,
                                     attention_implementation="explicit")
    model, tokens = decoder_only.Decoder(cfg), jnp.ones((ROWS, LENGTH), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), tokens)["params"]
    saved = _stacked_bytes(lambda p: model.apply({"params": p}, tokens).sum(), params)
    q = HEADS * HEAD_DIM
    want = _stack_arithmetic(policy, tokens=ROWS * LENGTH, q=q, kv=2 * kv_heads * HEAD_DIM,
                             n_mlp_in=len(activations), scores=HEADS * LENGTH)
    assert saved == want


@pytest.mark.parametrize("policy", POLICIES)
def test_encoder_decoder_layers_save_what_the_estimate_counts(policy):
    """T5's decoder layers: self- and cross-attention, the cross-attention's keys and values over the inputs."""
    cfg = encoder_decoder.T5Config(vocab_size=64, emb_dim=WIDTH, num_heads=HEADS, head_dim=HEAD_DIM, mlp_dim=MLP,
                                   num_encoder_layers=LAYERS, num_decoder_layers=LAYERS, dtype="bfloat16",
                                   remat_policy=policy, mlp_activations=("gelu", "linear"))
    model = encoder_decoder.EncoderDecoder(cfg)
    inputs, targets = jnp.ones((ROWS, INPUTS), jnp.int32), jnp.ones((ROWS, LENGTH), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), inputs, targets)["params"]
    saved = _stacked_bytes(lambda p: model.apply({"params": p}, inputs, targets).sum(), params)
    q = HEADS * HEAD_DIM
    encoder = _stack_arithmetic(policy, tokens=ROWS * INPUTS, q=q, kv=2 * q, n_mlp_in=2, scores=HEADS * INPUTS)
    decoder = _stack_arithmetic(policy, tokens=ROWS * LENGTH, q=2 * q, kv=2 * q + 2 * q * INPUTS / LENGTH,
                                attention_blocks=2, n_mlp_in=2, scores=HEADS * (LENGTH + INPUTS))
    assert saved == encoder + decoder


def test_xla_cpu_keeps_a_scanned_bfloat16_stack_in_float32_only():
    assert estimate_math.saved_activation_bytes(platform="cpu", dtype_bytes=2, scanned=True) == 4
    assert estimate_math.saved_activation_bytes(platform="cpu", dtype_bytes=2, scanned=False) == 2
    assert estimate_math.saved_activation_bytes(platform="gpu", dtype_bytes=2, scanned=True) == 2
    assert estimate_math.saved_activation_bytes(platform="cpu", dtype_bytes=4, scanned=True) == 4
