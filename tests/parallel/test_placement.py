"""placement.py: the default mesh choice, batch schedules, and each process's rows of a batch
(8 host devices from tests/conftest.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from t5x_lite.models import DecoderConfig
from t5x_lite.parallel import partitioning, placement
from t5x_lite.parallel.placement import DATA_PARALLEL_AXES, FSDP_AXES, Placement, RowResults


def test_data_parallel_while_the_params_fit_in_half_a_device_else_fsdp():
    assert placement.choose_mesh_axes(param_bytes=10, device_bytes=None) == DATA_PARALLEL_AXES  # CPU
    assert placement.choose_mesh_axes(param_bytes=50, device_bytes=100) == DATA_PARALLEL_AXES
    assert placement.choose_mesh_axes(param_bytes=51, device_bytes=100) == FSDP_AXES
    assert placement.choose_mesh_axes(param_bytes=4 * 1.3e9, device_bytes=int(8e9)) == FSDP_AXES


def test_batch_schedule_pads_to_the_batch_shards():
    eight = Placement.build(mesh_axes=FSDP_AXES)
    assert eight.batch_shards == 8 and eight.padded_rows(3) == 8 and eight.padded_rows(9) == 16
    assert placement.batch_schedule(10, 8, eight) == [list(range(8)), [8, 9] + [-1] * 6]
    one = Placement.single_device()
    assert placement.batch_schedule(5, 2, one) == [[0, 1], [2, 3], [4, -1]]


def test_rows_split_over_devices_come_back_in_order():
    eight = Placement.build(mesh_axes=FSDP_AXES)
    values = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    array = eight.put(values)
    assert {shard.data.shape for shard in array.addressable_shards} == {(2, 3)}
    np.testing.assert_array_equal(eight.local_rows(array), values)
    results = RowResults(eight, total=5, width=4, dtype=np.float32, fill=-1)
    results.add([4, -1, 0, 3, -1, 1, 2] + [-1] * 9, eight.put(values[:, :2]))
    gathered = results.gather()
    assert gathered.shape == (5, 4)
    np.testing.assert_array_equal(gathered[:, :2], values[[2, 5, 6, 3, 0], :2])  # by id, padding rows dropped
    np.testing.assert_array_equal(gathered[:, 2:], -1)
    assert eight.rows_computed == 5 and eight.batches_run == 1


def test_placed_params_follow_the_rules():
    cfg = DecoderConfig(vocab_size=64, emb_dim=32, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64,
                        num_layers=2, max_len=32)
    shapes, _ = placement.params_abstract(cfg)
    params = jax.tree.map(lambda s: np.ones(s.shape, s.dtype), shapes)
    fsdp = Placement.build(mesh_axes=FSDP_AXES)
    placed = fsdp.place_params(cfg, params)
    embedding = placed["token_embed"]["embedding"]
    assert embedding.sharding.spec == partitioning.logical_to_mesh_spec(("vocab", "embed"), fsdp.rules)
    assert {s.data.shape for s in embedding.addressable_shards} == {(64, 4)}
    assert placement.of_params(placed).mesh == fsdp.mesh
    assert placement.of_params(params).mesh.size == 1


def test_a_mesh_that_does_not_fit_the_devices_is_a_clear_error():
    with pytest.raises(partitioning.MeshError, match="need 16 devices"):
        Placement.build(mesh_axes=(("data", 16),))
