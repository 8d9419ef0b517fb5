"""Transformer building blocks with logical-axis annotations.

Every parameter is created with `param_with_axes`, so it carries logical axis names
(`embed`, `mlp`, `heads`, `kv`, `vocab`, ...) that partitioning rules map to mesh axes.
Parameters are stored in float32; computation happens in the module's `dtype`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning
from jax.ad_checkpoint import checkpoint_name

from t5x_lite import kernels
from t5x_lite.errors import ConfigValueError
from t5x_lite.models import explicit_attention, masks, packed_attention
from t5x_lite.models.projection import project

Array = jax.Array
DType = Any

param_with_axes = nn_partitioning.param_with_axes
with_logical_constraint = nn_partitioning.with_sharding_constraint
# The checkpoint_name of every Dense output (remat policies save projections by this name).
PROJECTION_NAME = "projection"

# Fan-in scaled initialiser for projections: activations keep unit variance at init.
default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def relative_position_bucket(relative_position: Array, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
    """T5's bucketing of (key position - query position) into `num_buckets` integer buckets.

    Half of the buckets (per direction) hold exact small distances; the rest grow
    logarithmically up to `max_distance`, beyond which all distances share the last bucket.
    A unidirectional (decoder) bucketing maps every future position to bucket 0.
    """
    n = -relative_position
    bucket = jnp.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n < 0).astype(n.dtype) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    log_ratio = jnp.log(n.astype(jnp.float32) / max_exact + jnp.finfo(jnp.float32).eps) / math.log(
        max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(n.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(is_small, n, large)


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


ACTIVATIONS = {
    "gelu": nn.gelu,  # tanh approximation, as in GPT-2 and T5 v1.1 ("gelu_new")
    "gelu_exact": lambda x: nn.gelu(x, approximate=False),
    "relu": nn.relu,
    "silu": nn.silu,
    "linear": lambda x: x,
}


def rms_normalize(x: Array, scale: Array, *, epsilon: float, dtype: DType) -> Array:
    """x / rms(x) * scale over the last axis, computed in float32, returned in `dtype`."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + epsilon)
    return (normed * scale).astype(dtype)


def layer_normalize(x: Array, scale: Array, bias: Array, *, epsilon: float, dtype: DType) -> Array:
    """(x - mean) / std * scale + bias over the last axis, computed in float32, returned in `dtype`."""
    x32 = x.astype(jnp.float32)
    centered = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    normed = centered * jax.lax.rsqrt(jnp.mean(jnp.square(centered), axis=-1, keepdims=True) + epsilon)
    return (normed * scale + bias).astype(dtype)


def recomputed(fn: Callable[..., Array], x: Array, *args: Array) -> Array:
    """`fn(x, *args)` under `jax.checkpoint`: the backward pass keeps only the inputs and recomputes
    `fn`'s intermediates, elementwise work that costs less to redo than to store in a layer's
    saved activations and read back."""
    return jax.checkpoint(fn)(x, *args)


def float32_norm(normalize: Callable[..., Array], x: Array, *params: Array, epsilon: float, dtype: DType) -> Array:
    """`normalize(x, *params)`, computed in float32, with its intermediates recomputed in the
    backward pass rather than saved.

    Saved, they are float32 arrays of the norm's input size (twice its size for 16-bit input): in
    a scanned bf16 decoder without remat they were the largest activations (the 350M decoder on
    one H100: 25.4 instead of 32.9 GiB, and 5% faster steps, when recomputed; float32 on CPU:
    bench/NOTES.md).
    """
    return recomputed(functools.partial(normalize, epsilon=epsilon, dtype=dtype), x, *params)


