"""Parallelism: device meshes, logical-axis rules, and the processes of a multi-host run.

Owns:
  partitioning.py  meshes from (axis, size) pairs, logical-axis rule tables -> `NamedSharding`s,
                   host-local batches -> global arrays, which data shard each process reads
  distributed.py   which processes form the run (flags, SLURM, Cloud TPU) and joining them
                   (`jax.distributed.initialize`) before any device is used
  placement.py     where eval and infer put a model's params and batch rows: a mesh with the
                   training rules, rows split over devices and processes, results combined once
  layer_layout.py  `scan_unroll='auto'`: the scanned loop or no loop, from the backend, the mesh
                   and whether the step without the loop fits a device (pure; the train loop calls it)

Public names: `partitioning.make_mesh`, `rules_for_mesh`, `num_batch_shards`, `batch_sharding`,
`tree_shardings`, `host_batch_to_global`, `process_data_shard`, `LogicalRules`, `DEFAULT_RULES`,
`MeshError` (a mesh that does not fit the devices or processes: a UserError);
`distributed.parse_flags`, `setup`, `is_chief`, `FLAGS_HELP`; `placement.Placement`, `RowResults`,
`batch_schedule`, `choose_mesh_axes`, `of_params`; `layer_layout.choose`, `unrolled_step_bytes`.

May import (pyproject.toml's layers contract): models, storage, errors, tf_setup. Not metrics,
its sibling on the same layer.
"""
