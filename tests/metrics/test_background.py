"""`BackgroundSink` with deliberately slow writers: the caller never waits, drops are counted and
said, closing is bounded and still ends the tracked run with the run's status."""

from __future__ import annotations

import threading
import time

import pytest

from t5x_lite.metrics import background, wandb_writer


class _SlowSink:
    """A sink whose writes (and, if asked, its close) wait until `gate` opens."""

    def __init__(self, *, block_close: bool = False, fail: bool = False):
        self.gate = threading.Event()
        self.started = threading.Event()  # the first write began
        self.block_close, self.fail = block_close, fail
        self.log: list = []

    def scalars(self, name, step, values):
        self.started.set()
        self.gate.wait()
        if self.fail:
            raise ConnectionError("connection refused\nsecond line")
        self.log.append((name, step, dict(values)))

    def close(self, status):
        if self.block_close:
            self.gate.wait()
        self.log.append(("close", status))


def _timed(function, *args) -> float:
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def test_a_full_queue_drops_without_waiting_and_says_so_once_then_at_close():
    sink, said = _SlowSink(), []
    writer = background.BackgroundSink(sink, name="SlowWriter", say=said.append, queue_size=2)
    writer.scalars("train", 1, {"loss": 1.0})
    assert sink.started.wait(5)  # step 1 is being written (and stuck): steps 2-3 queue, 4-6 are dropped
    took = [_timed(writer.scalars, "train", step, {"loss": float(step)}) for step in range(2, 7)]
    assert max(took) < 0.05
    assert said == ["warning: SlowWriter is behind (2 reports wait to be written): dropped 1 report (train at step 4); "
                    "reports are dropped, not waited for, until it catches up, and the count is said at the end."]
    assert (writer.received, writer.dropped) == (6, 3)
    sink.gate.set()
    writer.close("FINISHED")
    assert sink.log == [("train", 1, {"loss": 1.0}), ("train", 2, {"loss": 2.0}), ("train", 3, {"loss": 3.0}),
                        ("close", "FINISHED")]
    assert said[1:] == ["warning: SlowWriter: 3 of 6 reports were not written: 3 dropped (queue full)."]


@pytest.mark.parametrize("status", ["FINISHED", "FAILED", "KILLED"])
def test_close_is_bounded_with_a_stuck_write_and_still_ends_the_run_with_its_status(status):
    sink, said = _SlowSink(), []
    writer = background.BackgroundSink(sink, name="SlowWriter", say=said.append, drain_s=0.2, close_timeout_s=1.0)
    for step in (1, 2, 3):
        writer.scalars("train", step, {"loss": 1.0})
    assert sink.started.wait(5)
    took = _timed(writer.close, status)
    assert 0.2 <= took < 1.0  # the queue waited for drain_s, then the run was ended beside the stuck write
    assert sink.log == [("close", status)]
    assert said == ["warning: SlowWriter: 3 of 3 reports were not written: 3 still queued or in flight at the end."]
    writer.scalars("train", 4, {"loss": 1.0})  # after close: ignored
    sink.gate.set()


def test_a_close_that_hangs_is_given_up_after_the_timeout_with_one_line():
    sink, said = _SlowSink(block_close=True), []
    writer = background.BackgroundSink(sink, name="SlowWriter", say=said.append, drain_s=0.1, close_timeout_s=0.4)
    took = _timed(writer.close, "KILLED")
    assert 0.4 <= took < 1.5
    assert said == ["warning: SlowWriter could not end its run as KILLED within 0.4 s (its backend is slow or "
                    "unreachable): the tracked run may still show it as running."]
    sink.gate.set()


def test_failed_writes_warn_once_per_streak_are_counted_and_a_close_error_is_raised():
    sink, said = _SlowSink(fail=True), []
    sink.gate.set()

    def close(status):
        raise ConnectionError("server gone")

    sink.close = close
    writer = background.BackgroundSink(sink, name="SlowWriter", say=said.append)
    for step in (1, 2, 3):
        writer.scalars("eval", step, {"loss": 1.0})
    with pytest.raises(ConnectionError, match="server gone"):
        writer.close("FINISHED")
    assert said == ["warning: SlowWriter could not write eval at step 1: connection refused (further failures are "
                    "counted until a write succeeds)",
                    "warning: SlowWriter: 3 of 3 reports were not written: 3 failed."]


class _FakeWandbRun:
    def __init__(self):
        self.calls = []

    def mark_preempting(self):
        self.calls.append("mark_preempting")

    def finish(self, exit_code):
        self.calls.append(("finish", exit_code))


@pytest.mark.parametrize("status, calls", [("FINISHED", [("finish", 0)]), ("FAILED", [("finish", 1)]),
                                           ("KILLED", ["mark_preempting", ("finish", 1)])])
def test_wandb_ends_its_run_with_the_exit_code_of_the_status(status, calls):
    run = _FakeWandbRun()
    wandb_writer._WandbSink(run).close(status)
    assert run.calls == calls