def activation(name: str, x: Array) -> Array:
    """`ACTIVATIONS[name](x)`; only `x` is kept for the backward pass.

    Autodiff of an activation keeps its intermediates, each of `x`'s size (two for SiLU, four
    for tanh-GELU): recomputed instead, an MLP without remat keeps its two projections and
    their product only.
    """
    return x if name == "linear" else recomputed(ACTIVATIONS[name], x)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale and no bias (T5 / LLaMA).

    `plus_one` (Gemma): the stored scale starts at zero and the output is multiplied by
    (1 + scale), all in float32.
    """

    epsilon: float = 1e-6
    dtype: DType = jnp.float32
    plus_one: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        features = x.shape[-1]
        init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
        scale = param_with_axes("scale", init, (features,), jnp.float32, axes=("embed",))
        if self.plus_one:
            scale = 1.0 + scale
        return float32_norm(rms_normalize, x, scale, epsilon=self.epsilon, dtype=self.dtype)


class LayerNorm(nn.Module):
    """Layer norm with a learned scale and bias (GPT-2)."""

    epsilon: float = 1e-5
    dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        features = x.shape[-1]
        scale = param_with_axes("scale", nn.initializers.ones, (features,), jnp.float32, axes=("embed",))
        bias = param_with_axes("bias", nn.initializers.zeros, (features,), jnp.float32, axes=("embed",))
        return float32_norm(layer_normalize, x, scale, bias, epsilon=self.epsilon, dtype=self.dtype)


NORMS = {"rmsnorm": RMSNorm, "layernorm": LayerNorm, "rmsnorm_plus_one": functools.partial(RMSNorm, plus_one=True)}


def norm_class(kind: str, epsilon: float | None = None) -> Any:
    """The norm module called `kind`, with `epsilon` bound unless None (the module's default)."""
    cls = NORMS[kind]
    return cls if epsilon is None else functools.partial(cls, epsilon=epsilon)


class Embed(nn.Module):
    """Embedding table [vocab, embed]; `attend` reuses it as the output projection (tied logits)."""

    num_embeddings: int
    features: int
    dtype: DType = jnp.float32
    stddev: float = 1.0
    axes: tuple[str, str] = ("vocab", "embed")

    def setup(self):
        self.embedding = param_with_axes(
            "embedding", nn.initializers.normal(stddev=self.stddev),
            (self.num_embeddings, self.features), jnp.float32, axes=self.axes,
        )

    def __call__(self, ids: Array) -> Array:
        # The table is gathered along `embed` first (as FSDP gathers every kernel before its
        # matmul), so the looked-up rows come out split by batch like the ids. Gathering from a
        # table split along `embed` gives rows split along `embed`, which XLA can turn into
        # batch-split rows only by a full rematerialization when both splits use the fsdp axis.
        table = with_logical_constraint(self.embedding, (self.axes[0], None))
        return jnp.take(table, ids, axis=0).astype(self.dtype)

    def attend(self, x: Array) -> Array:
        """x [..., embed] -> [..., vocab] scores against every row of the table."""
        return project(x.astype(self.dtype), self.embedding.astype(self.dtype).T)


class Dense(nn.Module):
    """A projection whose kernel dimensions are named by logical axes.

    `features` may be a tuple (for example (heads, head_dim)); the kernel is [in_features,
    *features], `axes` naming each kernel dimension; the optional bias has the output's axes.
    `keep_cast_kernel`: False (layers in a stack) casts the parameter again for the backward
    pass, where a kept cast copy would be stacked per layer; True (outside the layer loop: the
    logits) keeps the cast kernel, which under FSDP spares gathering it twice.
    """

    features: tuple[int, ...]
    axes: tuple[str, ...]
    dtype: DType = jnp.float32
    contract_dims: int = 1
    kernel_init: Any = default_kernel_init
    use_bias: bool = False
    keep_cast_kernel: bool = False

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
        if self.keep_cast_kernel:
            y = project(x.astype(self.dtype), kernel.astype(self.dtype), self.contract_dims)
        else:  # the stored parameter, not the constrained value: `project` constrains and casts it
            y = project(x.astype(self.dtype), self.get_variable("params", "kernel"), self.contract_dims,
                        self.dtype, self.axes)
        # Named for the remat policies: jax's dot-based ones cannot see into `project`'s custom_vjp.
        y = checkpoint_name(y, PROJECTION_NAME)
        if self.use_bias:
            bias = param_with_axes("bias", nn.initializers.zeros, tuple(self.features), jnp.float32,
                                   axes=self.axes[self.contract_dims:])
            y = y + bias.astype(self.dtype)
        return y


ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "explicit", "explicit_blas")
EXPLICIT = ("explicit", "explicit_blas")  # explicit_attention.py's math; the second on the native CPU kernel


