"""Metric writers chosen in gin: TensorBoard, Weights & Biases (offline) and MLflow (a real server).

The whole-run tests share two short training runs of one MODEL_DIR (to step 4, then resumed to
step 6) that write to all three writers at once; the MLflow server is a subprocess of this test
module, started before the first test so that it boots while the missing-package run goes.
The module's last test kills that server in the middle of a run (a test after it would find no
server: pytest and its xdist workers keep a module's tests in file order).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from t5x_lite.errors import ConfigValueError, MissingExtraError
from t5x_lite.metrics import mlflow_writer, tracking, wandb_writer
from t5x_lite.metrics.writer import MetricsWriter
from t5x_lite.training.preemption import Preempted
from tests.cli_helpers import TINY_MODEL, run_cli, train

WRITERS = "--gin.train.metric_writers=[@TensorBoardWriter(), @WandbWriter(), @MlflowWriter()]"


# ---------------------------------------------------------------- pure parts, in this process

CONFIG_TEXT = """# Macros:
# ====
MODEL_DIR = '/tmp/run'
RULES = \\
    [('batch', 'data'),
     ('vocab', None)]

# Parameters for train:
# ====
train.model_dir = %MODEL_DIR
train.logical_axis_rules = %RULES
train/DataConfig.batch_size = 8
train.model = @DecoderConfig()
"""


def test_flat_config_has_every_binding_with_macros_substituted():
    flat = tracking.flat_config(CONFIG_TEXT)
    assert flat == {"MODEL_DIR": "'/tmp/run'", "RULES": "[('batch', 'data'), ('vocab', None)]",
                    "train.model_dir": "'/tmp/run'", "train.logical_axis_rules": "[('batch', 'data'), ('vocab', None)]",
                    "train/DataConfig.batch_size": "8", "train.model": "@DecoderConfig()"}
    assert [tracking.literal(flat[k]) for k in ("train/DataConfig.batch_size", "MODEL_DIR", "train.model")] == [
        8, "/tmp/run", "@DecoderConfig()"]


def test_mlflow_params_respect_the_limits_and_say_what_was_cut():
    long_value = "x" * 7000
    long_key = "scope/" * 60 + "Config.param"
    new, changed = mlflow_writer.params_to_log({long_key: "1", "a.b": long_value, "bad=key": "2"}, {}, resumed_at=0)
    assert not changed
    (key,) = [k for k in new if k.startswith("scope/")]
    assert len(key) == 250 and key[-9] == "~" and new[key] == "1"
    assert len(new["a.b"]) == 6000 and new["a.b"].endswith("...[cut: 7000 characters]")
    assert new["bad_key"] == "2"


def test_mlflow_params_on_resume_skip_identical_and_keep_changed_ones_apart():
    logged = {"TRAIN_STEPS": "4", "train.seed": "0"}
    config = {"TRAIN_STEPS": "8", "train.seed": "0", "train.log_period": "2"}
    new, changed = mlflow_writer.params_to_log(config, logged, resumed_at=4)
    assert new == {"resumed_at_step_4/TRAIN_STEPS": "8", "train.log_period": "2"} and changed == ["TRAIN_STEPS"]
    # Resumed at the same step again with yet another value: a key of its own, nothing overwritten.
    logged |= new
    new, _ = mlflow_writer.params_to_log({**config, "TRAIN_STEPS": "12"}, logged, resumed_at=4)
    assert new == {"resumed_at_step_4_2/TRAIN_STEPS": "12"}
    # The same values again: nothing to log.
    assert mlflow_writer.params_to_log(config, logged, resumed_at=4)[0] == {}


def test_writer_lists_and_settings_are_checked_up_front(monkeypatch):
    with pytest.raises(ConfigValueError, match=r"must be a list of metric writers, e\.g\. \[@TensorBoardWriter\(\)"):
        tracking.check_writers(tracking.TensorBoardWriter(), name="train.metric_writers")
    with pytest.raises(ConfigValueError, match="names TensorBoardWriter more than once"):
        tracking.check_writers([tracking.TensorBoardWriter()] * 2, name="train.metric_writers")
    with pytest.raises(ConfigValueError, match="WandbWriter.mode='onlin'"):
        wandb_writer.WandbWriter(mode="onlin")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ConfigValueError, match="MlflowWriter needs a tracking server: set --gin.MlflowWriter.tracking_uri"):
        mlflow_writer.MlflowWriter().check()
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` now fails as if not installed
    with pytest.raises(MissingExtraError, match="MlflowWriter needs the 'mlflow' package.*make install-tracking"):
        tracking.check_writers([mlflow_writer.MlflowWriter(tracking_uri="http://x")], name="train.metric_writers")


@dataclasses.dataclass(frozen=True)
class _Recording(tracking.MetricWriter):
    """A remote writer whose sink records what it gets and fails to write `fail_name`."""

    remote = True
    log: list = dataclasses.field(default_factory=list)
    fail_name: str = "eval"

    def open(self, run):
        self.log.append(("open", run.initial_step, run.config))
        return self

    def scalars(self, name, step, values):
        if name == self.fail_name:
            raise ConnectionError("server gone\nsecond line")
        self.log.append((name, step, dict(values)))

    def close(self, status):
        self.log.append(("close", status))


def test_a_remote_writer_that_fails_warns_and_the_run_status_reaches_it(tmp_path, capsys):
    spec = _Recording()
    with MetricsWriter(str(tmp_path), total_steps=4, initial_step=2, progress_bar=False, writers=[spec],
                       config_text="train.seed = 0\n") as writer:
        writer.scalars("train", 4, {"loss": 1.5})
        writer.scalars("eval", 4, {"loss": 2.0})
    assert spec.log == [("open", 2, {"train.seed": "0"}), ("train", 4, {"loss": 1.5}), ("close", "FINISHED")]
    assert capsys.readouterr().out == (
        "warning: _Recording could not write eval at step 4: server gone (further failures are counted until a "
        "write succeeds)\nwarning: _Recording: 1 of 2 reports were not written: 1 failed.\n")
    for error, status in ((ValueError("bug"), "FAILED"), (KeyboardInterrupt(), "KILLED"),
                          (Preempted(4, "received SIGTERM"), "KILLED")):
        spec = _Recording()
        with pytest.raises(type(error)), MetricsWriter(str(tmp_path), total_steps=4, initial_step=0,
                                                       progress_bar=False, writers=[spec], stopped_by=(Preempted,)):
            raise error
        assert spec.log[-1] == ("close", status)
    spec = _Recording()
    MetricsWriter(str(tmp_path), total_steps=4, initial_step=0, writers=[spec], enabled=False).close()
    assert spec.log == []  # not process 0: nothing opened, nothing written


# ---------------------------------------------------------------- whole runs

@dataclasses.dataclass
class _Server:
    url: str
    process: subprocess.Popen
    log: Path

    def wait_until_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"the MLflow server did not answer in {timeout} s: {self.log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a free 127.0.0.1 port (sqlite store, artifacts served by the server), without
    its job workers (seven more processes loading mlflow would slow the training runs); stopped after."""
    root = tmp_path_factory.mktemp("mlflow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = root / "server.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--artifacts-destination", str(root / "artifacts")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,  # its own group: uvicorn goes with it
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job workers: 2 processes, not 9
    try:
        yield _Server(url=f"http://127.0.0.1:{port}", process=process, log=log)
    finally:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
                process.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


def _environment(tmp: Path) -> dict[str, str | None]:
    """W&B silent and kept under `tmp`; no tracking settings inherited from the caller."""
    return {"WANDB_SILENT": "true", "WANDB_DIR": None, "WANDB_MODE": None, "WANDB_API_KEY": None,
            "WANDB_CONFIG_DIR": str(tmp / "wandb_config"), "WANDB_CACHE_DIR": str(tmp / "wandb_cache"),
            "WANDB_DATA_DIR": str(tmp / "wandb_data"), "MLFLOW_TRACKING_URI": None}


def test_a_missing_package_is_one_line_and_exit_2_before_anything_is_written(small_data_dir, tmp_path,
                                                                            mlflow_server):
    # (mlflow_server: started now, so that it boots while this run goes.)
    fake = tmp_path / "fake_site"
    (fake / "wandb").mkdir(parents=True)
    (fake / "wandb" / "__init__.py").write_text("raise ImportError('No module named wandb')\n")
    model_dir = tmp_path / "run"
    result = run_cli("train", "--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{small_data_dir}'",
                     f"--gin.MODEL_DIR='{model_dir}'", *TINY_MODEL, "--gin.TRAIN_STEPS=4", WRITERS,
                     "--gin.MlflowWriter.tracking_uri='http://127.0.0.1:1'", extra_pythonpath=str(fake),
                     extra_env=_environment(tmp_path))
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: WandbWriter needs the 'wandb' package")
    assert "make install-tracking" in result.stderr and "t5x_lite[tracking]" in result.stderr
    assert not model_dir.exists()


@dataclasses.dataclass
class _Runs:
    model_dir: Path
    first_config: str  # MODEL_DIR/config.gin after the first run
    first_wandb_runs: list[str]  # MODEL_DIR/wandb/offline-run-* after the first run
    url: str


@pytest.fixture(scope="module")
def tracked_runs(small_data_dir, tmp_path_factory, mlflow_server):
    """One MODEL_DIR trained to step 4 and resumed to step 6, with all three writers."""
    tmp = tmp_path_factory.mktemp("tracked")
    model_dir = tmp / "run"
    mlflow_server.wait_until_ready()
    flags = ["--gin.train.log_period=2", WRITERS, f"--gin.MlflowWriter.tracking_uri='{mlflow_server.url}'",
             "--gin.MlflowWriter.experiment='tracking_test'"]
    first = train(small_data_dir, model_dir, "--gin.TRAIN_STEPS=4", *flags, extra_env=_environment(tmp))
    assert first.returncode == 0, first.stderr[-3000:]
    first_config = (model_dir / "config.gin").read_text()
    first_wandb_runs = sorted(p.name for p in (model_dir / "wandb").glob("offline-run-*"))
    second = train(small_data_dir, model_dir, "--gin.TRAIN_STEPS=6", *flags, extra_env=_environment(tmp))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resuming from the checkpoint at step 4" in second.stdout
    assert "MlflowWriter: 2 gin value(s) changed" in second.stdout  # TRAIN_STEPS and train.train_steps
    for run in (first, second):  # a healthy backend: every report written, none dropped or failed
        assert "warning:" not in run.stdout, run.stdout
    return _Runs(model_dir=model_dir, first_config=first_config, first_wandb_runs=first_wandb_runs,
                 url=mlflow_server.url)


def _tensorboard(model_dir: Path) -> dict[str, dict[int, float]]:
    """{'train/loss': {step: value}, ...} of the run's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    scalars = {}
    for name in ("train", "eval"):
        events = EventAccumulator(str(model_dir / "tb" / name))
        events.Reload()
        for tag in events.Tags()["tensors"]:
            scalars[f"{name}/{tag}"] = {e.step: float(make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)}
    return scalars


def test_mlflow_run_holds_the_tensorboard_values_the_config_and_is_resumed(tracked_runs):
    from mlflow import MlflowClient

    client = MlflowClient(tracked_runs.url)
    run_id = (tracked_runs.model_dir / "tracking" / "mlflow_run_id").read_text().strip()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "tracking_test"
    assert len(client.search_runs([run.info.experiment_id])) == 1  # the resumed run added to the same one
    tensorboard = _tensorboard(tracked_runs.model_dir)
    assert set(tensorboard) == set(run.data.metrics) and {2, 4, 6} == set(tensorboard["train/loss"])
    for key, by_step in tensorboard.items():
        history = {m.step: m.value for m in client.get_metric_history(run_id, key)}
        assert history.keys() == by_step.keys(), key
        assert all(history[s] == pytest.approx(v, rel=1e-6) for s, v in by_step.items()), key
    # Params: the first run's bindings; the resumed run's changed ones beside them.
    first = tracking.flat_config(tracked_runs.first_config)
    resumed = tracking.flat_config((tracked_runs.model_dir / "config.gin").read_text())
    params = run.data.params
    assert {k: params[k] for k in first} == first
    changed = {k for k in resumed if first.get(k) != resumed[k]}
    assert changed == {"TRAIN_STEPS", "train.train_steps"}
    assert all(params[f"resumed_at_step_4/{k}"] == resumed[k] for k in changed)
    assert len(params) == len(first) + len(changed)
    assert [a.path for a in client.list_artifacts(run_id)] == ["config.gin"]


def _wandb_records(path: Path) -> list:
    """The records of a .wandb file (LevelDB log blocks of protobuf Records after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, pending, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _wandb_history_and_config(run_dir: Path) -> tuple[dict[str, dict[int, float]], dict[str, str]]:
    import json

    history, config = {}, {}
    for record in _wandb_records(next(run_dir.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            for key, value in items.items():
                if not key.startswith("_"):
                    history.setdefault(key, {})[int(items["_step"])] = value
        elif kind == "run":
            config = {u.key: json.loads(u.value_json) for u in record.run.config.update}
    return history, config


def test_wandb_offline_run_holds_the_metrics_and_config_and_keeps_its_id(tracked_runs):
    model_dir = tracked_runs.model_dir
    run_id = (model_dir / "tracking" / "wandb_run_id").read_text().strip()
    (first,) = tracked_runs.first_wandb_runs
    runs = sorted(p.name for p in (model_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and first in runs and all(name.endswith(f"-{run_id}") for name in runs)
    tensorboard = _tensorboard(model_dir)
    first_history, config = _wandb_history_and_config(model_dir / "wandb" / first)
    resumed_history, _ = _wandb_history_and_config(model_dir / "wandb" / next(r for r in runs if r != first))
    for key, by_step in tensorboard.items():
        logged = {**first_history.get(key, {}), **resumed_history.get(key, {})}
        assert logged.keys() == by_step.keys(), key
        assert all(logged[s] == pytest.approx(v, rel=1e-6) for s, v in by_step.items()), key
    assert set(first_history["train/loss"]) == {2, 4} and set(resumed_history["train/loss"]) == {6}
    expected = {k: tracking.literal(v) for k, v in tracking.flat_config(tracked_runs.first_config).items()}
    assert config["train.log_period"] == 2 and config["TRAIN_STEPS"] == 4 and config["MODEL_DIR"] == str(model_dir)
    assert set(expected) <= set(config)


# ---------------------------------------------------------------- a server that dies mid-run (last: it kills it)

def _step_times(lines: list[tuple[float, str]]) -> dict[int, float]:
    """{step: when its `step N: loss=...` line arrived}."""
    import re

    return {int(m.group(1)): at for at, line in lines if (m := re.match(r"step (\d+): loss=", line))}


def test_a_killed_mlflow_server_never_holds_the_loop_and_sigterm_still_exits_75(small_data_dir, tmp_path,
                                                                                 mlflow_server):
    """The module's server is killed (SIGKILL) at step KILL_AT of a run that reports every step:
    the steps after it take as long as before (MLflow's retries of each write, minutes, happen
    on the writer's thread), and SIGTERM still saves and exits 75 in seconds."""
    import statistics
    import threading

    from t5x_lite.metrics import background
    from tests.cli_helpers import start_cli

    kill_at, after = 8, 12
    mlflow_server.wait_until_ready()
    process = start_cli("train", "--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{small_data_dir}'",
                        f"--gin.MODEL_DIR='{tmp_path / 'run'}'", *TINY_MODEL, "--gin.TRAIN_STEPS=100000",
                        "--gin.train.log_period=1", "--gin.train.checkpoint_period=0", "--gin.train.progress_bar=False",
                        "--gin.train.metric_writers=[@MlflowWriter()]",
                        f"--gin.MlflowWriter.tracking_uri='{mlflow_server.url}'")
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in process.stdout),
                              daemon=True)
    reader.start()

    def wait_for_step(step: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while step not in _step_times(list(lines)):
            assert process.poll() is None and time.monotonic() < deadline, "".join(line for _, line in lines)[-3000:]
            time.sleep(0.02)

    try:
        wait_for_step(kill_at, timeout=120)
        os.killpg(mlflow_server.process.pid, signal.SIGKILL)
        mlflow_server.process.wait(timeout=10)
        killed = time.monotonic()
        wait_for_step(kill_at + after, timeout=60)
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        process.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    output = "".join(line for _, line in lines)
    assert process.returncode == 75, output[-3000:]
    times = _step_times(lines)
    before = [times[s] - times[s - 1] for s in range(3, kill_at + 1)]  # steps 1-2 compile
    later = [times[s] - times[s - 1] for s in sorted(times) if s - 1 in times and times[s - 1] >= killed]
    assert len(later) >= after - 2, (killed, times)
    # Before the fix the first write after the kill held its step for 4 s, the next for 8 s, ...
    assert statistics.median(later) <= statistics.median(before) + 0.2, (before, later)
    assert max(later) < max(before) + 1.0, (before, later)
    assert took < background.CLOSE_TIMEOUT_S + 10, output[-3000:]
    assert "Traceback" not in output
    assert f"warning: MlflowWriter could not end its run as KILLED within {background.CLOSE_TIMEOUT_S:g} s" in output
