"""`attention`: float32 softmax attention, forward and backward, on the fused native CPU kernel.

The kernel (attention.cc) takes one (batch row, key/value head) at a time and runs its
products (one single-threaded OpenBLAS sgemm each) and its softmax while the [q_len, kv_len]
scores are in cache, the tasks spread over XLA's intra-op threads; q, k and v are read, and
their gradients written, in the [batch, length, heads, head_dim] layout, so no heads-first
copies are made. The math is models/explicit_attention.py's: the backward pass reuses the saved
probabilities.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite.kernels import build

Array = jax.Array


def attention(q: Array, k: Array, v: Array, *, mask: Array | None = None, bias: Array | None = None,
              scale: float) -> Array:
    """softmax(where(mask, scale q k^T + bias, masked)) v, differentiable in q, k, v and bias.

    q [batch, q_len, heads, head_dim], k and v [batch, kv_len, kv_heads, head_dim] with kv_heads
    dividing heads (grouped-query attention), float32 -> like q. `mask` (bool, True = attend) and
    `bias` are 4-D and broadcast to [batch, heads, q_len, kv_len], their batch and heads dims
    being 1 or full. CPU only.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != jnp.float32 or x.ndim != 4:
            raise TypeError(f"The attention kernel takes 4-D float32 {name}, not {x.dtype} {x.shape}.")
    batch, q_len, heads, _ = q.shape
    kv_len, kv_heads = k.shape[1:3]
    if k.shape != v.shape or k.shape[::3] != q.shape[::3] or not kv_heads or heads % kv_heads:
        raise ValueError(f"The attention kernel needs k and v alike, sharing q's batch and head_dim, with kv_heads "
                         f"dividing heads: q {q.shape}, k {k.shape}, v {v.shape}.")

    def full(x: Array | None, dtype) -> Array:
        """[batch or 1, heads or 1, q_len, kv_len], or an empty array for none."""
        if x is None:
            return jnp.zeros((0,), dtype)
        if x.ndim != 4 or x.shape[0] not in (1, batch) or x.shape[1] not in (1, heads):
            raise ValueError(f"The attention kernel's mask and bias are [batch or 1, heads or 1, q_len or 1, "
                             f"kv_len or 1], not {x.shape} (batch {batch}, heads {heads}).")
        return jnp.broadcast_to(x.astype(dtype), x.shape[:2] + (q_len, kv_len))

    build.load()
    return _attention(q, k, v, full(mask, jnp.bool_), full(bias, jnp.float32), float(scale))


def _forward(q, k, v, mask, bias, scale, with_probs):
    batch, q_len, heads, _ = q.shape
    probs_shape = (batch, heads, q_len, k.shape[1]) if with_probs else (0,)
    results = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct(probs_shape, jnp.float32))
    return jax.ffi.ffi_call("t5x_lite_attention_fwd", results, vmap_method="sequential")(
        q, k, v, mask, bias, scale=np.float32(scale))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q, k, v, mask, bias, scale):
    return _forward(q, k, v, mask, bias, scale, with_probs=False)[0]


def _attention_fwd(q, k, v, mask, bias, scale):
    out, probs = _forward(q, k, v, mask, bias, scale, with_probs=True)
    return out, (q, k, v, mask, bias, probs)


def _attention_bwd(scale, residuals, d_out):
    q, k, v, mask, bias, probs = residuals
    # dS (the scores' gradient) leaves the kernel only for a bias's gradient.
    results = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, v))
    results += (jax.ShapeDtypeStruct(probs.shape if bias.size else (0,), jnp.float32),)
    dq, dk, dv, d_scores = jax.ffi.ffi_call("t5x_lite_attention_bwd", results, vmap_method="sequential")(
        q, k, v, mask, probs, d_out, scale=np.float32(scale))
    d_bias = jnp.sum(d_scores, axis=tuple(i for i in (0, 1) if bias.shape[i] == 1), keepdims=True) if bias.size \
        else jnp.zeros_like(bias)
    return dq, dk, dv, None, d_bias


_attention.defvjp(_attention_fwd, _attention_bwd)
