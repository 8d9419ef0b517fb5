"""The train loop's extension point: `Hook`, and what a hook is given (`RunContext`, `StepInfo`).

A hook is something done beside stepping. For each hook, in the order of the loop's list, the
loop (loop.py `run_steps`) calls:

  start(run)     once, before the first step, with the run's `RunContext`;
  run(info)      after each step at which the hook's period `every` falls, and after the last
                 step of the run (`info.final`), so that every hook sees the final state;
  at_end(info)   once, when the loop stops at its step or epoch limit (not when the run is
                 preempted or fails).

Reports, evaluations, samples and checkpoints are hooks like any other (builtin_hooks.py); a
user's hooks (`train.hooks`) run after them. What hooks tell each other travels on the
`StepInfo` (`info.latest`), never through fields one hook writes into another. docs/hooks.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax

from t5x_lite.errors import ConfigValueError
from t5x_lite.models import BaseModel
from t5x_lite.training.periods import Period, parse_period
from t5x_lite.training.trainer import Trainer, TrainState


@dataclasses.dataclass
class Latest:
    """What the built-in hooks reported so far, for the hooks after them: one record for the whole
    run, each field written by one built-in hook and read by any later one.

    Attributes:
      train: the latest train report (StepMetrics, every log_period and after the last step): loss,
        perplexity, learning_rate, grad_norm, tokens_per_second, ...; {} before the first.
      train_step: the step of that report.
      eval: the latest validation loss (Evaluation): loss, perplexity, tokens; {} before the first.
      eval_step: the step of that evaluation.
      saved_step: the latest checkpoint saved (Checkpoints; at first, the one resumed from; None: none).
    """

    train: dict[str, float] = dataclasses.field(default_factory=dict)
    train_step: int | None = None
    eval: dict[str, float] = dataclasses.field(default_factory=dict)
    eval_step: int | None = None
    saved_step: int | None = None


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """Where the loop stands after a step: what every hook's `run` and `at_end` are given."""

    step: int  # steps done so far (the step of `state`)
    state: TrainState  # the train state after the step: params, opt_state, step (on the devices)
    # This step's own metrics, on the devices (reading one waits for the step to finish): loss_sum,
    # z_loss_sum, weight_sum, grad_norm, learning_rate, nonfinite_steps.
    metrics: Mapping[str, jax.Array]
    epochs_finished: int  # passes over the train split finished so far
    end_of_epoch: bool  # this step read the last batch of an epoch
    final: bool  # the step or epoch limit is reached: the run ends after this step
    latest: Latest  # what the hooks before this one reported

    def due(self, period: Period) -> bool:
        """Whether `period` falls at this step."""
        return period.due(step=self.step, epochs_finished=self.epochs_finished, end_of_epoch=self.end_of_epoch)


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What a hook's `start` is given about the run, once, before the first step (read only)."""

    model_dir: str  # where the run writes checkpoints, config.gin and logs (absolute, gs:// or s3://)
    model: BaseModel  # the model's config (a DecoderConfig or T5Config)
    trainer: Trainer  # the run's Trainer: eval_step(params, batch), place_batch(batch), its mesh
    print: Callable[[str], None]  # prints a line to the run's log (process 0 only; above the progress bar)
    # scalars(name, step, {key: value}): to the run's metric writers (TensorBoard's MODEL_DIR/tb/<name>/,
    # W&B, MLflow), on process 0 only.
    scalars: Callable[[str, int, Mapping[str, float]], None]
    is_chief: bool  # this is process 0, the one that writes logs and single files
    start_step: int  # the step the loop starts from: 0, or the step of the checkpoint resumed from


class Hook:
    """Something the loop does beside stepping, every `every` steps or epochs; subclass it.

    `every`: 100 or '100 steps' (after steps 100, 200, ...), '1 epoch' or '2 epochs' (after the
    step that ends each epoch, or every second one), or 0 or None: only after the last step. The
    loop also calls `run` after the last step, whatever `every` says. Each method does nothing
    unless a subclass overrides it. A hook that raises `UserError` stops the run with its message.
    """

    every: int | str | None = 1

    def __init__(self, every: int | str | None = 1):
        self.every = every

    def start(self, run: RunContext) -> None:
        """Called once before the first step."""

    def run(self, info: StepInfo) -> None:
        """Called after each step at which `every` falls, and after the last step."""

    def at_end(self, info: StepInfo) -> None:
        """Called once when the loop stops at its step or epoch limit, after every hook's last `run`."""


def check_hooks(hooks: Sequence[Any], *, name: str) -> list[Period]:
    """The period of each hook (its `every`): a ConfigValueError names a value that is not a Hook
    or an `every` that is not a period (`name`: the list's gin name)."""
    if not isinstance(hooks, (list, tuple)) or not all(isinstance(hook, Hook) for hook in hooks):
        raise ConfigValueError(f"{name}={hooks!r}: give a list of hooks, instances of subclasses of "
                               "t5x_lite.training.hooks.Hook, e.g. [@MyHook()] (docs/hooks.md).")
    return [parse_period(hook.every, name=f"{type(hook).__name__}.every") for hook in hooks]
