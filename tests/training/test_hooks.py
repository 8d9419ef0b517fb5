"""The loop's hook protocol on a stand-in trainer and iterator: when `start`, `run` and `at_end`
are called for each period, what `info.latest` carries, a stop request, and bad `train.hooks`."""

from __future__ import annotations

import dataclasses

import pytest

from t5x_lite.errors import ConfigValueError
from t5x_lite.training import loop, profiling
from t5x_lite.training.hooks import Hook, Latest, RunContext, StepInfo
from t5x_lite.training.preemption import Preempted


@dataclasses.dataclass(frozen=True)
class State:
    step: int
    params: None = None


class Trainer:
    """Steps an integer: the step's metrics say which step it was."""

    def place_batch(self, batch):
        return batch

    def train_step(self, state, batch, dropout_rng):
        return State(state.step + 1), {"loss": float(batch), "nonfinite_steps": 0.0}


class Batches:
    """`steps_per_epoch` batches per epoch for `num_epochs` epochs (None: for ever); `epoch` and
    `end_of_epoch` as the real iterators keep them."""

    def __init__(self, steps_per_epoch: int, num_epochs: int | None = None):
        self.steps_per_epoch, self.num_epochs = steps_per_epoch, num_epochs
        self.taken, self.epoch, self.end_of_epoch = 0, 0, False

    def __next__(self):
        if self.epoch == self.num_epochs:
            raise StopIteration
        self.taken += 1
        self.end_of_epoch = self.taken % self.steps_per_epoch == 0
        self.epoch = self.taken // self.steps_per_epoch
        return self.taken


class Watcher:
    def __init__(self, stop_at: int | None = None):
        self.stop_at = stop_at

    def should_stop(self, step):
        return "received SIGTERM" if step == self.stop_at else None


class Recorder(Hook):
    """Records every call it gets."""

    def __init__(self, every):
        super().__init__(every=every)
        self.calls: list[tuple[str, int]] = []

    def start(self, run):
        self.calls.append(("start", run.start_step))

    def run(self, info):
        self.calls.append(("run", info.step))

    def at_end(self, info):
        self.calls.append(("at_end", info.step))


def run_context(start_step: int = 0) -> RunContext:
    return RunContext(model_dir="/tmp/unused", model=None, trainer=None, print=print, scalars=lambda *a: None,
                      is_chief=True, start_step=start_step)


def run(hooks, *, steps=7, start=0, steps_per_epoch=3, num_epochs=None, stop_at=None, saved=None):
    return loop.run_steps(state=State(start), dropout_rng=None, trainer=Trainer(),
                          iterator=Batches(steps_per_epoch, num_epochs), train_steps=steps, num_epochs=num_epochs, hooks=hooks, run=run_context(start),
                          latest=Latest(), save_on_stop=lambda info: saved.append(info.step),
                          profiler=profiling.StepProfiler(None, log_dir="", first_step=start, print_fn=print),
                          watcher=Watcher(stop_at))


@pytest.mark.parametrize("every, runs", [
    (1, [1, 2, 3, 4, 5, 6, 7]),
    (3, [3, 6, 7]),  # and after the last step, which 3 does not divide
    ("2 steps", [2, 4, 6, 7]),
    ("1 epoch", [3, 6, 7]),  # epochs of 3 steps
    ("2 epochs", [6, 7]),
    (0, [7]),  # only after the last step
    (None, [7]),
    (7, [7]),  # the last step is due once, not twice
])
def test_run_is_called_at_each_period_and_after_the_last_step(every, runs):
    hook = Recorder(every)
    info = run([hook], steps=7)
    assert hook.calls == [("start", 0), *(("run", s) for s in runs), ("at_end", 7)]
    assert info.step == 7 and info.final


def test_hooks_run_in_the_order_listed_and_see_what_earlier_ones_wrote():
    seen = []

    class Writes(Hook):
        def run(self, info):
            info.latest.train = {"loss": 10.0 - info.step}
            info.latest.train_step = info.step

    class Reads(Hook):
        def run(self, info):
            seen.append((info.step, info.latest.train_step, info.latest.train["loss"], float(info.metrics["loss"])))

    info = run([Writes(every=1), Reads(every=2)], steps=5)
    assert seen == [(2, 2, 8.0, 2.0), (4, 4, 6.0, 4.0), (5, 5, 5.0, 5.0)]
    assert info.latest.train == {"loss": 5.0}


def test_a_resumed_run_starts_from_its_step_and_counts_periods_from_zero():
    hook = Recorder(every=4)
    run([hook], start=5, steps=10)
    assert hook.calls == [("start", 5), ("run", 8), ("run", 10), ("at_end", 10)]


def test_an_epoch_limit_is_the_last_step():
    hook = Recorder(every=4)
    info = run([hook], steps=None, num_epochs=2, steps_per_epoch=3)
    assert hook.calls == [("start", 0), ("run", 4), ("run", 6), ("at_end", 6)]
    assert info.epochs_finished == 2


def test_a_stop_request_saves_and_raises_without_at_end():
    hook, saved = Recorder(every=2), []
    with pytest.raises(Preempted, match="saved a checkpoint at step 3"):
        run([hook], steps=7, stop_at=3, saved=saved)
    assert saved == [3]
    assert hook.calls == [("start", 0), ("run", 2)]


def test_a_stop_request_at_the_last_step_simply_ends_the_run():
    hook, saved = Recorder(every=2), []
    run([hook], steps=4, stop_at=4, saved=saved)
    assert saved == [] and hook.calls[-1] == ("at_end", 4)


def test_a_subclass_without_its_own_init_runs_every_step():
    class Bare(Hook):
        def __init__(self):  # never calls Hook.__init__: the class default applies
            self.steps = []

        def run(self, info):
            self.steps.append(info.step)

    hook = Bare()
    run([hook], steps=3)
    assert hook.steps == [1, 2, 3]


@pytest.mark.parametrize("hooks, message", [
    ([Recorder(every="2 weeks")], r"Recorder.every='2 weeks' is not a period"),
    ([Recorder(every=-1)], r"Recorder.every=-1 is not a period"),
    ([object()], r"train.hooks=\[<object object .*>\]: give a list of hooks"),
    (Recorder(every=1), r"train.hooks=<.*Recorder .*>: give a list of hooks"),
])
def test_bad_hooks_are_named(hooks, message):
    with pytest.raises(ConfigValueError, match=message):
        run(hooks, steps=2)


def test_step_info_due_follows_the_period():
    from t5x_lite.training.periods import parse_period

    info = StepInfo(step=6, state=State(6), metrics={}, epochs_finished=2, end_of_epoch=True, final=False,
                    latest=Latest())
    assert info.due(parse_period(3, name="x")) and not info.due(parse_period(4, name="x"))
    assert info.due(parse_period("2 epochs", name="x")) and not info.due(parse_period("3 epochs", name="x"))
    assert not dataclasses.replace(info, end_of_epoch=False).due(parse_period("1 epoch", name="x"))
