"""Softmax attention with its backward pass written out: the 'explicit' implementation.

The same math as `jax.nn.dot_product_attention(implementation='xla')`: scores
q.k * scale + bias, masked, softmax in float32, times v. What differs is the layout. Heads
are moved next to the batch ([batch, heads, length, head_dim]) once, every product is a
batched matmul over (batch, head), and the gradient reuses the saved probabilities:

    dP = dO V^T      dV = P^T dO      dS = P * (dP - rowsum(dP * P)), 0 where masked
    dQ = dS K scale  dK = dS^T Q scale  dbias = dS summed to the bias's shape

Autodiff of the XLA implementation transposes the [batch, heads, q, kv] score and
probability arrays in the backward pass; on CPU those copies cost more than the products
(bench/NOTES.md). `layers.attention_implementation('auto')` picks this on CPU.

With `blas=True` ('explicit_blas') the same math runs on the fused native CPU kernel
(t5x_lite/kernels: per (batch, key/value head) its products as OpenBLAS sgemms and its softmax
while the scores are in cache, the tasks spread over XLA's threads, q, k and v read where they
lie, so the heads-first copies below are not made either).

Grouped-query attention (kv_heads < heads) never repeats k and v: the query heads that share a
key/value head are stacked along the query length ([batch, kv_heads, groups * q, head_dim], a
reshape that moves no data), so each product runs once per key/value head, dV and dK sum over
the group inside their matmuls, and the backward pass keeps k and v as they came.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from t5x_lite import kernels

Array = jax.Array

# Masked scores: finite, so a row with nothing visible gives a uniform (not NaN) softmax.
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)


def dot_product_attention(q: Array, k: Array, v: Array, *, mask: Array | None = None, bias: Array | None = None,
                          scale: float | None = None, is_causal: bool = False, blas: bool = False) -> Array:
    """q [batch, q_len, heads, head_dim], k and v [batch, kv_len, kv_heads, head_dim] -> like q.

    `mask` (bool, True = attend) and `bias` broadcast to [batch, heads, q_len, kv_len];
    `is_causal` adds the causal mask. kv_heads must divide heads (grouped-query attention).
    `blas`: on the fused native CPU kernel (float32 only).
    """
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"kv_heads ({kv_heads}) must divide heads ({heads}).")
    if is_causal:
        causal = jnp.tril(jnp.ones((q_len, k.shape[1]), jnp.bool_))
        mask = causal if mask is None else mask & causal
    mask, bias = (None if x is None else x.reshape((1,) * (4 - x.ndim) + x.shape) for x in (mask, bias))
    for name, x in (("mask", mask), ("bias", bias)):
        if x is not None and x.shape[1] not in (1, heads):
            raise ValueError(f"The attention {name}'s heads dimension is {x.shape[1]}: it must be 1 or {heads}.")
    scale = head_dim ** -0.5 if scale is None else scale
    if blas:
        return kernels.attention(q, k, v, mask=mask, bias=bias, scale=scale)
    mask = jnp.ones((1, 1, 1, 1), jnp.bool_) if mask is None else mask
    bias = jnp.zeros((1, 1, 1, 1), jnp.float32) if bias is None else bias
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [b, l, n, h] <-> [b, n, l, h]
    # Query heads i * groups ... (i + 1) * groups - 1 share key/value head i: [b, kv_heads, groups * q_len, h].
    groups = heads // kv_heads
    q = heads_first(q).reshape(batch, kv_heads, groups * q_len, head_dim)
    out = _attention(q, heads_first(k), heads_first(v), _per_group(mask, groups), _per_group(bias, groups),
                     float(scale), groups)
    return heads_first(out.reshape(batch, heads, q_len, head_dim))


def _per_group(x: Array, groups: int) -> Array:
    """[B, heads or 1, q, kv] -> [B, kv_heads or 1, groups or 1, q, kv]: the scores' grouped view.

    Multi-head attention (one query head per key/value head) keeps the 4-D arrays as they are."""
    if groups == 1:
        return x
    heads = x.shape[1]
    return x.reshape(x.shape[:1] + ((heads // groups, groups) if heads > 1 else (1, 1)) + x.shape[2:])


def _grouped(scores: Array, groups: int) -> Array:
    """[b, kv_heads, groups * q, kv] viewed as [b, kv_heads, groups, q, kv] (a reshape; none without groups)."""
    b, kv_heads, rows, kv = scores.shape
    return scores if groups == 1 else scores.reshape(b, kv_heads, groups, rows // groups, kv)


def _forward(q, k, v, mask, bias, scale, groups):
    scores = jnp.einsum("bnth,bnsh->bnts", q, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask, _grouped(scores, groups) + bias.astype(jnp.float32), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).reshape(q.shape[:3] + k.shape[2:3])
    out = jnp.einsum("bnts,bnsh->bnth", probs.astype(v.dtype), v)
    return out, probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, mask, bias, scale, groups):
    return _forward(q, k, v, mask, bias, scale, groups)[0]


def _attention_fwd(q, k, v, mask, bias, scale, groups):
    out, probs = _forward(q, k, v, mask, bias, scale, groups)
    return out, (q, k, v, mask, bias, probs)


def _sum_to(x: Array, shape: tuple[int, ...]) -> Array:
    """Sums x over the dimensions that `shape` broadcast (size 1 there)."""
    axes = tuple(i for i, (n, m) in enumerate(zip(x.shape, shape)) if m == 1 and n != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _attention_bwd(scale, groups, residuals, d_out):
    q, k, v, mask, bias, probs = residuals
    d_probs = jnp.einsum("bnth,bnsh->bnts", d_out, v, preferred_element_type=jnp.float32)
    dv = jnp.einsum("bnts,bnth->bnsh", probs.astype(d_out.dtype), d_out)
    d_scores = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True))
    # Masked scores get no gradient: their probability is 0 unless the whole row is masked, and
    # then the forward pass replaced them by a constant.
    d_scores = jnp.where(mask, _grouped(d_scores, groups), 0.0).reshape(probs.shape)
    ds = (d_scores * scale).astype(q.dtype)
    dq = jnp.einsum("bnts,bnsh->bnth", ds, k)
    dk = jnp.einsum("bnts,bnth->bnsh", ds, q)
    d_bias = _sum_to(_grouped(d_scores, groups), bias.shape).astype(bias.dtype)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, d_bias


_attention.defvjp(_attention_fwd, _attention_bwd)
