"""Device meshes and the mapping from logical axis names to mesh axes.

Model code names only logical axes (`batch`, `length`, `embed`, `heads`, `kv_heads`, `kv`,
`mlp`, `vocab`, `layers`, `relpos_buckets`, `positions`). A rule table, bound in
gin/mesh/*.gin, says which mesh axes each one is sharded over; this module turns those names
into `NamedSharding`s.

Mesh axes, outermost first: `replica` (copies across slices or hosts, over DCN), `data`
(data parallel), `fsdp` (data parallel with parameters and optimizer state sharded),
`tensor` (Megatron-style tensor parallel, kept inside a host). Rules are applied in order and
a mesh axis is used at most once per array, so `('batch', ('replica', 'data', 'fsdp'))`
before `('embed', 'fsdp')` shards activations by batch and parameters by embed.
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

from t5x_lite.errors import ConfigValueError

LogicalRules = Sequence[tuple[str, Any]]

MESH_AXIS_NAMES = ("replica", "data", "fsdp", "tensor")



class MeshError(ConfigValueError):
    """Mesh axes that do not fit the devices or processes at hand; the message names the fix."""


# Works for every mesh of the axes above: the mesh's sizes decide what is really split.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("replica", "data", "fsdp")),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("embed", "fsdp"),
    ("length", None),
    ("kv", None),
    ("layers", None),
    ("relpos_buckets", None),
    ("positions", None),
)


def make_mesh(
    *, axes: Mapping[str, int] | Sequence[tuple[str, int]] = (("data", -1), ("fsdp", 1), ("tensor", 1)),
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """Builds a mesh from {axis name: size}; one size may be -1 to take the remaining devices.

    With several hosts (or TPU slices) the outer axes are laid across them and the inner ones
    inside each (`mesh_utils.create_hybrid_device_mesh`), so tensor-parallel groups never
    leave a host.
    """
    items = list(axes.items()) if isinstance(axes, Mapping) else [tuple(a) for a in axes]
    devices = list(devices if devices is not None else jax.devices())
    names = [name for name, _ in items]
    sizes = [size for _, size in items]
    fix = ("set one axis to -1 to take the devices the others leave, e.g. "
           "--gin.MESH_AXES=\"[('data', -1), ('fsdp', 1), ('tensor', 1)]\"")
    if any(not isinstance(s, int) or isinstance(s, bool) or not (s >= 1 or s == -1) for s in sizes):
        raise MeshError(f"Mesh axes {dict(items)}: each size must be a positive integer or -1 (the rest).")
    known = math.prod(s for s in sizes if s != -1)
    if sizes.count(-1) > 1:
        raise MeshError(f"Mesh axes {dict(items)}: at most one axis may have size -1; give the others sizes.")
    if -1 in sizes:
        if len(devices) % known:
            raise MeshError(
                f"Mesh axes {dict(items)} do not divide the {len(devices)} devices of this run: the sizes "
                f"other than -1 multiply to {known}; choose sizes whose product divides {len(devices)}.")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise MeshError(
            f"Mesh axes {dict(zip(names, sizes))} need {math.prod(sizes)} devices but {len(devices)} "
            f"{'is' if len(devices) == 1 else 'are'} available (jax.device_count()); {fix}, or run on "
            f"{math.prod(sizes)} devices.")
    granules, per_slice = _granules(devices)
    if granules > 1:
        dcn = split_over_granules(dict(zip(names, sizes)), granules)
        ici = [size // d for size, d in zip(sizes, dcn)]
        device_array = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=not per_slice)
    else:
        device_array = mesh_utils.create_device_mesh(sizes, devices=devices)
    return Mesh(device_array, tuple(names))


def _granules(devices: Sequence[jax.Device]) -> tuple[int, bool]:
    """(number of fast-interconnect groups, whether they are TPU slices rather than processes)."""
    slices = {getattr(d, "slice_index", None) for d in devices}
    if None not in slices and len(slices) > 1:
        return len(slices), True
    return len({d.process_index for d in devices}), False


def split_over_granules(axes: Mapping[str, int], granules: int) -> list[int]:
    """How many ways each mesh axis crosses hosts (or slices): taken from the outermost axes.

    Inner axes (`tensor`, then `fsdp`) stay inside one host, where the interconnect is fast.
    Fails when the outer axes cannot absorb the host count.
    """
    remaining, dcn = granules, []
    for size in axes.values():
        d = math.gcd(size, remaining)
        dcn.append(d)
        remaining //= d
    if remaining != 1:
        raise MeshError(f"Mesh axes {dict(axes)} cannot be laid over {granules} hosts/slices: the product of "
                         "axes must be a multiple of the host count.")
    spanning = [name for name, d in zip(axes, dcn) if d > 1 and name == "tensor"]
    if spanning:
        raise MeshError(f"Mesh axes {dict(axes)} over {granules} hosts would split the `tensor` axis across "
                         "hosts; make the outer axes (replica, data, fsdp) at least the host count.")
    return dcn


def rules_for_mesh(rules: LogicalRules, mesh: Mesh) -> tuple[tuple[str, Any], ...]:
    """The rules with every mesh axis the mesh lacks removed, so one table serves all meshes."""
    def keep(target):
        if target is None:
            return None
        if isinstance(target, str):
            return target if target in mesh.axis_names else None
        kept = tuple(a for a in target if a in mesh.axis_names)
        return kept or None

    return tuple((logical, keep(target)) for logical, target in rules)


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
    return math.prod(mesh.shape[a] for a in batch_mesh_axes(rules))


def batch_mesh_axes(rules: LogicalRules) -> tuple[str, ...]:
    """The mesh axes that split the batch: FSDP gathers parameters sharded over them."""
    return mesh_axes_of(logical_to_mesh_spec(("batch",), rules)[0])


def mesh_axes_of(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, a name, or a tuple or list of names)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def host_batch_to_global(batch: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """Turns this process's slice of the batch into global arrays sharded over the mesh."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def data_shard_from_rows(process_rows: Mapping[int, tuple[int, int]], process_index: int) -> tuple[int, int]:
    """(this process's data shard, number of data shards) from each process's [start, stop) rows.

    Processes that hold the same rows of the global batch (a mesh whose batch axes do not span
    every process) read the same data, so they form one shard; shards are numbered by row.
    """
    blocks = sorted(set(process_rows.values()))
    sizes = {stop - start for start, stop in blocks}
    if len(sizes) != 1 or any(a[1] > b[0] for a, b in zip(blocks, blocks[1:])):
        raise MeshError(f"Processes hold uneven or overlapping rows of the batch: {dict(process_rows)}; "
                         "choose mesh axes whose batch axes split evenly over the processes.")
    return blocks.index(process_rows[process_index]), len(blocks)


def process_data_shard(sharding: NamedSharding, global_rows: int) -> tuple[int, int, int]:
    """(data shard index, number of data shards, rows per process) of this process for a batch."""
    shards = math.prod(sharding.mesh.shape[a] for a in mesh_axes_of(sharding.spec[0] if len(sharding.spec) else None))
    if not isinstance(global_rows, int) or isinstance(global_rows, bool) or global_rows < 1 or global_rows % shards:
        raise MeshError(f"A batch of {global_rows!r} rows cannot be split over the {shards} batch shards of mesh "
                        f"{dict(sharding.mesh.shape)}; use a positive multiple of {shards} (BATCH_SIZE).")
    rows: dict[int, list[int]] = {}
    for device, index in sharding.devices_indices_map((global_rows, 1)).items():
        start, stop, _ = index[0].indices(global_rows)
        rows.setdefault(device.process_index, []).extend((start, stop))
    process_rows = {p: (min(r), max(r)) for p, r in rows.items()}
    shard, num_shards = data_shard_from_rows(process_rows, jax.process_index())
    return shard, num_shards, global_rows // num_shards
