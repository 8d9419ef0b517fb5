"""Attention masks, rotary embedding, norms, relative position buckets, MLP and attention."""

import contextlib
import math
import unittest.mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from t5x_lite.errors import ConfigValueError
from t5x_lite.models import layers, masks
from t5x_lite.models.projection import project


def _reference_mask(segments):
    n = len(segments)
    mask = np.zeros((n, n), bool)
    for i in range(n):
        for j in range(n):
            mask[i, j] = j <= i and segments[i] == segments[j]
    return mask


def test_attention_mask_causal_without_packing():
    mask = np.asarray(masks.make_attention_mask(jnp.ones((2, 5), jnp.int32)))
    assert mask.shape == (2, 1, 5, 5) and mask.dtype == np.bool_
    np.testing.assert_array_equal(mask[0, 0], np.tril(np.ones((5, 5), bool)))
    np.testing.assert_array_equal(mask[1, 0], np.tril(np.ones((5, 5), bool)))


def test_attention_mask_keeps_packed_segments_apart():
    rows = [[1, 1, 2, 2, 2, 0, 0], [1, 2, 3, 3, 3, 3, 0], [1, 1, 1, 1, 1, 1, 1]]
    mask = np.asarray(masks.make_attention_mask(jnp.asarray(rows, jnp.int32)))
    assert mask.shape == (3, 1, 7, 7)
    for b, row in enumerate(rows):
        np.testing.assert_array_equal(mask[b, 0], _reference_mask(row))
        # Every query row can see at least itself.
        assert np.all(mask[b, 0].any(axis=-1))
    # Explicitly: token 2 (first of segment 2) cannot see tokens 0-1 of segment 1.
    assert not mask[0, 0, 2, :2].any() and mask[0, 0, 2, 2]


def _rand(key, shape):
    return jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32)


def test_rotary_embedding_preserves_norm_of_each_head_vector():
    x = _rand(0, (2, 6, 3, 8))
    positions = jnp.broadcast_to(jnp.arange(6) * 7, (2, 6))
    y = layers.rotary_embedding(x, positions)
    assert y.shape == x.shape
    np.testing.assert_allclose(np.linalg.norm(np.asarray(y), axis=-1),
                               np.linalg.norm(np.asarray(x), axis=-1), rtol=1e-5)
    # Position 0 is the identity; other positions really rotate.
    np.testing.assert_allclose(np.asarray(y[:, 0]), np.asarray(x[:, 0]), atol=1e-6)
    assert not np.allclose(np.asarray(y[:, 1]), np.asarray(x[:, 1]), atol=1e-3)


def test_rotary_dot_product_depends_only_on_relative_position():
    head_dim = 16
    q = _rand(1, (1, 1, 1, head_dim))
    k = _rand(2, (1, 1, 1, head_dim))

    def rotated_dot(m, n):
        qr = layers.rotary_embedding(q, jnp.array([[m]]))
        kr = layers.rotary_embedding(k, jnp.array([[n]]))
        return float(jnp.sum(qr * kr))

    np.testing.assert_allclose(rotated_dot(5, 2), rotated_dot(13, 10), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rotated_dot(3, 3), rotated_dot(20, 20), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rotated_dot(3, 3), float(jnp.sum(q * k)), rtol=1e-4, atol=1e-5)
    # Different offsets generally give different scores.
    assert abs(rotated_dot(5, 2) - rotated_dot(5, 4)) > 1e-3


def test_rotary_matches_numpy_complex_rotation():
    head_dim, wavelength = 8, 10_000.0
    x = np.asarray(_rand(3, (1, 4, 2, head_dim)))
    pos = np.array([[0, 1, 5, 9]])
    half = head_dim // 2
    inv_freq = 1.0 / wavelength ** (np.arange(half) / half)
    z = x[..., :half] + 1j * x[..., half:]
    rotated = z * np.exp(1j * pos[..., None, None] * inv_freq)
    expected = np.concatenate([rotated.real, rotated.imag], axis=-1)
    y = layers.rotary_embedding(jnp.asarray(x), jnp.asarray(pos), wavelength)
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5)


