"""Optax optimizer and learning-rate schedule, built from explicit keyword arguments."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


def warmup_cosine_schedule(
    step: jax.Array | int, *, peak_learning_rate: float, warmup_steps: int, decay_steps: int,
    final_learning_rate_fraction: float = 0.1,
) -> jax.Array:
    """Linear warmup from 0 to the peak, then cosine decay to `final_learning_rate_fraction * peak`.

    `decay_steps` counts from the end of the warmup; past it the rate stays at the final value.
    """
    step = jnp.asarray(step, jnp.float32)
    warmup = peak_learning_rate * step / max(warmup_steps, 1)
    progress = jnp.clip((step - warmup_steps) / max(decay_steps, 1), 0.0, 1.0)
    final = final_learning_rate_fraction * peak_learning_rate
    cosine = final + 0.5 * (peak_learning_rate - final) * (1.0 + jnp.cos(jnp.pi * progress))
    return jnp.where(step < warmup_steps, warmup, cosine)


def weight_decay_mask(params):
    """True for matrices (kernels, embeddings), False for norm scales, scanned or not."""
    def is_matrix(path, _):
        return getattr(path[-1], "key", None) in ("kernel", "embedding")
    return jax.tree_util.tree_map_with_path(is_matrix, params)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with warmup + cosine decay and global-norm clipping (bound in gin/runs/*.gin).

    Attributes:
      peak_learning_rate: learning rate at the end of warmup.
      warmup_steps: steps of linear warmup from 0.
      decay_steps: steps of cosine decay after warmup; None decays over the rest of the run.
      final_learning_rate_fraction: the final rate as a fraction of the peak.
      b1, b2, eps: Adam moments' decay rates and epsilon.
      weight_decay: decoupled weight decay, applied to matrices only (not norms' scales).
      clip_grad_norm: clip gradients to this global norm; 0 disables clipping.
    """

    peak_learning_rate: float = 3e-3
    warmup_steps: int = 100
    decay_steps: int | None = None
    final_learning_rate_fraction: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_grad_norm: float = 1.0

    def schedule(self, total_steps: int) -> optax.Schedule:
        decay = self.decay_steps if self.decay_steps is not None else max(total_steps - self.warmup_steps, 1)
        return lambda step: warmup_cosine_schedule(
            step, peak_learning_rate=self.peak_learning_rate, warmup_steps=self.warmup_steps,
            decay_steps=decay, final_learning_rate_fraction=self.final_learning_rate_fraction,
        )

    def build(self, total_steps: int) -> optax.GradientTransformation:
        """The optax transformation for a run of `total_steps` optimizer steps."""
        adamw = optax.adamw(
            self.schedule(total_steps), b1=self.b1, b2=self.b2, eps=self.eps,
            weight_decay=self.weight_decay, mask=weight_decay_mask,
        )
        if self.clip_grad_norm:
            return optax.chain(optax.clip_by_global_norm(self.clip_grad_norm), adamw)
        return adamw
