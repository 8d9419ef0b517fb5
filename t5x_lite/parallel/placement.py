"""Where a trained model's params and its evaluation and inference batches live.

Evaluation and inference place params with the training rule tables (gin/mesh/*.gin) on a
mesh of every device of the run, and split each batch's rows over the mesh's batch axes, so
a model that needed FSDP to train is evaluated and served sharded the same way, and every
process and device computes only its own rows.

The batches are built the same on every process (each reads the whole eval set or prompt
list, which is small next to the model), so every process knows every batch's shape without
talking to the others. Each process keeps the results of its own rows (`RowResults`) and
they are combined once, at the end of a pass, with one all-gather.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
from flax import linen as nn
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5x_lite.parallel import partitioning

# Data parallel while the params take at most this share of one device's memory (the rest holds
# the KV cache and activations); FSDP beyond it.
FITS_FRACTION = 0.5
DATA_PARALLEL_AXES = (("replica", 1), ("data", -1), ("fsdp", 1), ("tensor", 1))
FSDP_AXES = (("replica", 1), ("data", 1), ("fsdp", -1), ("tensor", 1))


def choose_mesh_axes(*, param_bytes: int, device_bytes: int | None) -> tuple[tuple[str, int], ...]:
    """The default mesh: data parallel when the params fit one device comfortably, else FSDP.

    `device_bytes` None (a CPU, whose devices share the host's memory) counts as fitting.
    """
    if device_bytes is None or param_bytes <= FITS_FRACTION * device_bytes:
        return DATA_PARALLEL_AXES
    return FSDP_AXES


def device_memory_bytes(device: jax.Device) -> int | None:
    """The memory one device may allocate, where the platform reports it (GPUs and TPUs)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 (platforms without memory statistics raise various errors)
        return None
    return (stats or {}).get("bytes_limit")


@functools.lru_cache(maxsize=8)
def params_abstract(config: Any) -> tuple[Any, Any]:
    """(params shapes, their logical PartitionSpecs) of a model config, without allocating params
    (traced once per config: restoring and choosing the mesh both need them)."""
    module = config.make_module()
    variables = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **{
        k: np.zeros(v.shape, v.dtype) for k, v in config.init_inputs().items()}))
    return variables["params"], partitioning.params_logical_axes(variables["params_axes"])


@dataclasses.dataclass
class Placement:
    """A mesh and its logical-axis rules, for evaluating and decoding with one model's params.

    `rows_computed` counts the real (not padding) batch rows this process has computed: with
    N processes each computes about 1/N of them.
    """

    mesh: Mesh
    rules: tuple[tuple[str, Any], ...] = partitioning.DEFAULT_RULES
    rows_computed: int = 0
    batches_run: int = 0

    def __post_init__(self):
        self.rules = partitioning.rules_for_mesh(self.rules, self.mesh)
        self.batch_sharding = partitioning.batch_sharding(self.mesh, self.rules)
        self.batch_shards = partitioning.num_batch_shards(self.mesh, self.rules)
        self.spans_processes = len({d.process_index for d in self.mesh.devices.flat}) > 1

    @classmethod
    def build(cls, *, mesh_axes: Sequence[tuple[str, int]] | Mapping[str, int] | None = None,
              rules: partitioning.LogicalRules | None = None, model: Any = None,
              local: bool = False) -> "Placement":
        """A placement over every device of the run (this process's alone with `local`): `mesh_axes`
        (a gin/mesh file's MESH_AXES), or chosen from the model's size (choose_mesh_axes) when None;
        `rules` default to DEFAULT_RULES."""
        if mesh_axes is None:
            shapes, _ = params_abstract(model)
            param_bytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in jax.tree.leaves(shapes))
            mesh_axes = choose_mesh_axes(param_bytes=param_bytes,
                                         device_bytes=device_memory_bytes(jax.local_devices()[0]))
        devices = jax.local_devices() if local else jax.devices()
        return cls(mesh=partitioning.make_mesh(axes=mesh_axes, devices=devices),
                   rules=tuple(rules or partitioning.DEFAULT_RULES))

    @classmethod
    def single_device(cls) -> "Placement":
        """This process's first device alone."""
        return cls(mesh=partitioning.make_mesh(axes=DATA_PARALLEL_AXES, devices=jax.local_devices()[:1]))

    def describe(self) -> str:
        axes = ", ".join(f"{name} {size}" for name, size in self.mesh.shape.items() if size > 1) or "one device"
        return f"mesh {axes} over {self.mesh.size} device{'s' if self.mesh.size > 1 else ''}"

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """The mesh and rules, so the models' logical sharding constraints resolve while tracing."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            yield

    def params_shardings(self, config: Any) -> Any:
        """NamedShardings of a model's params under this placement's rules."""
        _, specs = params_abstract(config)
        return partitioning.tree_shardings(specs, self.mesh, self.rules)

    def place_params(self, config: Any, params: Any) -> Any:
        """Params (host or device arrays of this process) moved to their shardings on the mesh."""
        shardings = self.params_shardings(config)
        return jax.tree.map(lambda x, s: x if getattr(x, "sharding", None) == s else _put(np.asarray(x), s),
                            params, shardings)

    def padded_rows(self, rows: int) -> int:
        """`rows` rounded up to a multiple of the batch shards (every shard gets whole rows)."""
        return max(1, -(-rows // self.batch_shards)) * self.batch_shards

    def process_rows(self, rows: int) -> tuple[int, int]:
        """[start, stop) of the rows of a `rows`-row batch that this process computes."""
        sharding = NamedSharding(self.mesh, PartitionSpec(self.batch_sharding.spec[0]))
        shard, _, per_process = partitioning.process_data_shard(sharding, rows)
        return shard * per_process, (shard + 1) * per_process

    def replicated(self, value: Any) -> jax.Array:
        """A value the same on every process (an RNG key, a scalar) as a global array on every device."""
        return _put(np.asarray(value), NamedSharding(self.mesh, PartitionSpec()))

    def put(self, array: np.ndarray) -> jax.Array:
        """A whole batch (the same on every process) as a global array split by rows over the mesh."""
        spec = PartitionSpec(self.batch_sharding.spec[0], *([None] * (array.ndim - 1)))
        return _put(array, NamedSharding(self.mesh, spec))

    def local_rows(self, array: jax.Array) -> np.ndarray:
        """This process's rows (`process_rows`) of a batch-major array, as numpy."""
        start, stop = self.process_rows(array.shape[0])
        out = None
        for shard in array.addressable_shards:
            first, last, _ = shard.index[0].indices(array.shape[0]) if shard.index else (0, array.shape[0], 1)
            if any(i.indices(n)[:2] != (0, n) for i, n in zip(shard.index[1:], array.shape[1:])):
                raise ValueError(f"An output sharded over more than its rows ({array.sharding}); constrain it to "
                                 "the batch axes.")
            lo, hi = max(first, start), min(last, stop)
            if lo < hi:
                data = np.asarray(shard.data)
                if out is None:
                    out = np.empty((stop - start, *array.shape[1:]), data.dtype)
                out[lo - start:hi - start] = data[lo - first:hi - first]
        assert out is not None, "this process holds none of the batch's rows"
        return out