def test_rmsnorm_unit_scale_gives_unit_rms():
    x = 5.0 * _rand(4, (3, 7, 32)) + 2.0
    norm = layers.RMSNorm()
    variables = norm.init(jax.random.PRNGKey(0), x)
    np.testing.assert_array_equal(np.asarray(variables["params"]["scale"]), 1.0)
    y = np.asarray(norm.apply(variables, x))
    rms = np.sqrt(np.mean(np.square(y), axis=-1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-4)
    # The direction of each vector is kept.
    xn = np.asarray(x)
    cos = np.sum(y * xn, -1) / (np.linalg.norm(y, axis=-1) * np.linalg.norm(xn, axis=-1))
    np.testing.assert_allclose(cos, 1.0, rtol=1e-5)


def test_rmsnorm_scale_multiplies_output():
    x = _rand(5, (2, 16))
    norm = layers.RMSNorm()
    variables = norm.init(jax.random.PRNGKey(0), x)
    scale = jnp.arange(1.0, 17.0)
    y1 = norm.apply(variables, x)
    y2 = norm.apply({"params": {"scale": scale}}, x)
    np.testing.assert_allclose(np.asarray(y2), np.asarray(y1) * np.asarray(scale), rtol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("norm_class", [layers.RMSNorm, layers.LayerNorm])
def test_a_norm_saves_only_its_input_for_the_backward_pass(norm_class, dtype, capsys):
    """Its float32 intermediates (each twice a 16-bit input's size) are recomputed, not kept; the
    gradients equal plain autodiff's."""
    x = (3.0 * _rand(7, (4, 64)) + 1.0).astype(dtype)
    norm = norm_class(dtype=dtype)
    variables = norm.init(jax.random.PRNGKey(0), x)
    loss = lambda v, x: norm.apply(v, x).astype(jnp.float32).sum()  # noqa: E731
    jax.ad_checkpoint.print_saved_residuals(loss, variables, x)
    saved = capsys.readouterr().out.splitlines()
    x_type = jax.typeof(x).str_short(short_dtypes=True)  # bf16[4,64] or f32[4,64]
    assert [line for line in saved if "argument x" in line] == [f"{x_type} from the argument x"]
    assert not [line for line in saved if "argument" not in line], saved  # nothing computed is kept

    params = variables["params"]
    args = (params["scale"],) if norm_class is layers.RMSNorm else (params["scale"], params["bias"])
    pure = layers.rms_normalize if norm_class is layers.RMSNorm else layers.layer_normalize
    plain = lambda x: pure(x, *args, epsilon=norm.epsilon, dtype=dtype).astype(jnp.float32).sum()  # noqa: E731
    np.testing.assert_array_equal(np.asarray(jax.grad(loss, argnums=1)(variables, x), np.float32),
                                  np.asarray(jax.grad(plain)(x), np.float32))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("activations", [("gelu", "linear"), ("silu", "linear"), ("gelu",), ("gelu_exact",)])
def test_an_mlp_keeps_its_projections_and_product_only(activations, dtype, capsys):
    """The activations' intermediates (up to four arrays of the hidden size for GELU) are recomputed
    in the backward pass; the gradients equal plain autodiff's."""
    x = _rand(9, (2, 8, 16)).astype(dtype)
    mlp = layers.MLP(64, activations, dtype)
    variables = mlp.init(jax.random.PRNGKey(0), x)
    loss = lambda v, x: mlp.apply(v, x).astype(jnp.float32).sum()  # noqa: E731
    jax.ad_checkpoint.print_saved_residuals(loss, variables, x)
    hidden_type = jax.typeof(x).update(shape=(2, 8, 64)).str_short(short_dtypes=True)
    hidden = [line for line in capsys.readouterr().out.splitlines() if line.startswith(hidden_type)]
    # Each projection's output and the product; a gated MLP also keeps act(x W0) for the product's gradient.
    assert len(hidden) == len(activations) + 1 + (len(activations) > 1), hidden

    with unittest.mock.patch.object(layers, "activation", lambda name, h: layers.ACTIVATIONS[name](h)):
        plain = jax.grad(loss, argnums=(0, 1))(variables, x)
    for got, want in zip(jax.tree.leaves(jax.grad(loss, argnums=(0, 1))(variables, x)), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def _reference_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """T5's (mesh-tensorflow) relative position bucket, one position at a time in plain Python."""
    n = -relative_position  # > 0: the key is before the query
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            bucket += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    # A tiny epsilon puts exact bucket boundaries (n = max_exact * ratio**k) in the upper bucket,
    # as exact arithmetic would.
    scaled = math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    return bucket + min(max_exact + int(scaled + 1e-6), num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64)])
def test_relative_position_bucket_matches_t5_reference(bidirectional, num_buckets, max_distance):
    relative = np.arange(-300, 301)
    got = np.asarray(layers.relative_position_bucket(jnp.asarray(relative), bidirectional=bidirectional,
                                                     num_buckets=num_buckets, max_distance=max_distance))
    expected = np.array([_reference_bucket(int(r), bidirectional, num_buckets, max_distance) for r in relative])
    np.testing.assert_array_equal(got, expected)
    assert got.min() >= 0 and got.max() == num_buckets - 1


def test_relative_position_bucket_known_values():
    def bucket(r, bidirectional):
        return int(layers.relative_position_bucket(jnp.asarray([r]), bidirectional=bidirectional,
                                                   num_buckets=32, max_distance=128)[0])

    # Bidirectional: 16 buckets per direction, distances 0..7 exact, keys after the query in 16..31.
    assert [bucket(r, True) for r in (0, -1, -7, 1, 7)] == [0, 1, 7, 17, 23]
    assert bucket(-8, True) == 8 and bucket(8, True) == 24
    assert bucket(-128, True) == bucket(-300, True) == 15
    assert bucket(128, True) == bucket(300, True) == 31
    # Unidirectional: every future key is bucket 0; distances 0..15 exact; far past is bucket 31.
    assert [bucket(r, False) for r in (1, 5, 300)] == [0, 0, 0]
    assert [bucket(r, False) for r in (0, -1, -15, -16)] == [0, 1, 15, 16]
    assert bucket(-128, False) == bucket(-300, False) == 31
    # Buckets never decrease with distance into the past.
    past = [bucket(-d, False) for d in range(0, 200, 3)]
    assert past == sorted(past)


def test_layernorm_normalises_each_row_at_init():
    x = 5.0 * _rand(6, (3, 7, 32)) + 2.0
    norm = layers.LayerNorm()
    variables = norm.init(jax.random.PRNGKey(0), x)
    np.testing.assert_array_equal(np.asarray(variables["params"]["scale"]), 1.0)
    np.testing.assert_array_equal(np.asarray(variables["params"]["bias"]), 0.0)
    y = np.asarray(norm.apply(variables, x))
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.var(-1), 1.0, rtol=1e-3)
    # Against numpy, and the bias shifts every row.
    xn = np.asarray(x, np.float64)
    ref = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, atol=1e-4)
    bias = np.linspace(-1.0, 1.0, 32, dtype=np.float32)
    shifted = np.asarray(norm.apply({"params": {"scale": jnp.ones(32), "bias": jnp.asarray(bias)}}, x))
    np.testing.assert_allclose(shifted, y + bias, atol=1e-5)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("activations", [("gelu",), ("gelu", "linear")])
