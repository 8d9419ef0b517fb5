"""The fused native CPU attention: forward and every gradient equal plain jnp softmax attention,
for multi-head, grouped-query and cross attention, masks and biases of every allowed shape;
inside jit, scan, vmap and sharding; one clear error for what it does not take."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from t5x_lite import kernels

MASKED = -0.7 * float(np.finfo(np.float32).max)


def reference(q, k, v, mask, bias, scale):
    """Softmax attention in plain jnp, k and v repeated over each key/value head's query heads."""
    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))
    scores = jnp.einsum("bthd,bshd->bhts", q, k, precision="highest") * scale
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = jnp.where(mask, scores, MASKED)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v, precision="highest")


def _inputs(rng, batch, q_len, kv_len, heads, kv_heads, head_dim):
    q = rng.standard_normal((batch, q_len, heads, head_dim), dtype=np.float32)
    k, v = (rng.standard_normal((batch, kv_len, kv_heads, head_dim), dtype=np.float32) for _ in range(2))
    return q, k, v


def _loss(fn, d_out):
    return lambda q, k, v, bias: jnp.sum(fn(q, k, v, bias) * d_out)


def _assert_matches_reference(q, k, v, mask, bias, scale=0.3):
    d_out = np.random.default_rng(9).standard_normal(q.shape, dtype=np.float32)
    fused = lambda q, k, v, bias: kernels.attention(q, k, v, mask=mask, bias=bias, scale=scale)  # noqa: E731
    plain = lambda q, k, v, bias: reference(q, k, v, mask, bias, scale)  # noqa: E731
    argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
    got_out = jax.jit(fused)(q, k, v, bias)
    np.testing.assert_allclose(np.asarray(got_out), np.asarray(plain(q, k, v, bias)), rtol=1e-5, atol=2e-6)
    got = jax.jit(jax.grad(_loss(fused, d_out), argnums=argnums))(q, k, v, bias)
    want = jax.grad(_loss(plain, d_out), argnums=argnums)(q, k, v, bias)
    for name, g, w in zip("q k v bias".split(), got, want):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("q_len,kv_len", [(37, 37), (5, 19)])
def test_equals_plain_attention_forward_and_backward(heads, kv_heads, q_len, kv_len):
    rng = np.random.default_rng(heads * 10 + kv_heads + q_len)
    q, k, v = _inputs(rng, 2, q_len, kv_len, heads, kv_heads, 16)
    mask = rng.random((2, 1, q_len, kv_len)) > 0.3
    _assert_matches_reference(q, k, v, mask, None)


@pytest.mark.parametrize("mask_shape,bias_shape", [
    (None, None), ((1, 1, 6, 9), (1, 4, 6, 9)), ((2, 4, 6, 9), (2, 1, 6, 9)), ((2, 1, 1, 9), (1, 1, 1, 9))])
def test_masks_and_biases_of_every_allowed_shape_with_the_bias_gradient(mask_shape, bias_shape):
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, 2, 6, 9, 4, 2, 8)
    mask = None if mask_shape is None else rng.random(mask_shape) > 0.4
    bias = None if bias_shape is None else rng.standard_normal(bias_shape, dtype=np.float32)
    _assert_matches_reference(q, k, v, mask, bias)


def test_a_row_with_nothing_visible_averages_every_value():
    rng = np.random.default_rng(4)
    q, k, v = _inputs(rng, 1, 3, 5, 2, 2, 4)
    mask = np.ones((1, 1, 3, 5), bool)
    mask[..., 1, :] = False
    out = np.asarray(kernels.attention(q, k, v, mask=mask, scale=1.0))
    np.testing.assert_allclose(out[0, 1], v[0].mean(axis=0), rtol=1e-5, atol=1e-6)
    _assert_matches_reference(q, k, v, mask, None)


def test_large_matrices_and_many_tasks():
    """More (batch, key/value head) tasks than threads, each larger than BLAS's small-matrix path."""
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, 3, 96, 96, 4, 4, 32)
    causal = np.tril(np.ones((96, 96), bool))[None, None]
    _assert_matches_reference(q, k, v, causal, None, scale=32 ** -0.5)