@functools.cache
def single_device() -> Placement:
    """This process's first device alone."""
    return Placement.single_device()


@functools.lru_cache(maxsize=8)
def _of_mesh(mesh: Mesh) -> Placement:
    return Placement(mesh=mesh)


def of_params(params: Any) -> Placement:
    """Where to run when given no placement: the mesh the params already live on (with the
    default rules), or this process's first device for params on one device or on the host."""
    leaves = jax.tree.leaves(params)
    sharding = getattr(leaves[0], "sharding", None) if leaves else None
    if isinstance(sharding, NamedSharding):
        return _of_mesh(sharding.mesh)
    if sharding is not None and len(sharding.device_set) == 1:
        return _of_mesh(partitioning.make_mesh(axes=DATA_PARALLEL_AXES, devices=list(sharding.device_set)))
    return single_device()


def _put(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


class RowResults:
    """Per-row results of a pass over many batches: each process keeps the rows it computed, and
    `gather` combines every process's rows once, in row order."""

    def __init__(self, placement: Placement, *, total: int, width: int, dtype: Any, fill: Any = 0):
        self.placement, self.total, self.width, self.dtype, self.fill = placement, total, width, dtype, fill
        self.ids: list[int] = []
        self.values: list[np.ndarray] = []

    def add(self, row_ids: Sequence[int], output: jax.Array | np.ndarray, *, count: bool = True) -> None:
        """Keeps this process's rows of one batch's output; row_ids[r] is the result index of batch
        row r, or -1 for a padding row. `count`: add them to the placement's work counters (once
        per batch, when one batch has several outputs)."""
        start, stop = self.placement.process_rows(output.shape[0])
        local = output[start:stop] if isinstance(output, np.ndarray) else self.placement.local_rows(output)
        local = local.reshape(stop - start, -1)
        if count:
            self.placement.rows_computed += sum(1 for i in row_ids[start:stop] if i >= 0)
            self.placement.batches_run += 1
        for r, row_id in enumerate(row_ids[start:stop]):
            if row_id >= 0:
                values = np.full(self.width, self.fill, self.dtype)
                values[:min(self.width, local.shape[1])] = local[r, :self.width]
                self.ids.append(int(row_id))
                self.values.append(values)

    def gather(self) -> np.ndarray:
        """[total, width] results of every process's rows (one all-gather with several processes)."""
        ids = np.asarray(self.ids, np.int64)
        values = np.asarray(self.values, self.dtype).reshape(len(self.ids), self.width)
        if self.placement.spans_processes:
            counts = multihost_utils.process_allgather(np.asarray([len(ids)], np.int64))
            most = int(np.max(counts))
            ids = np.concatenate([ids, np.full(most - len(ids), -1, np.int64)])
            values = np.concatenate([values, np.full((most - len(values), self.width), self.fill, self.dtype)])
            ids = np.asarray(multihost_utils.process_allgather(ids)).reshape(-1)
            values = np.asarray(multihost_utils.process_allgather(values)).reshape(-1, self.width)
        out = np.full((self.total, self.width), self.fill, self.dtype)
        kept = ids >= 0
        out[ids[kept]] = values[kept]
        return out


def batch_schedule(count: int, batch_size: int, placement: Placement) -> list[list[int]]:
    """Item indices of each batch: `batch_size` rows rounded up to the batch shards; the last
    batch's missing rows are -1 (padding)."""
    rows = placement.padded_rows(batch_size)
    batches = []
    for begin in range(0, count, rows):
        chunk = list(range(begin, min(begin + rows, count)))
        batches.append(chunk + [-1] * (rows - len(chunk)))
    return batches