@pytest.mark.parametrize("use_bias", [False, True])
def test_mlp_parameter_names_and_function(activations, use_bias):
    x = _rand(7, (2, 3, 8))
    mlp = layers.MLP(16, activations, use_bias=use_bias)
    params = mlp.init(jax.random.PRNGKey(1), x)["params"]
    names = {"wi", "wo"} if len(activations) == 1 else {"wi_0", "wi_1", "wo"}
    assert set(params) == names
    for name in names:
        expected = {"kernel", "bias"} if use_bias else {"kernel"}
        assert set(params[name]) == expected
        assert params[name]["kernel"].shape == ((16, 8) if name == "wo" else (8, 16))
        if use_bias:
            assert params[name]["bias"].shape == ((8,) if name == "wo" else (16,))
    if use_bias:  # non-zero biases so that they are exercised
        params = jax.tree.map(lambda p: p + 0.1, params)

    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    xn = np.asarray(x, np.float64)

    def dense(name, h):
        return h @ p[name]["kernel"] + (p[name]["bias"] if use_bias else 0.0)

    if len(activations) == 1:
        hidden = _gelu_tanh(dense("wi", xn))
    else:
        hidden = _gelu_tanh(dense("wi_0", xn)) * dense("wi_1", xn)
    expected = dense("wo", hidden)
    np.testing.assert_allclose(np.asarray(mlp.apply({"params": params}, x)), expected, rtol=1e-4, atol=1e-5)


