"""Loss functions against independent numpy references."""

import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite.models import losses


def _np_log_softmax(logits):
    logits = logits.astype(np.float64)
    m = logits.max(axis=-1, keepdims=True)
    log_z = m[..., 0] + np.log(np.exp(logits - m).sum(axis=-1))
    return logits - log_z[..., None], log_z


def _random_case(seed=0, shape=(3, 5), vocab=11, scale=3.0):
    rng = np.random.default_rng(seed)
    logits = (scale * rng.standard_normal((*shape, vocab))).astype(np.float32)
    targets = rng.integers(0, vocab, size=shape).astype(np.int32)
    return logits, targets


def test_cross_entropy_matches_numpy_log_softmax():
    logits, targets = _random_case()
    log_probs, _ = _np_log_softmax(logits)
    expected = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    loss, z_term = losses.cross_entropy_with_logits(jnp.asarray(logits), jnp.asarray(targets))
    np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(z_term), 0.0)


def test_cross_entropy_is_shift_invariant_and_handles_large_logits():
    logits, targets = _random_case(seed=1)
    base, _ = losses.cross_entropy_with_logits(jnp.asarray(logits), jnp.asarray(targets))
    shifted, _ = losses.cross_entropy_with_logits(jnp.asarray(logits + 1000.0), jnp.asarray(targets))
    assert np.all(np.isfinite(np.asarray(shifted)))
    np.testing.assert_allclose(np.asarray(shifted), np.asarray(base), atol=1e-3)


def test_z_loss_term_is_z_times_logsumexp_squared():
    logits, targets = _random_case(seed=2)
    log_probs, log_z = _np_log_softmax(logits)
    z = 1e-2
    ce = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    loss, z_term = losses.cross_entropy_with_logits(jnp.asarray(logits), jnp.asarray(targets), z_loss=z)
    np.testing.assert_allclose(np.asarray(z_term), z * log_z**2, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(loss), ce + z * log_z**2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_label_smoothing_equals_kl_to_smoothed_target(smoothing):
    logits, targets = _random_case(seed=3)
    vocab = logits.shape[-1]
    log_probs, _ = _np_log_softmax(logits)
    # Smoothed target distribution and KL(target || model).
    target_dist = np.full(log_probs.shape, smoothing / vocab)
    np.put_along_axis(target_dist, targets[..., None], 1.0 - smoothing + smoothing / vocab, axis=-1)
    kl = np.sum(target_dist * (np.log(target_dist) - log_probs), axis=-1)
    loss, _ = losses.cross_entropy_with_logits(jnp.asarray(logits), jnp.asarray(targets),
                                               label_smoothing=smoothing)
    np.testing.assert_allclose(np.asarray(loss), kl, rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(loss) >= -1e-5)


def test_label_smoothing_perfect_prediction_scores_zero():
    smoothing, vocab = 0.1, 7
    targets = np.array([[0, 3, 6]], np.int32)
    on = 1.0 - smoothing + smoothing / vocab
    off = smoothing / vocab
    # Logits whose softmax is exactly the smoothed target: log-probabilities up to a constant.
    logits = np.full((1, 3, vocab), np.log(off), np.float32)
    np.put_along_axis(logits, targets[..., None], np.log(on), axis=-1)
    logits = logits + 5.0  # an arbitrary shift does not matter
    loss, _ = losses.cross_entropy_with_logits(jnp.asarray(logits), jnp.asarray(targets),
                                               label_smoothing=smoothing)
    np.testing.assert_allclose(np.asarray(loss), 0.0, atol=1e-5)
    # Without smoothing the same logits have a strictly positive loss, -log(on).
    plain, _ = losses.cross_entropy_with_logits(jnp.asarray(logits), jnp.asarray(targets))
    np.testing.assert_allclose(np.asarray(plain), -np.log(on), rtol=1e-5)


def test_weighted_loss_sums_ignore_zero_weight_positions():
    logits, targets = _random_case(seed=4, shape=(2, 6))
    weights = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]], np.float32)
    z = 1e-3
    sums = losses.weighted_loss_sums(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights),
                                     z_loss=z, label_smoothing=0.1)

    rng = np.random.default_rng(99)
    pad = weights == 0
    logits2 = logits.copy()
    logits2[pad] = 50.0 * rng.standard_normal(logits2[pad].shape)
    targets2 = targets.copy()
    targets2[pad] = (targets2[pad] + 3) % logits.shape[-1]
    sums2 = losses.weighted_loss_sums(jnp.asarray(logits2), jnp.asarray(targets2), jnp.asarray(weights),
                                      z_loss=z, label_smoothing=0.1)
    for key in ("loss_sum", "z_loss_sum", "weight_sum"):
        np.testing.assert_allclose(float(sums2[key]), float(sums[key]), rtol=1e-6)
    assert float(sums["weight_sum"]) == weights.sum() == 8.0

    # loss_sum equals the sum of per-token losses at the weighted positions (numpy reference).
    log_probs, log_z = _np_log_softmax(logits)
    vocab = logits.shape[-1]
    target_dist = np.full(log_probs.shape, 0.1 / vocab)
    np.put_along_axis(target_dist, targets[..., None], 0.9 + 0.1 / vocab, axis=-1)
    per_token = np.sum(target_dist * (np.log(target_dist) - log_probs), axis=-1) + z * log_z**2
    np.testing.assert_allclose(float(sums["loss_sum"]), np.sum(per_token * weights), rtol=1e-4)
    np.testing.assert_allclose(float(sums["z_loss_sum"]), np.sum(z * log_z**2 * weights), rtol=1e-5)


