"""Attention mask, rotary embedding and RMSNorm."""

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite.models import layers


def _reference_mask(segments):
    n = len(segments)
    mask = np.zeros((n, n), bool)
    for i in range(n):
        for j in range(n):
            mask[i, j] = j <= i and segments[i] == segments[j]
    return mask


def test_attention_mask_causal_without_packing():
    mask = np.asarray(layers.make_attention_mask(jnp.ones((2, 5), jnp.int32)))
    assert mask.shape == (2, 1, 5, 5) and mask.dtype == np.bool_
    np.testing.assert_array_equal(mask[0, 0], np.tril(np.ones((5, 5), bool)))
    np.testing.assert_array_equal(mask[1, 0], np.tril(np.ones((5, 5), bool)))


def test_attention_mask_keeps_packed_segments_apart():
    rows = [[1, 1, 2, 2, 2, 0, 0], [1, 2, 3, 3, 3, 3, 0], [1, 1, 1, 1, 1, 1, 1]]
    mask = np.asarray(layers.make_attention_mask(jnp.asarray(rows, jnp.int32)))
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