def _numpy_attention(params, xq, xkv, mask, bias, scale):
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    q = np.einsum("bld,dhk->blhk", xq, p["query"]["kernel"])
    k = np.einsum("bld,dhk->blhk", xkv, p["key"]["kernel"])
    v = np.einsum("bld,dhk->blhk", xkv, p["value"]["kernel"])
    logits = scale * np.einsum("bqhk,bshk->bhqs", q, k) + bias
    logits = np.where(mask, logits, -1e30)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("bhqs,bshk->bqhk", probs, v)
    return np.einsum("bqhk,hkd->bqd", out, p["out"]["kernel"])


@pytest.mark.parametrize("fold", [True, False])
def test_attention_matches_numpy_with_and_without_folded_scale(fold):
    heads, head_dim, emb = 2, 16, 8
    xq = _rand(8, (2, 5, emb))
    xkv = _rand(9, (2, 6, emb))
    rng = np.random.default_rng(0)
    mask = rng.random((2, 1, 5, 6)) < 0.7
    mask[..., 0] = True  # every query sees at least one key
    bias = rng.normal(size=(1, heads, 5, 6)).astype(np.float32)
    attention = layers.Attention(heads, heads, head_dim, use_rope=False, fold_scale_into_query=fold)
    args = (xq, xkv, jnp.asarray(mask))
    params = jax.jit(lambda: attention.init(jax.random.PRNGKey(2), *args, bias=jnp.asarray(bias)))()["params"]
    # Large query weights so that the 1/sqrt(head_dim) factor clearly matters.
    params = {**params, "query": {"kernel": params["query"]["kernel"] * (4.0 if fold else 1.0)}}
    got = np.asarray(jax.jit(lambda p: attention.apply({"params": p}, *args, bias=jnp.asarray(bias)))(params))
    xq64, xkv64 = np.asarray(xq, np.float64), np.asarray(xkv, np.float64)
    unscaled = _numpy_attention(params, xq64, xkv64, mask, bias, 1.0)
    scaled = _numpy_attention(params, xq64, xkv64, mask, bias, 1.0 / math.sqrt(head_dim))
    expected, other = (unscaled, scaled) if fold else (scaled, unscaled)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, other, atol=1e-3)


def test_folded_scale_shrinks_query_init_by_head_dim():
    emb, heads, head_dim = 256, 4, 16
    x = jnp.zeros((1, 2, emb))
    mask = jnp.ones((1, 1, 2, 2), bool)
    for fold, query_var in ((True, 1.0 / (emb * head_dim)), (False, 1.0 / emb)):
        params = layers.Attention(heads, heads, head_dim, use_rope=False, fold_scale_into_query=fold).init(
            jax.random.PRNGKey(3), x, x, mask)["params"]
        np.testing.assert_allclose(np.var(np.asarray(params["query"]["kernel"])), query_var, rtol=0.1)
        np.testing.assert_allclose(np.var(np.asarray(params["key"]["kernel"])), 1.0 / emb, rtol=0.1)