def test_weight_sum_counts_fractional_weights():
    logits, targets = _random_case(seed=5, shape=(2, 4))
    weights = np.array([[0.5, 1.0, 0.0, 2.0], [1.0, 0.0, 0.0, 0.25]], np.float32)
    sums = losses.weighted_loss_sums(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights))
    np.testing.assert_allclose(float(sums["weight_sum"]), 4.75)
    log_probs, _ = _np_log_softmax(logits)
    ce = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(float(sums["loss_sum"]), np.sum(ce * weights), rtol=1e-5)


def _autodiff_reference(logits, targets, weights, z_loss, label_smoothing):
    """The same objective written with log_softmax and a (smoothed) one-hot target, for JAX to differentiate."""
    import jax

    vocab = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target = jax.nn.one_hot(targets, vocab) * (1.0 - label_smoothing) + label_smoothing / vocab
    kl = jnp.sum(jax.scipy.special.xlogy(target, target) - target * log_probs, axis=-1)  # KL to the target
    loss = kl + z_loss * log_z**2
    return jnp.sum(loss * weights)


@pytest.mark.parametrize("z_loss,smoothing", [(0.0, 0.0), (1e-2, 0.0), (0.0, 0.2), (1e-3, 0.1)])
def test_cross_entropy_gradient_equals_autodiff_of_the_reference(z_loss, smoothing):
    """The written-out backward pass (softmax minus smoothed one-hot) equals JAX's own gradient,
    for the loss and for a weighted mix of the loss and the z-loss output."""
    import jax

    logits, targets = _random_case(seed=6, shape=(2, 5), vocab=13)
    weights = jnp.asarray(np.random.default_rng(7).uniform(0, 2, size=(2, 5)).astype(np.float32))
    logits, targets = jnp.asarray(logits), jnp.asarray(targets)

    def ours(x):
        sums = losses.weighted_loss_sums(x, targets, weights, z_loss=z_loss, label_smoothing=smoothing)
        return sums["loss_sum"] + 0.5 * sums["z_loss_sum"]

    def reference(x):
        z_part = jnp.sum(z_loss * jax.nn.logsumexp(x, axis=-1) ** 2 * weights)
        return _autodiff_reference(x, targets, weights, z_loss, smoothing) + 0.5 * z_part

    np.testing.assert_allclose(float(ours(logits)), float(reference(logits)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.grad(ours)(logits)), np.asarray(jax.grad(reference)(logits)),
                               rtol=1e-5, atol=1e-6)
