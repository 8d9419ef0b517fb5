"""`WandbWriter`: a run's scalars and gin config in Weights & Biases (offline files or online).

`wandb` is imported only when this writer is checked or opened (`make install-tracking`). The run's
W&B id is made on its first run and kept in MODEL_DIR/tracking/wandb_run_id; a resumed run
(the same MODEL_DIR) calls `wandb.init(id=..., resume='allow')` and continues the same W&B run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import string
import tempfile
from typing import Any, ClassVar, Mapping

from t5x_lite import storage
from t5x_lite.errors import ConfigValueError
from t5x_lite.metrics import tracking

MODES = ("offline", "online")


@dataclasses.dataclass(frozen=True)
class WandbWriter(tracking.MetricWriter):
    """Weights & Biases: scalars as `<name>/<key>` at each step, the gin config as the run's config.

    Attributes:
      project: the W&B project.
      entity: the W&B user or team (None: the logged-in user's default).
      mode: 'offline' writes the run under MODEL_DIR/wandb/ (no network; `wandb sync` uploads it
        later) or 'online' streams it to W&B (needs `wandb login` or WANDB_API_KEY).
      name: the run's display name (None: W&B picks one).
    """

    kind: ClassVar[str] = "wandb"
    remote: ClassVar[bool] = True
    project: str = "t5x_lite"
    entity: str | None = None
    mode: str = "offline"
    name: str | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigValueError(f"WandbWriter.mode={self.mode!r}: use one of {MODES}.")
        if not (isinstance(self.project, str) and self.project):
            raise ConfigValueError(f"WandbWriter.project={self.project!r} must be a non-empty string in quotes.")

    def check(self) -> None:
        tracking.import_extra("wandb", "WandbWriter")

    def open(self, run: tracking.RunInfo) -> tracking.Sink:
        wandb = tracking.import_extra("wandb", "WandbWriter")
        run_id = tracking.stored_run_id(run.model_dir, self.kind) or new_run_id()
        local_dir = local_dir_for(run.local_dir)
        if local_dir != run.local_dir:
            run.say(f"WandbWriter: W&B writes local files only: this run's are in {local_dir}/wandb/.")
        os.makedirs(local_dir, exist_ok=True)
        try:
            wandb_run = wandb.init(project=self.project, entity=self.entity, name=self.name, dir=local_dir,
                                   mode=self.mode, id=run_id, resume="allow",
                                   config={key: tracking.literal(value) for key, value in run.config.items()})
        except wandb.errors.Error as e:
            raise tracking.TrackingError(
                f"WandbWriter could not start W&B run {run_id!r} ({e}); online, log in first (`wandb login` or "
                "WANDB_API_KEY), or use --gin.WandbWriter.mode=\"'offline'\".") from None
        tracking.store_run_id(run.model_dir, self.kind, run_id)
        return _WandbSink(wandb_run)


def local_dir_for(run_dir: str) -> str:
    """`run_dir` when local; for a gs:// run directory, a folder of the temp dir named by its hash."""
    if not storage.is_url(run_dir):
        return run_dir
    name = hashlib.sha256(run_dir.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "t5x_lite_wandb", name)


def new_run_id() -> str:
    """A fresh W&B run id: 8 lowercase letters and digits, as W&B's own."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class _WandbSink:
    def __init__(self, wandb_run: Any):
        self._run = wandb_run

    def scalars(self, name: str, step: int, values: Mapping[str, float]) -> None:
        self._run.log({f"{name}/{key}": float(value) for key, value in values.items()}, step=step)

    def close(self, status: str) -> None:
        if status == "KILLED":
            self._run.mark_preempting()  # stopped to be resumed (W&B shows it as preempted, not crashed)
        self._run.finish(exit_code=0 if status == "FINISHED" else 1)