def attention_implementation(choice: str, dtype: DType, head_dim: int, *, allow_fused: bool = True,
                             platform: str | None = None) -> str:
    """Resolves 'auto': cuDNN's fused (flash) attention on GPUs for 16-bit compute; on CPU the
    explicit attention (explicit_attention.py: the XLA math with a written-out backward pass),
    on the fused native kernel ('explicit_blas', t5x_lite/kernels) in float32 on a single device
    where the kernel builds, else on XLA ('explicit'); else XLA.

    `jax.nn.dot_product_attention` itself defaults to XLA everywhere, so the choice is made here.
    cuDNN's kernel needs a 16-bit dtype and a head_dim that is a multiple of 8, at most 128;
    `allow_fused=False` rules it out (T5: its relative position bias needs a bias gradient).
    The kernel has no sharding rule (XLA would gather its operands across devices), hence one
    device. `platform` ('cpu', 'gpu', 'tpu'; default: JAX's backend) lets the memory estimate plan
    for another. Asking for 'explicit_blas' where it cannot run raises `KernelUnavailableError`
    or `ConfigValueError`.
    """
    on_this_backend = platform is None or platform == jax.default_backend()
    platform = platform or jax.default_backend()
    if choice == "explicit_blas":
        if platform != "cpu" or jnp.dtype(dtype) != jnp.float32:
            raise ConfigValueError(f"attention_implementation='explicit_blas' runs on CPU in float32, not on "
                                   f"{platform} in {jnp.dtype(dtype).name}: use 'explicit' (or 'auto').")
        if on_this_backend:
            kernels.load()
    if choice != "auto":
        return choice
    if platform == "cpu":
        native = (on_this_backend and jnp.dtype(dtype) == jnp.float32 and jax.device_count() == 1
                  and kernels.available())
        return "explicit_blas" if native else "explicit"
    fused_ok = (allow_fused and platform == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
                and head_dim % 8 == 0 and head_dim <= 128)
    return "cudnn" if fused_ok else "xla"


KV_CACHE_MODES = ("none", "append", "fixed")
# Logical axes of a cached key or value: [batch, cache_length, kv_heads, head_dim].
CACHE_AXES = ("batch", "length", "kv_heads", "kv")


def _cache_variable(module: nn.Module, name: str, like: Array) -> Any:
    """A 'cache' collection variable shaped like `like`, zero-initialised, with logical axes."""
    return nn_partitioning.variable_with_axes("cache", name, jnp.zeros, like.shape, like.dtype, axes=CACHE_AXES,
                                              module=module)


