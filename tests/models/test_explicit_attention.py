"""The explicit attention (models/explicit_attention.py), on XLA and on the fused native kernel
('explicit_blas'): the same value and gradients as autodiff of jax.nn.dot_product_attention's
XLA math, with packed segments, grouped-query heads, biases and fully masked rows."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite.models import explicit_attention, masks


@pytest.mark.parametrize("blas", [False, True])
@pytest.mark.parametrize("kv_heads,with_bias,is_causal", [(4, False, True), (2, True, True), (4, True, False)])
def test_explicit_attention_equals_xla_attention_and_its_gradients(kv_heads, with_bias, is_causal, blas):
    """Same outputs and the same gradients for q, k, v and the bias (written-out backward pass vs
    autodiff of jax.nn.dot_product_attention), with packed segments, grouped-query heads and a bias;
    the products on XLA and on the native kernel ('explicit_blas')."""

    rng = np.random.default_rng(0)
    batch, length, heads, head_dim = 2, 12, 4, 8
    q = jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((batch, length, kv_heads, head_dim)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((batch, length, kv_heads, head_dim)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal((1, heads, length, length)), jnp.float32) if with_bias else None
    segments = jnp.asarray([[1] * 5 + [2] * 7, [1] * 12])
    mask = masks.make_bidirectional_mask(segments, segments)
    _assert_explicit_attention_equals_xla(rng, q, k, v, bias, mask=mask, scale=0.3, is_causal=is_causal, blas=blas)


def _assert_explicit_attention_equals_xla(rng, q, k, v, bias, blas=False, **kwargs):
    """The explicit attention's value and its gradients for q, k, v (and the bias) equal autodiff of
    jax.nn.dot_product_attention's XLA math, under a random weighting of the output."""
    weights = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def loss(attend, q, k, v, bias):
        return jnp.sum(attend(q, k, v, bias=bias, **kwargs) * weights)

    xla = functools.partial(jax.nn.dot_product_attention, implementation="xla")
    explicit = functools.partial(explicit_attention.dot_product_attention, blas=blas)
    args = (q, k, v, bias)
    argnums = (1, 2, 3) if bias is None else (1, 2, 3, 4)  # q, k, v (and the bias) after `attend`
    np.testing.assert_allclose(float(loss(explicit, *args)), float(loss(xla, *args)), rtol=1e-5)
    for got, want in zip(jax.grad(loss, argnums=argnums)(explicit, *args),
                         jax.grad(loss, argnums=argnums)(xla, *args)):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("blas", [False, True])
def test_a_query_row_with_nothing_visible_gets_no_gradient_as_in_xla(blas):
    """A fully masked row averages every value (the masked scores are replaced by one constant), so
    neither its query nor the bias there gets any gradient."""
    rng = np.random.default_rng(5)
    batch, length, heads, head_dim = 2, 6, 4, 8
    q = jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((batch, length, 2, head_dim)), jnp.float32) for _ in range(2))
    bias = jnp.asarray(rng.standard_normal((1, heads, length, length)), jnp.float32)
    mask = np.ones((batch, 1, length, length), bool)
    mask[0, :, 2, :] = False
    _assert_explicit_attention_equals_xla(rng, q, k, v, bias, mask=jnp.asarray(mask), blas=blas)


@pytest.mark.parametrize("blas", [False, True])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_explicit_attention_broadcasts_masks_and_biases_shared_by_heads_and_queries(kv_heads, blas):
    """Grouped-query heads stack along the query length: a padding mask with one query row, a bias
    shared by every head, and the bias's gradient summed to its shape, as autodiff of the XLA math."""
    rng = np.random.default_rng(3)
    batch, length, heads, head_dim = 2, 6, 4, 8
    q = jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((batch, length, kv_heads, head_dim)), jnp.float32) for _ in range(2))
    bias = jnp.asarray(rng.standard_normal((1, 1, length, length)), jnp.float32)
    mask = jnp.asarray([[True] * 4 + [False] * 2, [True] * 6])[:, None, None, :]  # [batch, 1, 1, kv]
    _assert_explicit_attention_equals_xla(rng, q, k, v, bias, mask=mask, is_causal=True, blas=blas)
    # A bias per key/value head is not one per query head: refused, not broadcast over the groups.
    with pytest.raises(ValueError, match="heads dimension is 2: it must be 1 or 4"):
        explicit_attention.dot_product_attention(q, k, v, bias=jnp.zeros((1, 2, length, length)))
