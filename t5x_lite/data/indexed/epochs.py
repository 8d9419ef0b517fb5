"""Whether a run's data is read by index, and how long its epoch is then: the rules, pure.

The index reader (data/indexed/index_plan.py, data/indexed/indexed_input.py) and `t5x-lite estimate`
(estimate/epoch.py) both decide with these functions, so the estimate says what the run does.
They describe what is read without seqio: a tree of tasks (`Task`) and mixtures (`Mixture`),
which the reader builds from seqio's registries and the estimate from the gin config's
factory calls. What must be read from files (a split's entry in metadata.json or in an
offline cache) comes through the functions the caller passes.

Read by index: an 'lm' converter, packed rows, and every task under the mixture tree an LM
task (rows are its stored tokens + EOS) whose split has an offset index: its prepared
directory's, or with `use_cached` its offline cache's; no mixture with `exhaust_all_tasks`.
A task's rows are ceil(stream tokens / length) (data/indexed/token_rows.py); a mixture's epoch is as many positions as its
scarcest task (rows per unit of rate, data/indexed/mixing.py's counts) fills in one of its own epochs;
an epoch's steps are ceil(positions / global batch), at least 1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence, Union

from t5x_lite.data.indexed import mixing, token_rows


@dataclasses.dataclass(frozen=True)
class Task:
    """A task as the rules see it."""

    name: str
    lm: bool  # an LM task whose rows are its stored tokens + EOS (lm_task, text_task)
    data_dir: str | None  # its prepared directory; None: raw text, read by index only through its cache


@dataclasses.dataclass(frozen=True)
class Mixture:
    """A mixture of tasks (or mixtures) by rate."""

    name: str
    parts: tuple[tuple[Union[Task, "Mixture"], float], ...]
    exhaust_all_tasks: bool = False


Node = Union[Task, Mixture]


class NotIndexable(Exception):
    """Why the data is read by streaming (the message is the reason)."""


@dataclasses.dataclass(frozen=True)
class IndexSource:
    """One task read by index: the directory holding its split's records and index, the split's
    entry (metadata.json's, or the offline cache's), and its share of a mixture's rows."""

    task: str
    directory: str
    entry: Mapping
    rate: float

    @property
    def stream_tokens(self) -> int:
        """The split's token stream: every record's tokens + EOS."""
        return int(self.entry["index"]["stream_tokens"])


def index_sources(root: Callable[[], Node], *, split: str, reader: str, converter: str, pack: bool,
                  use_cached: bool, cache_dir_of: Callable[[Task], str | None],
                  entry_of: Callable[[str, bool], Mapping | None]) -> list[IndexSource]:
    """What the index reader reads of `split`, or NotIndexable saying why it is streamed.

    `root()` is the task or mixture tree read (built only once the settings allow reading by
    index); `cache_dir_of(task)` is a task's offline cache directory (None: not cached);
    `entry_of(directory, cached)` the split's entry there (None: no such split, or, in a cache,
    no index of it). The checks run in this order, the first failing one giving the reason.
    DataConfig.reader='index' makes that reason an error (index_plan.plan).
    """
    if reader == "stream":
        raise NotIndexable("DataConfig.reader='stream'")
    if converter != "lm":
        raise NotIndexable(f"feature converter {converter!r} (the index path makes 'lm' rows)")
    if not pack:
        raise NotIndexable("pack=False (the index path packs rows)")
    sources = []
    for task, rate in leaves(root()):
        directory = _directory(task, use_cached=use_cached, cache_dir_of=cache_dir_of)
        entry = entry_of(directory, use_cached)
        _check_entry(task, directory, entry, split=split, use_cached=use_cached)
        sources.append(IndexSource(task=task.name, directory=directory, entry=entry, rate=rate))
    return sources


def leaves(node: Node, rate: float = 1.0) -> list[tuple[Task, float]]:
    """Each task under `node` with its share of the rows (a mixture's rates normalised and multiplied
    down the tree), or NotIndexable for a task that is not an LM task or a mixture that exhausts all."""
    if isinstance(node, Mixture):
        if node.exhaust_all_tasks:
            raise NotIndexable(f"mixture {node.name!r} has exhaust_all_tasks=True")
        total = sum(r for _, r in node.parts)
        return [leaf for part, r in node.parts for leaf in leaves(part, rate * r / total)]
    if not node.lm:
        raise NotIndexable(f"task {node.name!r} is not an lm_task over a prepared directory (its examples are "
                           "made while reading)")
    return [(node, rate)]


def _directory(task: Task, *, use_cached: bool, cache_dir_of: Callable[[Task], str | None]) -> str:
    if use_cached:
        cache_dir = cache_dir_of(task)
        if not cache_dir:
            raise NotIndexable(f"task {task.name!r} has no offline cache")
        return cache_dir
    if task.data_dir is None:
        raise NotIndexable(f"task {task.name!r} tokenizes raw text while reading (cache it with `t5x-lite cache` "
                           "and read the cache, use_cached=True, to read it by index)")
    return task.data_dir


def _check_entry(task: Task, directory: str, entry: Mapping | None, *, split: str, use_cached: bool) -> None:
    if use_cached and (entry is None or "index" not in entry):
        raise NotIndexable(f"the offline cache of {task.name!r} in {directory!r} has no index for split {split!r} "
                           "(build the cache again with `t5x-lite cache ... --overwrite`)")
    if entry is None:
        raise NotIndexable(f"{directory!r} has no split {split!r}")
    if "index" not in entry:
        raise NotIndexable(f"{directory!r} has no index for split {split!r} (write one with "
                           f"`t5x-lite index {directory}`)")


# ---------------------------------------------------------------------------------- lengths


def positions_per_epoch(rows: Sequence[int], rates: Sequence[float]) -> int:
    """Positions (rows) of one epoch: one task's rows; a mixture's, as many as its scarcest task
    fills in one of its own epochs at the schedule's counts (mixing.apportion of the rates)."""
    if len(rows) == 1:
        return int(rows[0])
    counts = mixing.apportion(rates)
    block = int(counts.sum())
    return min(int(r) * block // int(c) for r, c in zip(rows, counts))


def steps_per_epoch(positions: int, global_batch: int) -> int:
    """Steps of one epoch: every position once, the last step's remainder empty rows; at least 1."""
    return max(1, math.ceil(positions / global_batch))


@dataclasses.dataclass(frozen=True)
class Epoch:
    """One epoch read by index: rows per task, positions (rows over all tasks) and steps."""

    rows: tuple[int, ...]
    positions: int
    steps: int


def indexed_epoch(stream_tokens: Sequence[int], rates: Sequence[float], *, length: int, global_batch: int) -> Epoch:
    """The epoch of tasks with these token streams and rates, in rows of `length`, `global_batch` rows a step."""
    rows = tuple(token_rows.num_rows(tokens, length) for tokens in stream_tokens)
    positions = positions_per_epoch(rows, rates)
    return Epoch(rows=rows, positions=positions, steps=steps_per_epoch(positions, global_batch))