@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_causal_rows_skip_the_keys_their_mask_hides_and_still_equal_plain_attention(with_bias):
    """Blocks of 64 queries see only the keys their mask leaves visible (causal: none after the
    block; packing: none of earlier segments); rows of padding attend to padding only."""
    rng = np.random.default_rng(8)
    length = 200
    q, k, v = _inputs(rng, 2, length, length, 4, 2, 16)
    segments = np.zeros((2, length), int)
    segments[0, :70], segments[0, 70:150], segments[0, 150:190] = 1, 2, 3  # then padding
    segments[1, :] = 1
    mask = (segments[:, None, :, None] == segments[:, None, None, :]) & np.tril(np.ones((length, length), bool))
    bias = rng.standard_normal((1, 4, length, length), dtype=np.float32) if with_bias else None
    _assert_matches_reference(q, k, v, mask, bias, scale=0.25)


def test_the_forward_pass_alone_writes_no_probabilities():
    q, k, v = _inputs(np.random.default_rng(6), 1, 4, 4, 2, 2, 8)
    forward = jax.jit(lambda q, k, v: kernels.attention(q, k, v, scale=1.0)).lower(q, k, v).as_text()
    trained = jax.jit(jax.grad(lambda q, k, v: jnp.sum(kernels.attention(q, k, v, scale=1.0)))).lower(q, k, v)
    assert "tensor<0xf32>" in forward and "tensor<1x2x4x4xf32>" not in forward
    assert "tensor<1x2x4x4xf32>" in trained.as_text()


def test_scan_vmap_and_a_sharded_batch():
    rng = np.random.default_rng(7)
    q, k, v = _inputs(rng, 8, 6, 6, 2, 2, 4)
    want = reference(q, k, v, None, None, 0.5)
    attend = lambda q, k, v: kernels.attention(q, k, v, scale=0.5)  # noqa: E731
    _, scanned = jax.jit(lambda q, k, v: jax.lax.scan(lambda c, x: (c, attend(*(a[None] for a in x))[0]),
                                                      0, (q, k, v)))(q, k, v)
    np.testing.assert_allclose(np.asarray(scanned), want, rtol=1e-5, atol=1e-6)
    mapped = jax.vmap(attend)(*(x.reshape((2, 4) + x.shape[1:]) for x in (q, k, v)))
    np.testing.assert_allclose(np.asarray(mapped).reshape(want.shape), want, rtol=1e-5, atol=1e-6)
    # No sharding rule: XLA gathers the operands, and the result is still the attention.
    spread = NamedSharding(jax.make_mesh((len(jax.devices()),), ("data",)), PartitionSpec("data"))
    sharded = jax.jit(attend)(*(jax.device_put(x, spread) for x in (q, k, v)))
    np.testing.assert_allclose(np.asarray(sharded), want, rtol=1e-5, atol=1e-6)


def test_refuses_other_dtypes_and_mismatched_shapes():
    q, k, v = (jnp.ones((1, 4, 2, 8)) for _ in range(3))
    with pytest.raises(TypeError, match="float32"):
        kernels.attention(q.astype(jnp.bfloat16), k, v, scale=1.0)
    with pytest.raises(ValueError, match="kv_heads dividing heads"):
        kernels.attention(jnp.ones((1, 4, 3, 8)), k, v, scale=1.0)
    with pytest.raises(ValueError, match="k and v alike"):
        kernels.attention(q, k, jnp.ones((1, 5, 2, 8)), scale=1.0)
    with pytest.raises(ValueError, match=r"mask and bias are \[batch or 1, heads or 1"):
        kernels.attention(q, k, v, mask=jnp.ones((1, 3, 4, 4), bool), scale=1.0)


@pytest.mark.parametrize("masked", [False, True])
def test_more_rows_than_one_scratch_block(masked):
    """300 queries over 4,096 keys: without a probabilities output (forward) or a bias (backward),
    the kernel keeps 256 rows of scores at a time in scratch (attention.cc's ScratchRows)."""
    rng = np.random.default_rng(6)
    q, k, v = _inputs(rng, 1, 300, 4096, 2, 1, 8)
    mask = rng.random((1, 1, 300, 4096)) > 0.3 if masked else None
    _assert_matches_reference(q, k, v, mask, None)
