"""eval's polling of a model directory while a trainer writes it: a step that Orbax committed before
its manifest was written is looked at again at each poll while the trainer lives, and skipped
with one warning after MANIFEST_WAIT_SECONDS (at once without a live trainer), never dropped
silently. Driven through `_watch` with a fake clock, on tiny checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import jax.numpy as jnp
import pytest

from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.checkpoints import lease as lease_lib
from t5x_lite.checkpoints import lookup, manifest
from t5x_lite.checkpoints.retention import RetentionPolicy
from t5x_lite.evaluation import eval_loop


class FakeTime:
    """A clock that only `sleep` moves; `on_sleep(n)` runs at the n-th sleep (1-based)."""

    def __init__(self, on_sleep: Callable[[int], None] = lambda n: None):
        self.now, self.sleeps, self._on_sleep = 0.0, [], on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self._on_sleep(len(self.sleeps))


def _with_manifest_due(tmp_path: Path, steps=(1, 2), due: int = 2) -> tuple[Path, Callable[[], None]]:
    """(model directory with `steps`, a function that writes step `due`'s manifest): step `due` is
    as Orbax committed it, before its trainer wrote the manifest."""
    model_dir = tmp_path / "run"
    checkpointer = checkpoint_lib.Checkpointer(model_dir, retention=RetentionPolicy(keep_every=1))
    for step in steps:
        checkpointer.save(step, state={"w": jnp.full((8, 8), step, jnp.float32)}, iterator_state={}, metadata={})
    checkpointer.close()
    written = model_dir / "checkpoints" / str(due) / manifest.MANIFEST
    aside = tmp_path / f"manifest_of_step_{due}.json"
    written.rename(aside)
    return model_dir, lambda: aside.rename(written)


@pytest.fixture
def manifest_due(tmp_path) -> tuple[Path, Callable[[], None]]:
    """Steps 1 and 2, step 2 without its manifest yet."""
    return _with_manifest_due(tmp_path)


def _evaluated(model_dir: Path, fake: FakeTime, **overrides) -> list[int]:
    """The steps `_watch` yields, each one's results file written as `evaluate` does."""
    out = model_dir / "eval"
    out.mkdir(exist_ok=True)
    args = dict(step=None, every_checkpoint=True, wait_seconds=0.0, poll_seconds=10.0, final_step=None)
    chosen = []
    for step in eval_loop._watch(str(model_dir), str(out), clock=fake.clock, sleep=fake.sleep,
                                 **{**args, **overrides}):
        chosen.append(step)
        (out / f"step_{step}.json").write_text("{}")
    return chosen


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("WARNING")]


@pytest.mark.parametrize("mode, expected", [
    (dict(), [1, 2]),                                              # every_checkpoint, one pass
    (dict(every_checkpoint=False), [2]),                           # the latest: waits rather than take step 1
    (dict(every_checkpoint=False, wait_seconds=60.0, final_step=2), [1, 2]),  # watching a training run
    (dict(every_checkpoint=False, step=2), [2]),                   # the step named
])
def test_a_step_whose_manifest_comes_after_the_first_poll_is_evaluated(manifest_due, capsys, mode, expected):
    model_dir, write_manifest = manifest_due
    assert checkpoint_lib.Checkpointer(model_dir, read_only=True).check(2).manifest_due
    fake = FakeTime(on_sleep=lambda n: write_manifest() if n == 1 else None)
    with lease_lib.Lease.acquire(str(model_dir)):  # the trainer, alive
        assert _evaluated(model_dir, fake, **mode) == expected
    assert fake.sleeps == [eval_loop.MANIFEST_POLL_SECONDS]  # looked at again one poll later, not 10 s
    assert _warnings(capsys.readouterr().out) == []


def test_a_step_that_never_gets_its_manifest_is_skipped_with_one_warning_after_the_wait(manifest_due, capsys,
                                                                                       monkeypatch):
    model_dir, _ = manifest_due
    monkeypatch.setattr(eval_loop, "MANIFEST_POLL_SECONDS", 100.0)
    fake = FakeTime()
    with lease_lib.Lease.acquire(str(model_dir)):
        assert _evaluated(model_dir, fake, poll_seconds=100.0) == [1]
    assert fake.now == eval_loop.MANIFEST_WAIT_SECONDS == 300.0 and fake.sleeps == [100.0] * 3
    warnings = _warnings(capsys.readouterr().out)
    assert len(warnings) == 1, warnings
    assert warnings[0] == ("WARNING: skipping the checkpoint at step 2: incomplete (its trainer is running but "
                           "wrote no manifest.json in 300 s)")


def test_a_named_step_that_never_gets_its_manifest_is_refused_after_the_wait(manifest_due):
    model_dir, _ = manifest_due
    fake = FakeTime()
    with lease_lib.Lease.acquire(str(model_dir)):
        with pytest.raises(lookup.DamagedCheckpointError, match="step 2: incomplete .its trainer is running"):
            _evaluated(model_dir, fake, step=2, manifest_wait_seconds=2.5, poll_seconds=1.0)
    assert fake.sleeps == [1.0] * 3


def test_without_a_live_trainer_a_missing_manifest_is_reported_at_once(manifest_due, capsys):
    """No lease (the run stopped between the commit and the manifest): nothing will write it."""
    model_dir, _ = manifest_due
    fake = FakeTime()
    assert _evaluated(model_dir, fake) == [1]
    assert fake.sleeps == []
    warnings = _warnings(capsys.readouterr().out)
    assert len(warnings) == 1 and warnings[0].startswith("WARNING: skipping the checkpoint at step 2: incomplete")
    assert "committed by Orbax but no manifest.json" in warnings[0]


def test_reaching_the_final_step_names_a_step_still_awaited(tmp_path, capsys):
    model_dir, _ = _with_manifest_due(tmp_path, steps=(1, 2, 3), due=2)
    fake = FakeTime()
    with lease_lib.Lease.acquire(str(model_dir)):
        assert _evaluated(model_dir, fake, wait_seconds=60.0, final_step=3) == [1, 3]
    assert fake.sleeps == []
    assert _warnings(capsys.readouterr().out) == [
        "WARNING: not evaluating the checkpoint at step 2: its manifest was still not written when step 3 "
        "(evaluate.final_step) was evaluated"]