class Attention(nn.Module):
    """Multi-head attention (self or cross) with grouped-query heads, optional RoPE and bias.

    Runs through `jax.nn.dot_product_attention` with `implementation` ('xla' or 'cudnn'), or
    through `explicit_attention` ('explicit'); see `attention_implementation`. The q, k and v
    projections are tagged with `checkpoint_name` so remat policies can save them by name.

    Attributes:
      use_rope: rotate q and k by their positions (LLaMA); off for learned or relative positions.
      use_bias: biases in every projection (GPT-2); `qkv_bias`: in the q, k and v projections only (Qwen2).
      sliding_window: causal self-attention sees only the last `sliding_window` positions, itself
        included (Mistral); None sees every earlier position. Holds in training and in the cache.
      fold_scale_into_query: T5's convention: no 1/sqrt(head_dim) at run time; the query
        kernel's initialisation is scaled down by that factor instead.
      is_causal: add the causal mask (lets cuDNN use its causal kernel; `mask` then only needs
        to keep packed segments apart).
      implementation: 'explicit' or 'explicit_blas', or passed to jax.nn.dot_product_attention
        ('xla', 'cudnn' or None).
      cudnn_segments_per_row: the most segments a packed row holds when a call passes
        `segment_ids` (packed_attention.py: cuDNN's packed layout instead of a dense mask).
      kv_cache: decoding only ('none' for training). 'append' (causal self-attention): keys and
        values live in the 'cache' collection (`cached_key`, `cached_value`: [batch, cache_length,
        kv_heads, head_dim] in the compute dtype, and `cache_index`); a call with n new tokens
        writes their k/v at the cache index, advances it by n and attends causally over the
        filled slots. 'fixed' (cross-attention): a call with `inputs_kv` stores their k/v, a call
        with `inputs_kv=None` reuses them. The first call (inside `init`) only sizes the cache:
        the cache length is its input's length.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: DType = jnp.float32
    use_rope: bool = True
    rope_max_wavelength: float = 10_000.0
    use_bias: bool = False
    fold_scale_into_query: bool = False
    is_causal: bool = False
    implementation: str | None = None
    kv_cache: str = "none"
    qkv_bias: bool = False
    sliding_window: int | None = None
    cudnn_segments_per_row: int | None = None

    @nn.compact
    def __call__(self, inputs_q: Array, inputs_kv: Array | None, mask: Array | None, *,
                 q_positions: Array | None = None, kv_positions: Array | None = None,
                 bias: Array | None = None, segment_ids: Array | None = None) -> Array:
        """In 'append' mode `mask` and `bias` span every cache slot as a key ([..., cache_length]);
        `bias` also spans every slot as a query (the rows of the new tokens are sliced out).
        `segment_ids` [batch, length] (cuDNN, causal self-attention, no mask, bias or window) keep
        packed segments apart on cuDNN's packed layout."""
        packed_ok = (self.implementation, self.is_causal, self.kv_cache, self.sliding_window) == (
            "cudnn", True, "none", None)
        if segment_ids is not None and (mask is not None or bias is not None or not packed_ok):
            raise ValueError("segment_ids take cuDNN's packed layout: implementation 'cudnn', causal self-attention "
                             "without a mask, bias, cache or sliding window.")
        query_init = default_kernel_init
        if self.fold_scale_into_query:
            query_init = nn.initializers.variance_scaling(1.0 / self.head_dim, "fan_in", "truncated_normal")
        project = lambda heads, axes, name, init=default_kernel_init: Dense(  # noqa: E731
            (heads, self.head_dim), axes, self.dtype, kernel_init=init, use_bias=self.use_bias or self.qkv_bias,
            name=name)
        q = project(self.num_heads, ("embed", "heads", "kv"), "query", query_init)(inputs_q)
        if inputs_kv is None:  # a 'fixed' cache: the k/v an earlier call stored
            k, v = self.get_variable("cache", "cached_key"), self.get_variable("cache", "cached_value")
        else:
            k = project(self.num_kv_heads, ("embed", "kv_heads", "kv"), "key")(inputs_kv)
            v = project(self.num_kv_heads, ("embed", "kv_heads", "kv"), "value")(inputs_kv)
            if self.use_rope:
                k = rotary_embedding(k, kv_positions, self.rope_max_wavelength)
        if self.use_rope:
            q = rotary_embedding(q, q_positions, self.rope_max_wavelength)
        q = checkpoint_name(with_logical_constraint(q, ("batch", "length", "heads", "kv")), "query_proj")
        k = checkpoint_name(k, "key_proj")
        v = checkpoint_name(v, "value_proj")
        if self.kv_cache not in KV_CACHE_MODES:
            raise ValueError(f"Unknown kv_cache {self.kv_cache!r}; choose one of {list(KV_CACHE_MODES)}.")
        is_causal = self.is_causal
        if self.kv_cache == "append":
            k, v, mask, bias = self._append_to_cache(k, v, mask, bias)
            is_causal = False  # the slot mask above carries causality
        elif self.kv_cache == "fixed" and inputs_kv is not None:
            _cache_variable(self, "cached_key", k).value = k
            _cache_variable(self, "cached_value", v).value = v
        window = {}
        if self.sliding_window is not None and self.kv_cache != "append":  # the cache applies its own
            if is_causal and self.implementation not in EXPLICIT:
                window = {"local_window_size": (self.sliding_window - 1, 0)}  # cuDNN: its sliding-window kernel
            else:
                visible = masks.sliding_window_mask(jnp.arange(q.shape[1]), k.shape[1], self.sliding_window)
                visible = visible[None, None]
                mask = visible if mask is None else mask & visible
        scale = 1.0 if self.fold_scale_into_query else None
        if segment_ids is not None:
            out = packed_attention.causal_packed_attention(q, k, v, segment_ids, scale=scale,
                                                           max_segments=self.cudnn_segments_per_row)
        elif self.implementation in EXPLICIT:
            out = explicit_attention.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                                           is_causal=is_causal, blas=self._on_native_kernel())
        else:
            out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal,
                                               implementation=self.implementation, **window)
        out = with_logical_constraint(out, ("batch", "length", "heads", "kv"))
        return Dense((inputs_q.shape[-1],), ("heads", "kv", "embed"), self.dtype, contract_dims=2,
                     use_bias=self.use_bias, name="out")(out)

    def _on_native_kernel(self) -> bool:
        """'explicit_blas' runs on the fused native kernel in training and scoring; cached decoding
        (a query row per step) keeps XLA's products, where the kernel measured no steady gain
        (bench/NOTES.md, decoding)."""
        return self.implementation == "explicit_blas" and self.kv_cache == "none"

    def _append_to_cache(self, k: Array, v: Array, mask: Array | None,
                         bias: Array | None) -> tuple[Array, Array, Array | None, Array | None]:
        """Writes the new k/v at the cache index; returns the whole cache and the mask and bias over it."""
        initialized = self.has_variable("cache", "cached_key")
        cached_key = _cache_variable(self, "cached_key", k)
        cached_value = _cache_variable(self, "cached_value", v)
        index = nn_partitioning.variable_with_axes("cache", "cache_index", jnp.zeros, (), jnp.int32, axes=(),
                                                   module=self)
        if not initialized:  # the init pass: the cache takes its inputs' shape; attend as usual
            return k, v, mask, bias
        start, new = index.value, k.shape[1]
        cached_key.value = jax.lax.dynamic_update_slice_in_dim(cached_key.value, k.astype(cached_key.value.dtype),
                                                               start, axis=1)
        cached_value.value = jax.lax.dynamic_update_slice_in_dim(cached_value.value,
                                                                 v.astype(cached_value.value.dtype), start, axis=1)
        index.value = start + new
        # New token i sits in slot start + i and sees the slots up to its own (the last
        # sliding_window of them, with a window).
        slots = jnp.arange(cached_key.value.shape[1])
        q_slots = start + jnp.arange(new)
        visible = slots[None, :] <= q_slots[:, None]
        if self.sliding_window is not None:
            visible = visible & masks.sliding_window_mask(q_slots, slots.size, self.sliding_window)
        visible = visible[None, None]
        mask = visible if mask is None else mask & visible
        if bias is not None:
            if bias.shape[-2:] != (slots.size, slots.size):
                raise ValueError(f"A bias in decode mode spans every cache slot as query and key, "
                                 f"[..., {slots.size}, {slots.size}]; got {bias.shape}.")
            bias = jax.lax.dynamic_slice_in_dim(bias, start, new, axis=-2)
        return cached_key.value, cached_value.value, mask, bias


