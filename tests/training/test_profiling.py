"""profiling.py: which steps are traced, and the errors for a bad PROFILE_STEPS. (A whole run's
trace is checked in tests/cli/test_cli_run.py.)"""

from __future__ import annotations

import os

import pytest

from t5x_lite import storage
from t5x_lite.errors import ConfigValueError
from t5x_lite.training import profiling


@pytest.mark.parametrize("steps", [5, (5,), (5, 6, 7), (8, 5), (5, 5), (-1, 3), (1.0, 3), (True, 3), "5,8"])
def test_bad_profile_steps_name_the_fix(steps):
    with pytest.raises(ConfigValueError, match=r"train\.profile_steps=.*e\.g\."):
        profiling.check_profile_steps(steps)


def test_profile_steps_accepts_a_pair():
    assert profiling.check_profile_steps(None) is None
    assert profiling.check_profile_steps([3, 4]) == (3, 4)


def _run(profiler: profiling.StepProfiler, steps: range, traced: list[int], monkeypatch) -> None:
    monkeypatch.setattr(profiling.jax.profiler, "start_trace", lambda log_dir: traced.append("start"))
    monkeypatch.setattr(profiling.jax.profiler, "stop_trace", lambda: traced.append("stop"))
    for step in steps:
        with profiler.step(step, outputs=lambda: None):
            traced.append(step)


def test_trace_covers_exactly_the_chosen_steps(tmp_path, monkeypatch):
    messages, events = [], []
    profiler = profiling.StepProfiler((2, 4), log_dir=str(tmp_path / "p"), first_step=0, print_fn=messages.append)
    _run(profiler, range(6), events, monkeypatch)
    profiler.stop()
    assert events == [0, 1, "start", 2, 3, "stop", 4, 5]
    assert messages == [f"profile: trace of steps 2-3 written to {tmp_path / 'p'} (tensorboard --logdir {tmp_path})"]


def test_a_run_that_ends_inside_the_range_stops_the_trace(tmp_path, monkeypatch):
    messages, events = [], []
    profiler = profiling.StepProfiler((2, 10), log_dir=str(tmp_path / "p"), first_step=0, print_fn=messages.append)
    _run(profiler, range(4), events, monkeypatch)
    profiler.stop()
    assert events == [0, 1, "start", 2, 3, "stop"]
    assert "trace of steps 2-3" in messages[0]


def test_a_run_resumed_past_the_range_says_so_and_traces_nothing(tmp_path, monkeypatch):
    messages, events = [], []
    profiler = profiling.StepProfiler((2, 4), log_dir=str(tmp_path / "p"), first_step=3, print_fn=messages.append)
    _run(profiler, range(3, 6), events, monkeypatch)
    profiler.stop()
    assert events == [3, 4, 5]
    assert messages == ["profile: steps 2-3 not traced: the run resumed at step 3; choose later steps."]


def test_a_trace_for_an_object_store_model_dir_is_copied_there(s3_server, tmp_path, monkeypatch):
    from tests.conftest import S3_BUCKET

    def start_trace(log_dir):  # what jax.profiler writes, in TensorBoard's layout
        os.makedirs(os.path.join(log_dir, "plugins", "profile", "run1"))
        with open(os.path.join(log_dir, "plugins", "profile", "run1", "host.xplane.pb"), "wb") as f:
            f.write(b"trace")
        started.append(log_dir)

    started, messages = [], []
    monkeypatch.setattr(profiling.jax.profiler, "start_trace", start_trace)
    monkeypatch.setattr(profiling.jax.profiler, "stop_trace", lambda: None)
    destination = f"s3://{S3_BUCKET}/run/profile/process_0"
    profiler = profiling.StepProfiler((0, 1), log_dir=destination, first_step=0, print_fn=messages.append)
    with profiler.step(0, outputs=lambda: None):
        pass
    with storage.open(f"{destination}/plugins/profile/run1/host.xplane.pb") as f:
        assert f.read() == b"trace"
    assert not os.path.exists(started[0]), "the local copy is removed"
    assert messages[0].startswith(f"profile: trace of steps 0-0 written to {destination}")