def test_attention_is_causal_adds_the_causal_mask_to_the_segment_mask():
    heads, head_dim, emb, length = 2, 8, 8, 6
    x = _rand(10, (2, length, emb))
    segments = jnp.asarray([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]], jnp.int32)
    segment_mask = masks.make_bidirectional_mask(segments, segments)
    bias = np.zeros((1, heads, length, length), np.float32)
    causal = layers.Attention(heads, heads, head_dim, use_rope=False, is_causal=True)
    params = jax.jit(lambda: causal.init(jax.random.PRNGKey(4), x, x, segment_mask))()["params"]
    got = np.asarray(jax.jit(lambda p: causal.apply({"params": p}, x, x, segment_mask))(params))
    combined = np.asarray(segment_mask) & np.tril(np.ones((length, length), bool))
    x64 = np.asarray(x, np.float64)
    expected = _numpy_attention(params, x64, x64, combined, bias, 1.0 / math.sqrt(head_dim))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # Same as passing the full causal-and-segment mask without is_causal; different from no causality.
    plain = layers.Attention(heads, heads, head_dim, use_rope=False)
    full_mask = masks.make_attention_mask(segments)
    run_plain = jax.jit(lambda p, mask: plain.apply({"params": p}, x, x, mask))
    np.testing.assert_allclose(np.asarray(run_plain(params, full_mask)), got, rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(run_plain(params, segment_mask)), got, atol=1e-3)


def test_attention_implementation_resolves_auto_to_explicit_on_cpu(monkeypatch):
    assert jax.default_backend() == "cpu" and jax.device_count() == 8
    for dtype in (jnp.float32, jnp.bfloat16):  # several devices: the kernel has no sharding rule
        assert layers.attention_implementation("auto", dtype, 64) == "explicit"
    # One device in float32: the fused native kernel, where it builds.
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    assert layers.attention_implementation("auto", jnp.float32, 64) == "explicit_blas"
    assert layers.attention_implementation("auto", jnp.float32, 64, platform="cpu") == "explicit_blas"
    assert layers.attention_implementation("auto", jnp.bfloat16, 64) == "explicit"
    monkeypatch.setattr(layers.kernels, "available", lambda: False)
    assert layers.attention_implementation("auto", jnp.float32, 64) == "explicit"
    # Asked for by name: float32 only.
    assert layers.attention_implementation("explicit_blas", jnp.float32, 64) == "explicit_blas"
    with pytest.raises(ConfigValueError, match="'explicit_blas' runs on CPU in float32, not on cpu in bfloat16"):
        layers.attention_implementation("explicit_blas", jnp.bfloat16, 64)
    with pytest.raises(ConfigValueError, match="not on gpu in float32"):
        layers.attention_implementation("explicit_blas", jnp.float32, 64, platform="gpu")
    assert layers.attention_implementation("xla", jnp.bfloat16, 64) == "xla"
    assert layers.attention_implementation("cudnn", jnp.float32, 64) == "cudnn"
    # Planned for another platform (the memory estimate): GPUs fuse 16-bit attention with a head_dim cuDNN takes.
    assert layers.attention_implementation("auto", jnp.bfloat16, 64, platform="gpu") == "cudnn"
    assert layers.attention_implementation("auto", jnp.bfloat16, 64, platform="gpu", allow_fused=False) == "xla"
    assert layers.attention_implementation("auto", jnp.float32, 64, platform="gpu") == "xla"
    assert layers.attention_implementation("auto", jnp.bfloat16, 256, platform="gpu") == "xla"
    assert layers.attention_implementation("auto", jnp.bfloat16, 64, platform="tpu") == "xla"


def test_explicit_blas_runs_the_kernel_in_training_and_xla_in_cached_decoding():
    """One query row per cached decoding step: there the products stay on XLA (docs/models.md)."""
    x = jnp.ones((2, 6, 16), jnp.float32)

    def custom_calls(kv_cache: str) -> int:
        attention = layers.Attention(2, 2, 8, use_rope=False, is_causal=True, implementation="explicit_blas",
                                     kv_cache=kv_cache)
        variables = attention.init(jax.random.PRNGKey(0), x, x, None)
        if kv_cache == "none":
            fn = lambda v, x: attention.apply(v, x, x, None)  # noqa: E731
        else:
            fn = lambda v, x: attention.apply(v, x[:, :1], x[:, :1], None, mutable=["cache"])  # noqa: E731
        return jax.jit(fn).lower(variables, x).as_text().count("t5x_lite_attention_")

    assert custom_calls("none") == 1  # the fused forward pass
    assert custom_calls("append") == 0