class MLP(nn.Module):
    """Transformer MLP: act_0(x Wi_0) * act_1(x Wi_1) * ... then Wo.

    One activation is a plain MLP (('gelu',): GPT-2); two make a gated one
    (('silu', 'linear'): SwiGLU of LLaMA; ('gelu', 'linear'): gated-GELU of T5 v1.1).
    """

    mlp_dim: int
    activations: tuple[str, ...] = ("silu", "linear")
    dtype: DType = jnp.float32
    use_bias: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        hidden = None
        for i, name in enumerate(self.activations):
            dense_name = "wi" if len(self.activations) == 1 else f"wi_{i}"
            h = Dense((self.mlp_dim,), ("embed", "mlp"), self.dtype, use_bias=self.use_bias, name=dense_name)(x)
            h = activation(name, h)
            hidden = h if hidden is None else hidden * h
        hidden = checkpoint_name(with_logical_constraint(hidden, ("batch", "length", "mlp")), "mlp_hidden")
        return Dense((x.shape[-1],), ("mlp", "embed"), self.dtype, use_bias=self.use_bias, name="wo")(hidden)


class RelativePositionBias(nn.Module):
    """T5's learned attention bias per (head, relative-position bucket): [1, heads, q_len, kv_len].

    Positions are the indices within the row; with packing, tokens of different segments never
    attend to each other, so each example sees the same relative positions it would see alone.
    """

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True
    dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, q_len: int, kv_len: int) -> Array:
        relative = jnp.arange(kv_len)[None, :] - jnp.arange(q_len)[:, None]
        buckets = relative_position_bucket(relative, bidirectional=self.bidirectional,
                                           num_buckets=self.num_buckets, max_distance=self.max_distance)
        table = param_with_axes(
            "rel_embedding", nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
            (self.num_heads, self.num_buckets), jnp.float32, axes=("heads", "relpos_buckets"),
        )
        bias = jnp.take(table, buckets, axis=1)  # [heads, q, kv]
        return bias[None].astype(self.dtype)
