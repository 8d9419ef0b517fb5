"""Device meshes and the mapping from logical axis names to mesh axes.

Model code names only logical axes (`batch`, `length`, `embed`, `heads`, `kv_heads`, `kv`,
`mlp`, `vocab`, `layers`). A rule table, bound in gin/mesh/*.gin, says which mesh axis each
one is sharded over; this module turns those names into `NamedSharding`s.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import flax
import jax
import numpy as np
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LogicalRules = Sequence[tuple[str, str | None]]

# Data parallel on `data`, tensor parallel (Megatron-style) on `model`.
DEFAULT_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", "data"),
    ("length", None),
    ("embed", None),
    ("vocab", "model"),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("kv", None),
    ("layers", None),
)


def make_mesh(
    *, axes: Mapping[str, int] | Sequence[tuple[str, int]] = (("data", -1), ("model", 1)),
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """Builds a mesh from {axis name: size}; one size may be -1 to take the remaining devices."""
    items = list(axes.items()) if isinstance(axes, Mapping) else [tuple(a) for a in axes]
    devices = list(devices if devices is not None else jax.devices())
    names = [name for name, _ in items]
    sizes = [size for _, size in items]
    known = math.prod(s for s in sizes if s != -1)
    if sizes.count(-1) > 1:
        raise ValueError(f"Mesh axes {dict(items)}: at most one axis may have size -1.")
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(
                f"Mesh axes {dict(items)} do not divide the {len(devices)} devices; "
                "choose sizes whose product divides the device count."
            )
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"Mesh axes {dict(zip(names, sizes))} need {math.prod(sizes)} devices but "
            f"{len(devices)} are available; set one axis to -1 or fix the sizes."
        )
    device_array = mesh_utils.create_device_mesh(sizes, devices=devices)
    return Mesh(device_array, tuple(names))


def logical_to_mesh_spec(logical: Sequence[str | None], rules: LogicalRules) -> PartitionSpec:
    """PartitionSpec for one array whose dimensions carry these logical names."""
    return nn.logical_to_mesh_axes(tuple(logical), rules=tuple(rules))


def params_logical_axes(params_axes: Mapping[str, Any]) -> Any:
    """The logical PartitionSpec tree of a model's params, from its `params_axes` collection."""
    return flax.core.unfreeze(nn_partitioning.get_axis_names(params_axes))


def tree_shardings(logical_specs: Any, mesh: Mesh, rules: LogicalRules) -> Any:
    """Maps a tree of logical PartitionSpecs to NamedShardings on `mesh`."""
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, logical_to_mesh_spec(spec, rules)),
        logical_specs,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def batch_sharding(mesh: Mesh, rules: LogicalRules) -> NamedSharding:
    """Sharding of [batch, length] arrays."""
    return NamedSharding(mesh, logical_to_mesh_spec(("batch", "length"), rules))


def num_batch_shards(mesh: Mesh, rules: LogicalRules) -> int:
    """How many ways the global batch is split (the product of the mesh axes `batch` maps to)."""
    spec = logical_to_mesh_spec(("batch",), rules)[0]
    axes = () if spec is None else (spec if isinstance(spec, tuple) else (spec,))
    return math.prod(mesh.shape[a] for a in axes)


def host_batch_to_global(batch: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """Turns this process's slice of the batch into global arrays sharded over the mesh."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
