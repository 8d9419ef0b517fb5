"""`MlflowWriter`: a run's scalars, gin config (params) and config.gin (an artifact) in MLflow.

Through `mlflow.MlflowClient` (no global fluent state); `mlflow` is imported only when this writer
is checked or opened (`make install-tracking`). The MLflow run is created on the first run and its
id kept in MODEL_DIR/tracking/mlflow_run_id; a resumed run reopens it (status RUNNING again) and
appends to its metric history.

Params are the operative gin config, one per binding (`train.log_period`, `MODEL_DIR`, ...),
within MLflow's limits: a key over 250 characters is cut and ends in a hash of the whole key, a
value over 6000 characters is cut and says so at its end. MLflow refuses to change a logged
param, so a resumed run logs only what is new: a binding already logged with the same value is
skipped, and one whose value changed (often TRAIN_STEPS) is logged as
`resumed_at_step_<N>/<binding>` (N: the step resumed from), with a line saying so; the first
value stays under the plain key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile
import time
from typing import Any, ClassVar, Mapping

from t5x_lite.errors import ConfigValueError
from t5x_lite.metrics import tracking

MAX_KEY_CHARS = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
MAX_VALUE_CHARS = 6000  # MAX_PARAM_VAL_LENGTH
PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
METRICS_PER_BATCH = 1000  # MAX_METRICS_PER_BATCH
_NOT_IN_KEYS = re.compile(r"[^/\w.\- ]")  # MLflow keys: letters, digits, _ - . space /
MODEL_DIR_TAG = "t5x_lite.model_dir"


@dataclasses.dataclass(frozen=True)
class MlflowWriter(tracking.MetricWriter):
    """MLflow: scalars as `<name>/<key>` metrics at each step, the gin bindings as params,
    config.gin as an artifact; the run is marked FINISHED, FAILED or KILLED at the end.

    Attributes:
      tracking_uri: the tracking server (e.g. 'http://127.0.0.1:5000'); None: the
        MLFLOW_TRACKING_URI environment variable.
      experiment: the experiment the run goes in (created if missing).
      run_name: the run's name (None: MLflow picks one).
    """

    kind: ClassVar[str] = "mlflow"
    remote: ClassVar[bool] = True
    tracking_uri: str | None = None
    experiment: str = "t5x_lite"
    run_name: str | None = None

    def __post_init__(self):
        if not (isinstance(self.experiment, str) and self.experiment):
            raise ConfigValueError(f"MlflowWriter.experiment={self.experiment!r} must be a non-empty string in quotes.")

    def uri(self) -> str:
        """The tracking URI: `tracking_uri`, else $MLFLOW_TRACKING_URI, else a ConfigValueError naming both."""
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise ConfigValueError("MlflowWriter needs a tracking server: set --gin.MlflowWriter.tracking_uri="
                                   "\"'http://HOST:PORT'\" or the MLFLOW_TRACKING_URI environment variable.")
        return uri

    def check(self) -> None:
        tracking.import_extra("mlflow", "MlflowWriter")
        self.uri()

    def open(self, run: tracking.RunInfo) -> tracking.Sink:
        tracking.import_extra("mlflow", "MlflowWriter")
        from mlflow.exceptions import MlflowException

        try:
            return _MlflowSink(self, run)
        except MlflowException as e:
            raise tracking.TrackingError(f"MlflowWriter could not open its run on {self.uri()}: "
                                         f"{tracking.first_line(e)}") from None


def mlflow_key(text: str) -> str:
    """`text` as an MLflow param or metric key: other characters become '_'; a key too long is cut
    and ends in 8 hex digits of its hash (two long keys stay apart)."""
    key = _NOT_IN_KEYS.sub("_", text)
    if len(key) > MAX_KEY_CHARS:
        key = key[:MAX_KEY_CHARS - 9] + "~" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return key


def mlflow_value(text: str) -> str:
    """`text` as an MLflow param value: cut to 6000 characters, the end saying how long it was."""
    if len(text) <= MAX_VALUE_CHARS:
        return text
    note = f" ...[cut: {len(text)} characters]"
    return text[:MAX_VALUE_CHARS - len(note)] + note


def params_to_log(config: Mapping[str, str], logged: Mapping[str, str], *,
                  resumed_at: int) -> tuple[dict[str, str], list[str]]:
    """(the params to log now, the bindings whose value changed since they were logged).

    `logged` are the run's params already on the server. New bindings are logged under their key;
    identical ones are skipped; a changed one goes under `resumed_at_step_<resumed_at>/<key>`
    (with a counter if that key too holds another value)."""
    new, changed = {}, []
    for binding, text in config.items():
        key, value = mlflow_key(binding), mlflow_value(text)
        if key not in logged:
            new[key] = value
            continue
        if logged[key] == value:
            continue
        changed.append(binding)
        for attempt in range(1, 1000):
            prefix = f"resumed_at_step_{resumed_at}" + (f"_{attempt}" if attempt > 1 else "")
            candidate = mlflow_key(f"{prefix}/{binding}")
            if logged.get(candidate, value) == value:
                if candidate not in logged:
                    new[candidate] = value
                break
    return new, changed


class _MlflowSink:
    """One MLflow run, opened (created or reopened) for this run of train or eval."""

    def __init__(self, spec: MlflowWriter, run: tracking.RunInfo):
        from mlflow import MlflowClient

        self.uri = spec.uri()
        self.client = MlflowClient(tracking_uri=self.uri)
        experiment_id = self._experiment_id(spec.experiment)
        existing = self._reopen(tracking.stored_run_id(run.model_dir, spec.kind), run.say)
        if existing is None:
            created = self.client.create_run(experiment_id, run_name=spec.run_name,
                                             tags={MODEL_DIR_TAG: run.model_dir})
            self.run_id, logged = created.info.run_id, {}
            tracking.store_run_id(run.model_dir, spec.kind, self.run_id)
        else:
            self.run_id, logged = existing.info.run_id, dict(existing.data.params)
            self.client.update_run(self.run_id, status="RUNNING")
        new, changed = params_to_log(run.config, logged, resumed_at=run.initial_step)
        if changed:
            run.say(f"MlflowWriter: {len(changed)} gin value(s) changed since MLflow run {self.run_id} began "
                    f"({', '.join(changed[:5])}{', ...' if len(changed) > 5 else ''}): MLflow keeps a param's "
                    f"first value, so the new ones are logged as resumed_at_step_{run.initial_step}/<binding>.")
        self._log_params(new)
        if run.config_text:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "config.gin")
                with open(path, "w") as f:
                    f.write(run.config_text)
                self.client.log_artifact(self.run_id, path)

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self.client.create_experiment(name)
            except MlflowException:  # created meanwhile by another run
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            raise tracking.TrackingError(
                f"MLflow experiment {name!r} is deleted on {self.uri}: restore it "
                f"(`mlflow experiments restore --experiment-id {experiment.experiment_id}`) or choose another "
                "name with --gin.MlflowWriter.experiment.")
        return experiment.experiment_id

    def _reopen(self, run_id: str | None, say) -> Any:
        """The stored run, or None (none stored, or the server no longer has it: a new run is made)."""
        from mlflow.exceptions import MlflowException

        if run_id is None:
            return None
        try:
            existing = self.client.get_run(run_id)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            existing = None
        if existing is None or existing.info.lifecycle_stage == "deleted":
            say(f"MlflowWriter: MLflow run {run_id} (from MODEL_DIR/tracking/mlflow_run_id) is not on this "
                "server or was deleted: starting a new MLflow run.")
            return None
        return existing

    def _log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[start:start + PARAMS_PER_BATCH])

    def scalars(self, name: str, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(f"{name}/{key}"), float(value), now, step) for key, value in values.items()]
        for start in range(0, len(metrics), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + METRICS_PER_BATCH])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)
