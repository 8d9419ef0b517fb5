"""Mixtures: several registered tasks (or mixtures) sampled example by example by rate.

Rates are relative: with [('a', 1.0), ('b', 3.0)] each example comes from 'b' with
probability 3/4, drawn with the data seed (so a seeded mixture is deterministic). All tasks
must share their output features and vocabulary. A task without the split being read is left
out of the mixture for that split (seqio logs a warning).

One epoch of a mixture (Mixture.get_dataset with num_epochs=1, which is how the train loop
reads every epoch) reads each task for one epoch and draws from them until the first draw of
a task that has no examples left, where the mixture ends (seqio's default,
`stop_on_empty_dataset=True`). So the first task to run out, a (usually the one with the
fewest examples per unit of rate), is read completely, and each other task b contributes
only about rate_b / rate_a times a's example count (at most all of its own); b's other
examples are not read in that epoch, and the next epoch (a new seed) draws again from a new
shuffle. With `exhaust_all_tasks=True` an exhausted task is dropped instead and the rest are
drawn from at their renormalised rates, so one epoch reads every example of every task
exactly once and the rates hold only until the first task runs out. Examples are counted
after each task's preprocessing (for example after long documents are split into pieces),
before packing.

A mixture of lm_tasks over indexed directories is read by index instead (t5x_lite/data/
indexed_input.py, docs/data.md): a deterministic schedule keeps the rates exactly per block of
rows, and one epoch is as many rows as the scarcest task fills in one of its own epochs.
"""

from __future__ import annotations

import functools

from t5x_lite.data import task_registry
from t5x_lite.data.indexed import index_plan
from t5x_lite.tf_setup import import_tensorflow

tf = import_tensorflow()

import seqio  # noqa: E402


def register_mixture(name: str, tasks: list[tuple[str, float]], *, exhaust_all_tasks: bool = False) -> seqio.Mixture:
    """Registers mixture `name` of (task name, rate) pairs, replacing an earlier one of that name."""
    task_registry.check_mixture(name, tasks, known=set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())
                                | task_registry.registered_names(),
                                task_names=set(seqio.TaskRegistry.names()) | task_registry.prepared_task_names())
    for task, _ in tasks:  # a prepared task (or mixture) is registered in seqio when a seqio mixture names it
        entry = task_registry.lookup(task)
        if entry is not None:
            task_registry.seqio_task(entry)
    seqio.MixtureRegistry.remove(name)
    sample_fn = functools.partial(tf.data.Dataset.sample_from_datasets, stop_on_empty_dataset=not exhaust_all_tasks)
    mixture = seqio.MixtureRegistry.add(name, [(task, float(rate)) for task, rate in tasks], sample_fn=sample_fn)
    index_plan.register_mixture(name, mixture, tasks, exhaust_all_tasks=exhaust_all_tasks)
    return mixture


def mixture(*, name: str, tasks: list[tuple[str, float]], exhaust_all_tasks: bool = False) -> str:
    """Registers mixture `name` (again on every call, so it holds the current tasks) and returns its name."""
    register_mixture(name, tasks, exhaust_all_tasks=exhaust_all_tasks)
    return name
