"""The run's mesh on a given device count, and how many ways the logical-axis rules split an axis.

`check_layout` is the one layout check of `estimate` and `launch slurm`: the mesh shape with its
-1 axis resolved, and the batch, mesh and sequence length checked together as `train` checks
them before compiling. The shard counts also size the activation estimate (memory.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

from t5x_lite.estimate import arithmetic as estimate_math
from t5x_lite.parallel import partitioning
from t5x_lite.training import run_spec, run_values


def logical_shards(logical: tuple[str, ...], rules: Any, mesh_shape: Mapping[str, int]) -> tuple[int, ...]:
    """How many ways each logical axis is split on a mesh of `mesh_shape` under `rules`."""
    return estimate_math.spec_shards(partitioning.logical_to_mesh_spec(logical, rules), mesh_shape)


def rules_for_mesh_shape(rules: Any, mesh_shape: Mapping[str, int]) -> Any:
    """The logical-axis rules kept for a mesh with the axes of `mesh_shape` (no devices needed)."""
    return partitioning.rules_for_mesh(rules, SimpleNamespace(axis_names=tuple(mesh_shape)))


def check_layout(settings: run_spec.RunSpec, *, num_devices: int) -> tuple[dict[str, int], int]:
    """(mesh shape, batch shards) of the run on `num_devices`; a RunConfigError when the mesh, the
    batch and the sequence length do not fit together (`train` runs the same check before compiling).
    The values themselves (types, ranges) are checked first, as `train` checks them."""
    run_values.check_values(settings)
    mesh_shape = estimate_math.resolve_mesh_shape(mesh_axes=settings.mesh_axes, num_devices=num_devices)
    rules = rules_for_mesh_shape(settings.logical_axis_rules, mesh_shape)
    batch_shards = logical_shards(("batch",), rules, mesh_shape)[0]
    run_spec.check_layout(settings, batch_shards=batch_shards)
    return mesh_shape, batch_shards
