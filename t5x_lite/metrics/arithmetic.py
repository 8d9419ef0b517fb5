"""Pure metric arithmetic: tokens per second, MFU, perplexity, per-token train metrics."""

from __future__ import annotations

import math
from typing import Mapping


def tokens_per_second(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def model_flops_utilization(*, flops_per_token: float, tokens_per_second: float,
                            peak_flops_per_device: float, num_devices: int) -> float:
    """Fraction of the hardware's peak FLOP/s spent on the model's own FLOPs (PaLM's MFU)."""
    return flops_per_token * tokens_per_second / (peak_flops_per_device * num_devices)


def perplexity(loss: float) -> float:
    """exp(loss), saturating instead of overflowing for a diverged run."""
    return math.exp(min(loss, 700.0))


def summarize_train_metrics(sums: Mapping[str, float], *, steps: int) -> dict[str, float]:
    """Turns summed device metrics of `steps` steps into per-token loss and per-step averages."""
    weight = max(sums["weight_sum"], 1.0)
    loss = sums["loss_sum"] / weight
    z = sums["z_loss_sum"] / weight
    ce = loss - z
    return {
        "loss": loss,
        "cross_entropy": ce,
        "z_loss": z,
        "perplexity": perplexity(ce),
        "grad_norm": sums["grad_norm"] / steps,
        "learning_rate": sums["learning_rate"] / steps,
    }
