"""The collectives of a compiled train step, read from its HLO: the parser on a written program, and
on 8 host devices what each shipped mesh makes XLA insert per scanned layer."""

from __future__ import annotations

import pytest

from t5x_lite.config import resolve as config_resolve
from t5x_lite.estimate import collectives, layout, run_from_gin
from t5x_lite.estimate import memory as estimate_memory
from tests.estimate.test_estimate import SMALL_RUN

HLO = """HloModule jit_step, entry_computation_layout={(f32[4,8]{1,0})->f32[4,8]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%body.3 (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]{1,0}) parameter(0)
  %w = f32[4,8]{1,0} get-tuple-element((s32[], f32[4,8]{1,0}) %p), index=1
  %all-gather.1 = f32[32,8]{1,0} all-gather(f32[4,8]{1,0} %w), channel_id=1, dimensions={0}
  %all-reduce.2 = (f32[4,8]{1,0}, bf16[2]{0}) all-reduce(f32[4,8]{1,0} %w, bf16[2]{0} %w), to_apply=%add
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(s32[] %i, f32[4,8]{1,0} %w)
}

%cond.4 (p: (s32[], f32[4,8])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

ENTRY %main.9 (a: f32[4,8]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %rs = f32[1,8]{1,0} reduce-scatter(f32[4,8]{1,0} %a), dimensions={0}, to_apply=%add
  %loop = (s32[], f32[4,8]{1,0}) while((s32[], f32[4,8]{1,0}) %init), condition=%cond.4, body=%body.3, backend_config={"known_trip_count":{"n":"24"}}
  ROOT %out = f32[4,8]{1,0} get-tuple-element((s32[], f32[4,8]{1,0}) %loop), index=1
}
"""


def test_parser_groups_collectives_by_loop_with_bytes_and_trips():
    groups = collectives.collectives(HLO)
    assert set(groups) == {"outside", "body.3"}
    assert groups["body.3"].trips == 24
    assert dict(groups["body.3"].counts) == {"all-gather": 1, "all-reduce": 1}
    assert groups["body.3"].bytes["all-gather"] == 32 * 8 * 4
    assert groups["body.3"].bytes["all-reduce"] == 4 * 8 * 4 + 2 * 2  # a tuple result: both arrays
    assert dict(groups["outside"].counts) == {"reduce-scatter": 1}


def compiled_groups(mesh_file: str):
    settings = run_from_gin.run_settings(config_resolve.load_run(gin_files=["runs/quickstart.gin", mesh_file],
                                                                 gin_bindings=SMALL_RUN))
    compiled, trainer, _, _ = estimate_memory.compile_train_step(settings, num_devices=8)
    return collectives.collectives(compiled.as_text()), settings.model.num_layers


@pytest.mark.parametrize("mesh_file", ["mesh/fsdp.gin", "mesh/fsdp_tensor.gin"])
def test_the_estimate_gathers_what_the_compiled_step_gathers(mesh_file):
    """The estimate's gathered weights (memory.gathered_arrays) are the bytes XLA all-gathers: the
    unscanned arrays outside the layer loops, one layer's arrays in the forward loop's body."""
    settings = run_from_gin.run_settings(config_resolve.load_run(gin_files=["runs/quickstart.gin", mesh_file],
                                                                 gin_bindings=SMALL_RUN))
    compiled, trainer, _, _ = estimate_memory.compile_train_step(settings, num_devices=8)
    groups = collectives.collectives(compiled.as_text())
    mesh_shape, _ = layout.check_layout(settings, num_devices=8)
    params = trainer.abstract_state(estimate_memory.example_batch(settings.train_data, rows=8)).params
    unscanned, stacks = estimate_memory.gathered_arrays(params, settings, mesh_shape)
    assert list(stacks) == ["layers"] and len(unscanned) >= 2, (unscanned, stacks)
    # Outside the loops XLA may gather a norm's scale vector a second time for the backward pass.
    assert groups["outside"].bytes["all-gather"] == pytest.approx(sum(unscanned), rel=0.01)
    loops = [g for name, g in groups.items() if name != "outside"]
    assert min(g.bytes["all-gather"] for g in loops) == stacks["layers"]


@pytest.mark.parametrize("mesh_file", ["mesh/data_parallel.gin", "mesh/fsdp.gin", "mesh/fsdp_tensor.gin"])
def test_each_shipped_mesh_gets_the_collectives_its_rules_imply(mesh_file):
    """Scanned layers: a forward and a backward loop of num_layers trips. FSDP gathers each of a layer's 9
    weight arrays in both (the backward pass gathers them again rather than keeping every layer's),
    data parallelism gathers nothing and all-reduces the gradients, tensor parallelism adds all-reduces
    of activations inside the layer loops."""
    groups, layers = compiled_groups(mesh_file)
    loops = [g for name, g in groups.items() if name != "outside"]
    assert len(loops) == 2 and all(g.trips == layers for g in loops)
    gathers = [g.counts["all-gather"] for g in loops]
    reduces = sum(g.counts["all-reduce"] + g.counts["reduce-scatter"] for g in groups.values())
    if "data_parallel" in mesh_file:
        assert gathers == [0, 0] and reduces > 0
    else:
        assert gathers == [9, 9] or sorted(gathers) == [9, 9 + 2], gathers
    if "tensor" in mesh_file:
        assert all(g.counts["all-reduce"] >= 2 for g in loops)
