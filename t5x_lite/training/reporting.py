"""What the train loop prints and writes about its steps: window summaries, epoch stats, the initial-loss check."""

from __future__ import annotations

import math
from typing import Any, Sequence

from t5x_lite.metrics import arithmetic as metric_math
from t5x_lite.metrics.writer import MetricsWriter


def describe_epoch_stats(stats: dict[str, int]) -> str:
    """'N examples' plus, when any, how many were cut to the feature lengths (streaming), or
    'N rows (M tokens)' (read by index: whole documents, none cut)."""
    if "rows" in stats:
        return f"{stats['rows']:,} rows ({stats['tokens']:,} tokens) read"
    text = f"{stats.get('examples', 0):,} examples read"
    cut = {k[len("truncated_"):]: v for k, v in stats.items() if k.startswith("truncated_") and v}
    if cut:
        text += ", truncated to the feature length: " + ", ".join(f"{n:,} {k}" for k, n in cut.items())
    return text


# (label on the progress bar, key of the train metrics), in display order.
SHOWN_METRICS = (("loss", "loss"), ("ppl", "perplexity"), ("lr", "learning_rate"), ("gnorm", "grad_norm"),
                 ("tok/s", "tokens_per_second"), ("mfu", "mfu"))


def summarize_window(step_metrics: Sequence[dict[str, Any]], *, seconds: float, tokens_per_step: int,
                     flops_per_token: float, peak_flops_per_device: float | None,
                     num_devices: int) -> dict[str, float]:
    """Train metrics of the steps since the last report: per-token loss, averages, tokens/s, MFU.

    MFU is reported only when `peak_flops_per_device` is given.
    """
    # Skipped (non-finite) steps changed nothing; they are counted, not averaged in.
    finite = [m for m in step_metrics if not m.get("nonfinite_steps")] or list(step_metrics)
    sums = {k: float(sum(m[k] for m in finite)) for k in finite[0]}
    summary = metric_math.summarize_train_metrics(sums, steps=len(finite))
    summary["nonfinite_steps"] = float(sum(m.get("nonfinite_steps", 0) for m in step_metrics))
    summary["tokens_per_second"] = metric_math.tokens_per_second(len(step_metrics) * tokens_per_step, seconds)
    if peak_flops_per_device:
        summary["mfu"] = metric_math.model_flops_utilization(
            flops_per_token=flops_per_token, tokens_per_second=summary["tokens_per_second"],
            peak_flops_per_device=peak_flops_per_device, num_devices=num_devices)
    return summary


def initial_loss_warning(loss: float, vocab_size: int, tolerance: float) -> str | None:
    """A warning when an untrained model's loss is far from ln(vocab), the uniform-guess loss."""
    expected = math.log(vocab_size)
    if abs(loss - expected) <= tolerance:
        return None
    return (f"WARNING: the initial loss {loss:.3f} is far from ln(vocab_size)={expected:.3f}. Likely causes: "
            "a bad initialisation (a changed init scale), a vocabulary that does not match the data, "
            "or targets outside the vocabulary.")


def sanity_check_initial_loss(trainer, params, batch, vocab_size: int, tolerance: float,
                               writer: MetricsWriter) -> None:
    sums = trainer.eval_step(params, batch)
    loss = float(sums["loss_sum"]) / max(float(sums["weight_sum"]), 1.0)
    warning = initial_loss_warning(loss, vocab_size, tolerance)
    writer.print(warning or f"step 0: initial loss {loss:.3f} (ln(vocab_size) = {math.log(vocab_size):.3f}): ok")
