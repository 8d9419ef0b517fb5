"""Pure loss functions for sequence models.

All return sums over tokens together with the number of weighted tokens, so callers can
normalise per non-padding target token across microbatches and devices exactly.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

Array = jax.Array


def cross_entropy_with_logits(
    logits: Array, targets: Array, *, z_loss: float = 0.0, label_smoothing: float = 0.0
) -> tuple[Array, Array]:
    """Per-token cross entropy (with optional z-loss) and the z-loss part alone.

    z-loss adds `z_loss * log(Z)^2` where Z is the softmax normaliser; it keeps logits from
    drifting (PaLM). Label smoothing spreads `label_smoothing` mass uniformly over the vocab.
    The gradient is written out (`_cross_entropy`): softmax minus the (smoothed) one-hot,
    one elementwise pass over the logits instead of autodiff's scatter into a zero array
    of the logits' size.
    """
    return _cross_entropy(logits.astype(jnp.float32), targets, float(z_loss), float(label_smoothing))


def _smoothed_target(vocab: int, label_smoothing: float) -> tuple[float, float]:
    """(probability of the target token, of every other token) in the smoothed target."""
    return 1.0 - label_smoothing + label_smoothing / vocab, label_smoothing / vocab


def _smoothing_constant(vocab: int, label_smoothing: float) -> float:
    """Entropy of the smoothed target: subtracted so that a perfect prediction scores 0."""
    on, off = _smoothed_target(vocab, label_smoothing)
    return on * math.log(on) + (vocab - 1) * off * math.log(off)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _cross_entropy(logits: Array, targets: Array, z_loss: float, label_smoothing: float) -> tuple[Array, Array]:
    loss, z_term, _ = _cross_entropy_forward(logits, targets, z_loss, label_smoothing)
    return loss, z_term


def _cross_entropy_forward(logits, targets, z_loss, label_smoothing):
    vocab = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    loss = log_z - target_logit
    if label_smoothing:
        mean_log_prob = jnp.mean(logits, axis=-1) - log_z
        loss = (1.0 - label_smoothing) * loss - label_smoothing * mean_log_prob
        loss = loss + _smoothing_constant(vocab, label_smoothing)
    z_term = z_loss * jnp.square(log_z)
    return loss + z_term, z_term, log_z


def _cross_entropy_fwd(logits, targets, z_loss, label_smoothing):
    loss, z_term, log_z = _cross_entropy_forward(logits, targets, z_loss, label_smoothing)
    return (loss, z_term), (logits, targets, log_z)


def _cross_entropy_bwd(z_loss, label_smoothing, residuals, cotangents):
    logits, targets, log_z = residuals
    g_loss, g_z = cotangents  # per-token cotangents of (loss + z_term) and of z_term
    vocab = logits.shape[-1]
    probs = jnp.exp(logits - log_z[..., None])
    # d loss / d logits = softmax - smoothed one-hot; d z_term / d logits = 2 z_loss log Z softmax.
    target = jnp.arange(vocab, dtype=targets.dtype) == targets[..., None]
    smoothed = jnp.where(target, *_smoothed_target(vocab, label_smoothing))
    grad = g_loss[..., None] * (probs - smoothed)
    if z_loss:  # a static float: without z-loss the step computes no term for it
        grad = grad + (2.0 * z_loss * log_z * (g_loss + g_z))[..., None] * probs
    return grad, None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def weighted_loss_sums(
    logits: Array, targets: Array, weights: Array, *, z_loss: float = 0.0,
    label_smoothing: float = 0.0,
) -> dict[str, Array]:
    """Sums of loss, z-loss and weights over tokens; padding has weight 0."""
    loss, z_term = cross_entropy_with_logits(logits, targets, z_loss=z_loss, label_smoothing=label_smoothing)
    weights = weights.astype(jnp.float32)
    return {
        "loss_sum": jnp.sum(loss * weights),
        "z_loss_sum": jnp.sum(z_term * weights),
        "weight_sum": jnp.sum(weights),
    }
