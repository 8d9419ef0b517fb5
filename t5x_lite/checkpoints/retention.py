"""Which checkpoints to keep: the last N, every K-th step for good, and the best N by a metric.

A pure function of the saved steps and their metrics, so it is tested directly and applied the
same way to local, `gs://` and `s3://` model directories.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from t5x_lite.errors import ConfigValueError


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    """What survives when a new checkpoint is saved; a step kept by any rule is kept.

    Attributes:
      keep_last: the most recent checkpoints to keep (at least 1: the newest is never deleted).
      keep_every: keep every checkpoint whose step is a multiple of this, permanently (None: off).
      keep_best: keep this many checkpoints with the best `best_metric` (0: off).
      best_metric: the metric ranked by keep_best, as saved with the checkpoint ('eval/loss', ...).
      best_mode: 'min' (lower is better, as for a loss) or 'max' (as for an accuracy).
    """

    keep_last: int = 3
    keep_every: int | None = None
    keep_best: int = 0
    best_metric: str = "eval/loss"
    best_mode: str = "min"

    def __post_init__(self):
        if self.keep_last < 1:
            raise ConfigValueError(f"RetentionPolicy.keep_last={self.keep_last}: keep at least the newest checkpoint (1).")
        if self.keep_every is not None and self.keep_every < 1:
            raise ConfigValueError(f"RetentionPolicy.keep_every={self.keep_every} must be a positive step count or None.")
        if self.keep_best < 0:
            raise ConfigValueError(f"RetentionPolicy.keep_best={self.keep_best} must be >= 0.")
        if self.best_mode not in ("min", "max"):
            raise ConfigValueError(f"RetentionPolicy.best_mode={self.best_mode!r}: use 'min' or 'max'.")


def steps_to_keep(steps: Sequence[int], metrics: Mapping[int, Mapping[str, float]],
                  policy: RetentionPolicy) -> set[int]:
    """The subset of `steps` that `policy` keeps; `metrics[step]` holds what was saved with each.

    Steps without the ranked metric (or with a NaN) never count as best; they survive only by
    the other rules.
    """
    ordered = sorted(set(steps))
    keep = set(ordered[-policy.keep_last:])
    if policy.keep_every:
        keep |= {s for s in ordered if s % policy.keep_every == 0}
    if policy.keep_best:
        ranked = [(metrics[s][policy.best_metric], s) for s in ordered
                  if policy.best_metric in metrics.get(s, {}) and not math.isnan(metrics[s][policy.best_metric])]
        # Ties go to the later step (the model that trained longer).
        ranked.sort(key=lambda vs: (vs[0] if policy.best_mode == "min" else -vs[0], -vs[1]))
        keep |= {s for _, s in ranked[:policy.keep_best]}
    return keep
