"""Pure loss functions for sequence models.

All return sums over tokens together with the number of weighted tokens, so callers can
normalise per non-padding target token across microbatches and devices exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def cross_entropy_with_logits(
    logits: Array, targets: Array, *, z_loss: float = 0.0, label_smoothing: float = 0.0
) -> tuple[Array, Array]:
    """Per-token cross entropy (with optional z-loss) and the z-loss part alone.

    z-loss adds `z_loss * log(Z)^2` where Z is the softmax normaliser; it keeps logits from
    drifting (PaLM). Label smoothing spreads `label_smoothing` mass uniformly over the vocab.
    """
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)
    log_probs = logits - log_z[..., None]
    target_log_prob = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    loss = -target_log_prob
    if label_smoothing:
        loss = (1.0 - label_smoothing) * loss - label_smoothing * jnp.mean(log_probs, axis=-1)
        # Subtract the entropy of the smoothed target so a perfect prediction scores 0.
        on = 1.0 - label_smoothing + label_smoothing / vocab
        off = label_smoothing / vocab
        loss = loss + (on * jnp.log(on) + (vocab - 1) * off * jnp.log(off))
    z_term = z_loss * jnp.square(log_z)
    return loss + z_term, z_term


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
