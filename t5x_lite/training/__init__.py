"""Training: the train loop, read top to bottom, with its hooks beside it, and the jitted steps.

Owns:
  loop.py        `train` (the gin configurable): checks the run, sets it up, then `run_steps`,
                 the loop itself: a step, then each hook that is due; stops at the step or epoch limit
  run_spec.py    `RunSpec`, one description of a run, and the checks of its sizes
                 (`check_layout`, `check_vocabulary`) that train, estimate and launch share;
                 the checkpoint metadata a resumed run is compared with
  run_values.py  `check_values`: the type and range of every value of a run, once, up front
                 (train, estimate, launch); `check_model_dir`: a directory we can write or reach
  startup.py     before the first step: check the model directory, build the data iterator,
                 write config.gin and vocab/, restore the latest good checkpoint or initialise
  hooks.py       the extension point: `Hook` (start, run every `every` steps or epochs, at_end),
                 what hooks are given (`RunContext`, `StepInfo`) and tell each other (`Latest`)
  builtin_hooks.py  the loop's own hooks, in their order: `StepMetrics` (reports, the NaN/Inf
                 check), `EpochLog`, `Evaluation`, `Samples`, `Checkpoints`
  trainer.py     `TrainState`, `LossConfig`, `Trainer`: sharded init, jitted train and eval steps
  optim.py       the optimizers chosen in gin, `AdamW` and `Adafactor` (clipping, weight-decay
                 mask), and the logical PartitionSpecs of their states
  adafactor.py   `optax.adafactor` per layer of each parameter, factored by logical axes (t5x's rules)
  schedules.py   learning-rate schedules: pure functions of the step and their gin classes
                 (`WarmupCosine`, `WarmupLinear`, `RsqrtDecay`, `Constant`, `WarmupStableDecay`)
  periods.py     every N steps or N epochs (`eval_period`, `checkpoint_period`, a hook's `every`)
  validation.py  the validation loss: one streamed pass of the eval split (data/iterators.py builds it)
  reporting.py   what the loop prints: window summaries, epoch stats, the initial-loss check
  preemption.py  SIGTERM or JAX's preemption notice -> save, then `Preempted` (exit 75); before
                 the first step `StartupSignals`: SIGTERM/SIGINT stop at once (75/130), one line
  profiling.py   `train.profile_steps`: a jax.profiler trace of chosen steps

Public names: `loop.train`; `hooks.Hook`, `hooks.StepInfo`, `hooks.RunContext`, `hooks.Latest` (a user's
hooks subclass `Hook`, docs/hooks.md); `optim.AdamW`, `optim.Adafactor`, `optim.SCHEDULES` (schedules.py); `trainer.LossConfig`, `trainer.Trainer`,
`trainer.compiled_memory_bytes`; `run_spec.RunSpec`, `run_spec.check_layout`;
`run_values.check_values`; `preemption.Preempted`, `preemption.StoppedBySignal`,
`preemption.StartupSignals`, `preemption.EXIT_PREEMPTED`, `preemption.EXIT_INTERRUPTED` (train.py).

May import (pyproject.toml's layers contract): evaluation, inference, checkpoints, data,
parallel, metrics, models, storage, errors, tf_setup. Not config: gin binds `train`'s keyword
arguments from above; the loop reads only gin's operative config text, to save it and to give
it to the metric writers.
"""