@pytest.mark.parametrize("contract_dims", [1, 2])
def test_projection_gradients_equal_autodiff_of_a_plain_dot(contract_dims):
    """`project`'s written-out backward pass (kernel gradient as dot(x, g)) equals JAX's own."""

    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 5, 3, 4)), jnp.float32)
    kernel_shape = (4, 6) if contract_dims == 1 else (3, 4, 6)
    kernel = jnp.asarray(rng.standard_normal(kernel_shape), jnp.float32)
    weights = jnp.asarray(rng.standard_normal((2, 5, 3, 6) if contract_dims == 1 else (2, 5, 6)), jnp.float32)

    def plain(x, kernel):
        contracted = tuple(range(x.ndim - contract_dims, x.ndim))
        return jax.lax.dot_general(x, kernel, ((contracted, tuple(range(contract_dims))), ((), ())))

    loss = lambda f: lambda x, kernel: jnp.sum(f(x, kernel) * weights)  # noqa: E731
    ours = lambda x, kernel: project(x, kernel, contract_dims)  # noqa: E731
    np.testing.assert_allclose(np.asarray(ours(x, kernel)), np.asarray(plain(x, kernel)), rtol=1e-6)
    for got, want in zip(jax.grad(loss(ours), argnums=(0, 1))(x, kernel),
                         jax.grad(loss(plain), argnums=(0, 1))(x, kernel)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_projection_casting_the_kernel_itself_equals_autodiff_of_cast_then_dot():
    """With `dtype` (and logical axes) the kernel is constrained and cast inside `project`; the
    output and both gradients equal autodiff of casting the float32 kernel first, bit for bit."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((2, 5, 4)), jnp.bfloat16)
    kernel = jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)
    weights = jnp.asarray(rng.standard_normal((2, 5, 6)), jnp.float32)
    loss = lambda f: lambda x, kernel: jnp.sum(f(x, kernel).astype(jnp.float32) * weights)  # noqa: E731
    ours = lambda x, kernel: project(x, kernel, 1, jnp.bfloat16, ("embed", "mlp"))  # noqa: E731
    cast_first = lambda x, kernel: project(x, kernel.astype(jnp.bfloat16))  # noqa: E731
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))
    with mesh, nn.logical_axis_rules((("embed", None), ("mlp", None))):
        got = jax.jit(jax.value_and_grad(loss(ours), argnums=(0, 1)))(x, kernel)
    want = jax.jit(jax.value_and_grad(loss(cast_first), argnums=(0, 1)))(x, kernel)
    assert got[1][1].dtype == jnp.float32
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


@pytest.mark.parametrize("under_mesh", [False, True])
def test_scanned_layers_keep_their_parameters_not_cast_copies_for_the_backward_pass(under_mesh, capsys):
    """Without remat, the backward pass of a scan over bfloat16 layers reads each kernel from the
    stacked float32 parameters; no bfloat16 (or other) copy of the weights is stacked per layer,
    also when the logical axis rules constrain the kernels (as under a mesh)."""
    from t5x_lite.models import stack

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h):
            h = jnp.tanh(layers.Dense(features=(64,), axes=("embed", "mlp"), dtype=jnp.bfloat16)(h))
            return layers.Dense(features=(32,), axes=("mlp", "embed"), dtype=jnp.bfloat16)(h), None

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x):
            return stack.stack_layers(Block, num_layers=3, scan=True, remat="none", num_broadcast=0)()(x)[0]

    model, x = Stack(), _rand(3, (4, 32)).astype(jnp.bfloat16)
    params = model.init(jax.random.PRNGKey(0), x)
    loss = lambda p, x: model.apply(p, x).astype(jnp.float32).sum()  # noqa: E731
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))
    with contextlib.ExitStack() as context:
        if under_mesh:
            context.enter_context(mesh)
            context.enter_context(nn.logical_axis_rules((("embed", None), ("mlp", None))))
        jax.ad_checkpoint.print_saved_residuals(loss, params, x)
    saved = capsys.readouterr().out.splitlines()
    weights = [line for line in saved if line.split(" ")[0].endswith(("[3,32,64]", "[3,64,32]"))]
    assert len(weights) == 2 and all("from the argument p['params']['layers']" in w for w in weights), saved
