"""A user's own hooks through the CLI (in this process): a module written here, imported by a gin
file's `import`, its hook bound in `train.hooks`; and a hook's UserError stopping the run."""

from __future__ import annotations

import json
import math
import re
import textwrap

import pytest

from t5x_lite.checkpoints import checkpoint
from tests import cli_helpers

HOOKS_MODULE = textwrap.dedent('''
    import json

    import gin

    from t5x_lite.errors import UserError
    from t5x_lite.training.hooks import Hook


    @gin.configurable
    class StepLossLog(Hook):
        """Appends the step and the latest reported train loss to a file."""

        def __init__(self, path, every=2):
            super().__init__(every=every)
            self.path = path

        def write(self, **entry):
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\\n")

        def start(self, run):
            self.write(event="start", step=run.start_step, chief=run.is_chief, model_dir=run.model_dir)

        def run(self, info):
            self.write(event="run", step=info.step, loss=info.latest.train.get("loss"))

        def at_end(self, info):
            self.write(event="at_end", step=info.step, saved=info.latest.saved_step, evaluated=info.latest.eval_step)


    @gin.configurable
    class FailsAt(Hook):
        def __init__(self, step, every=1):
            super().__init__(every=every)
            self.step = step

        def run(self, info):
            if info.step == self.step:
                raise UserError(f"my hook refuses step {info.step}")
''')


@pytest.fixture(scope="module")
def hooks_module(tmp_path_factory):
    """The folder of the module `user_step_hooks`, importable as from the user's PYTHONPATH."""
    with cli_helpers.importable_module(tmp_path_factory.mktemp("user_code"), "user_step_hooks", HOOKS_MODULE) as folder:
        yield folder


def train_with(data_dir, model_dir, folder, *lines: str, steps: int):
    gin_file = model_dir.parent / "hooks.gin"
    gin_file.write_text("import user_step_hooks\n\n" + "".join(f"{line}\n" for line in lines))
    return cli_helpers.train_in_process(data_dir, model_dir, f"--gin_file={gin_file}", f"--gin.TRAIN_STEPS={steps}",
                                        "--gin.train.log_period=1", "--gin.train.checkpoint_period=0")


def test_a_users_hook_runs_every_two_steps_and_after_the_last(small_data_dir, tmp_path, hooks_module):
    log = tmp_path / "steps.jsonl"
    result = train_with(small_data_dir, tmp_path / "run", hooks_module, "train.hooks = [@StepLossLog()]",
                        f"StepLossLog.path = '{log}'", steps=5)
    assert result.returncode == 0, result.stderr[-3000:]
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert entries[0] == {"event": "start", "step": 0, "chief": True, "model_dir": str(tmp_path / "run")}
    runs = [e for e in entries if e["event"] == "run"]
    assert [e["step"] for e in runs] == [2, 4, 5]  # every 2 steps, and after the last one
    losses = [e["loss"] for e in runs]
    assert all(isinstance(loss, float) and math.isfinite(loss) for loss in losses), losses
    reported = cli_helpers.losses(result.stdout)  # one report a step (log_period 1): the hook saw the latest
    assert losses == pytest.approx([reported[1], reported[3], reported[4]], rel=1e-3)
    # at_end comes after the built-in hooks' last run: the final evaluation and checkpoint are recorded.
    assert entries[-1] == {"event": "at_end", "step": 5, "saved": 5, "evaluated": 5}
    # The evaluation ran before the checkpoint of the same step, which records its loss with the train loss.
    checkpoints = checkpoint.Checkpointer(str(tmp_path / "run"), read_only=True)
    try:
        saved = checkpoints.metadata(5)["metrics"]
    finally:
        checkpoints.close()
    evaluated = float(re.search(r"step 5: validation loss ([\d.]+)", result.stdout).group(1))
    assert saved["eval/loss"] == pytest.approx(evaluated, abs=1e-4)
    assert saved["train/loss"] == pytest.approx(losses[-1])
    assert "train.hooks = [@StepLossLog()]" in (tmp_path / "run" / "config.gin").read_text()


def test_a_hook_raising_a_user_error_stops_the_run_with_its_message(small_data_dir, tmp_path, hooks_module):
    result = train_with(small_data_dir, tmp_path / "run", hooks_module, "train.hooks = [@FailsAt()]",
                        "FailsAt.step = 2", steps=5)
    assert result.returncode == 2, result.stdout[-3000:]
    assert "error: my hook refuses step 2" in result.stderr
    assert "step 3: loss=" not in result.stdout  # the run stopped at step 2


def test_a_hooks_bad_period_stops_the_run_before_it_starts(small_data_dir, tmp_path, hooks_module):
    result = train_with(small_data_dir, tmp_path / "run", hooks_module, "train.hooks = [@StepLossLog()]",
                        f"StepLossLog.path = '{tmp_path / 'never.jsonl'}'", "StepLossLog.every = '2 weeks'", steps=5)
    assert result.returncode == 2
    assert "StepLossLog.every='2 weeks' is not a period" in result.stderr
    assert not (tmp_path / "never.jsonl").exists() and not (tmp_path / "run").exists()
