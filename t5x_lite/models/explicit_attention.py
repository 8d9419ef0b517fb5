"""Softmax attention with its backward pass written out: the 'explicit' implementation.

The same math as `jax.nn.dot_product_attention(implementation='xla')`: scores
q.k * scale + bias, masked, softmax in float32, times v. What differs is the layout. Heads
are moved next to the batch ([batch, heads, length, head_dim]) once, every product is a
batched matmul over (batch, head), and the gradient reuses the saved probabilities:

    dP = dO V^T      dV = P^T dO      dS = P * (dP - rowsum(dP * P))
    dQ = dS K scale  dK = dS^T Q scale  dbias = dS summed to the bias's shape

Autodiff of the XLA implementation transposes the [batch, heads, q, kv] score and
probability arrays in the backward pass; on CPU those copies cost more than the products
(docs/benchmarks.md). `layers.attention_implementation('auto')` picks this on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array

# Masked scores: finite, so a row with nothing visible gives a uniform (not NaN) softmax.
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)


def dot_product_attention(q: Array, k: Array, v: Array, *, mask: Array | None = None, bias: Array | None = None,
                          scale: float | None = None, is_causal: bool = False) -> Array:
    """q [batch, q_len, heads, head_dim], k and v [batch, kv_len, kv_heads, head_dim] -> like q.

    `mask` (bool, True = attend) and `bias` broadcast to [batch, heads, q_len, kv_len];
    `is_causal` adds the causal mask. kv_heads must divide heads (grouped-query attention).
    """
    heads, kv_heads = q.shape[2], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"kv_heads ({kv_heads}) must divide heads ({heads}).")
    if kv_heads != heads:  # grouped-query: each k/v head serves heads // kv_heads query heads
        k = jnp.repeat(k, heads // kv_heads, axis=2)
        v = jnp.repeat(v, heads // kv_heads, axis=2)
    if is_causal:
        causal = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), jnp.bool_))
        mask = causal if mask is None else mask & causal
    mask = jnp.ones((1, 1, 1, 1), jnp.bool_) if mask is None else mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    bias = jnp.zeros((1, 1, 1, 1), jnp.float32) if bias is None else bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [b, l, n, h] <-> [b, n, l, h]
    return heads_first(_attention(heads_first(q), heads_first(k), heads_first(v), mask, bias, float(scale)))


def _forward(q, k, v, mask, bias, scale):
    scores = jnp.einsum("bnth,bnsh->bnts", q, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask, scores + bias.astype(jnp.float32), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bnts,bnsh->bnth", probs.astype(v.dtype), v)
    return out, probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q, k, v, mask, bias, scale):
    return _forward(q, k, v, mask, bias, scale)[0]


def _attention_fwd(q, k, v, mask, bias, scale):
    out, probs = _forward(q, k, v, mask, bias, scale)
    return out, (q, k, v, mask, bias, probs)


def _sum_to(x: Array, shape: tuple[int, ...]) -> Array:
    """Sums x over the dimensions that `shape` broadcast (size 1 there)."""
    axes = tuple(i for i, (n, m) in enumerate(zip(x.shape, shape)) if m == 1 and n != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _attention_bwd(scale, residuals, d_out):
    q, k, v, mask, bias, probs = residuals
    d_probs = jnp.einsum("bnth,bnsh->bnts", d_out, v, preferred_element_type=jnp.float32)
    dv = jnp.einsum("bnts,bnth->bnsh", probs.astype(d_out.dtype), d_out)
    d_scores = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True))
    ds = (d_scores * scale).astype(q.dtype)
    dq = jnp.einsum("bnts,bnsh->bnth", ds, k)
    dk = jnp.einsum("bnts,bnth->bnsh", ds, q)
    d_bias = _sum_to(d_scores, bias.shape).astype(bias.dtype)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, d_bias


_attention.defvjp(_attention_fwd, _attention_bwd)
