"""Transformer building blocks with logical-axis annotations.

Every parameter is created with `param_with_axes`, so it carries logical axis names
(`embed`, `mlp`, `heads`, `kv`, `vocab`, ...) that partitioning rules map to mesh axes.
Parameters are stored in float32; computation happens in the module's `dtype`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning

Array = jax.Array
DType = Any

param_with_axes = nn_partitioning.param_with_axes
with_logical_constraint = nn_partitioning.with_sharding_constraint

# Fan-in scaled initialiser for projections: activations keep unit variance at init.
default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def make_attention_mask(segment_ids: Array) -> Array:
    """Causal mask that also keeps packed sequences apart: [batch, 1, q_len, kv_len] bool.

    Position i may attend to j when j <= i and both tokens belong to the same segment.
    Padding (segment 0) attends only to padding, so every row has at least one True.
    """
    length = segment_ids.shape[-1]
    causal = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
    same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (causal[None] & same_segment)[:, None]


def rotary_embedding(x: Array, positions: Array, max_wavelength: float = 10_000.0) -> Array:
    """Applies rotary position embedding (RoPE) to x: [batch, length, heads, head_dim].

    `positions` is [batch, length]; with packing it restarts at 0 for each sequence, so
    every packed example sees the same positions it would see alone.
    """
    head_dim = x.shape[-1]
    half = head_dim // 2
    fraction = jnp.arange(half, dtype=jnp.float32) / half
    inv_freq = 1.0 / (max_wavelength**fraction)
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [b, l, half]
    sin = jnp.sin(angles)[:, :, None, :]
    cos = jnp.cos(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale and no bias (T5 / LLaMA)."""

    epsilon: float = 1e-6
    dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        features = x.shape[-1]
        scale = param_with_axes("scale", nn.initializers.ones, (features,), jnp.float32, axes=("embed",))
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return (normed * scale).astype(self.dtype)


class Embed(nn.Module):
    """Token embedding table [vocab, embed]."""

    num_embeddings: int
    features: int
    dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, tokens: Array) -> Array:
        table = param_with_axes(
            "embedding",
            nn.initializers.normal(stddev=1.0),
            (self.num_embeddings, self.features),
            jnp.float32,
            axes=("vocab", "embed"),
        )
        return jnp.take(table, tokens, axis=0).astype(self.dtype)


class Dense(nn.Module):
    """A projection whose kernel dimensions are named by logical axes.

    `features` may be a tuple (for example (heads, head_dim)); the kernel is
    [in_features, *features] with `axes` naming each kernel dimension.
    """

    features: tuple[int, ...]
    axes: tuple[str, ...]
    dtype: DType = jnp.float32
    contract_dims: int = 1
    kernel_init: Any = default_kernel_init

    @nn.compact
    def __call__(self, x: Array) -> Array:
        in_shape = x.shape[-self.contract_dims :]
        shape = (*in_shape, *self.features)
        fan_in = math.prod(in_shape)

        def init(key, shape, dtype):
            # Initialise as a 2-D matrix so fan_in counts every contracted dimension.
            flat = self.kernel_init(key, (fan_in, math.prod(self.features)), dtype)
            return flat.reshape(shape)

        kernel = param_with_axes("kernel", init, shape, jnp.float32, axes=self.axes)
        contract = tuple(range(x.ndim - self.contract_dims, x.ndim))
        return jax.lax.dot_general(
            x.astype(self.dtype),
            kernel.astype(self.dtype),
            ((contract, tuple(range(self.contract_dims))), ((), ())),
        )


class Attention(nn.Module):
    """Multi-head self-attention with grouped-query heads and RoPE.

    Runs through `jax.nn.dot_product_attention`, which picks a fused kernel where the
    backend has one (cuDNN flash attention on GPUs) and plain XLA elsewhere.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: DType = jnp.float32
    rope_max_wavelength: float = 10_000.0

    @nn.compact
    def __call__(self, x: Array, mask: Array, positions: Array) -> Array:
        q = Dense((self.num_heads, self.head_dim), ("embed", "heads", "kv"), self.dtype, name="query")(x)
        k = Dense((self.num_kv_heads, self.head_dim), ("embed", "kv_heads", "kv"), self.dtype, name="key")(x)
        v = Dense((self.num_kv_heads, self.head_dim), ("embed", "kv_heads", "kv"), self.dtype, name="value")(x)
        q = rotary_embedding(q, positions, self.rope_max_wavelength)
        k = rotary_embedding(k, positions, self.rope_max_wavelength)
        q = with_logical_constraint(q, ("batch", "length", "heads", "kv"))
        out = jax.nn.dot_product_attention(q, k, v, mask=mask)
        out = with_logical_constraint(out, ("batch", "length", "heads", "kv"))
        return Dense((x.shape[-1],), ("heads", "kv", "embed"), self.dtype, contract_dims=2, name="out")(out)


class SwiGLU(nn.Module):
    """Gated MLP: (silu(x W0) * x W1) Wo."""

    mlp_dim: int
    dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        gate = Dense((self.mlp_dim,), ("embed", "mlp"), self.dtype, name="wi_0")(x)
        up = Dense((self.mlp_dim,), ("embed", "mlp"), self.dtype, name="wi_1")(x)
        hidden = with_logical_constraint(nn.silu(gate) * up, ("batch", "length", "mlp"))
        return Dense((x.shape[-1],), ("mlp", "embed"), self.dtype, name="wo")(hidden)
