"""parallel/layer_layout.py: the layer layout `scan_unroll='auto'` chooses, by backend, mesh and memory,
and the unrolled step's bytes, which must be the estimate's own total for that step."""

from __future__ import annotations

import dataclasses

import pytest

from t5x_lite.config import resolve as config_resolve
from t5x_lite.data.task_access import DataConfig
from t5x_lite.estimate import memory as estimate_memory
from t5x_lite.estimate import run_from_gin
from t5x_lite.models import DecoderConfig, T5Config
from t5x_lite.parallel import layer_layout
from t5x_lite.training import run_spec

GIB = 2**30
H200 = 141 * GIB


def _choose(platform="gpu", mesh=None, layers=24, device=H200, needed=31 * GIB):
    return layer_layout.choose(platform=platform, mesh_shape=mesh or {"replica": 1, "data": 1, "fsdp": 1, "tensor": 1},
                               num_layers=layers, device_bytes=device, unrolled_bytes=lambda: needed)


def _never_called():
    raise AssertionError("the estimate was computed although the backend or mesh decided")


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_outside_gpus_the_loop_without_estimating(platform):
    chosen = layer_layout.choose(platform=platform, mesh_shape={"data": 1}, num_layers=24, device_bytes=H200,
                                 unrolled_bytes=_never_called)
    assert chosen == layer_layout.LayerLayout(1, f"{platform} backend")
    assert chosen.describe() == f"scanned ({platform} backend)"


def test_on_a_gpu_that_holds_it_no_loop():
    chosen = _choose()
    assert chosen.scan_unroll == 24
    assert chosen.describe() == "unrolled x24 (fits: ~31 GiB of 141 GiB)"
    # Batch-only axes leave every device the whole parameters: the same choice.
    assert _choose(mesh={"replica": 2, "data": 4, "fsdp": 1, "tensor": 1}).scan_unroll == 24


@pytest.mark.parametrize("mesh,named", [({"data": 1, "fsdp": 8, "tensor": 1}, "fsdp axis of 8"),
                                        ({"data": 4, "fsdp": 1, "tensor": 2}, "tensor axis of 2"),
                                        ({"data": 1, "fsdp": 2, "tensor": 4}, "fsdp axis of 2, tensor axis of 4")])
def test_a_mesh_that_shards_the_parameters_keeps_the_loop(mesh, named):
    chosen = layer_layout.choose(platform="gpu", mesh_shape=mesh, num_layers=24, device_bytes=H200,
                                 unrolled_bytes=_never_called)
    assert chosen == layer_layout.LayerLayout(1, named)


def test_the_margin_decides_near_the_limit():
    device = 100 * GIB
    below = _choose(device=device, needed=(layer_layout.FITS_FRACTION - 0.01) * device)
    above = _choose(device=device, needed=(layer_layout.FITS_FRACTION + 0.01) * device)
    assert below.scan_unroll == 24
    assert above.scan_unroll == 1
    assert above.describe() == "scanned (unrolled would need ~71 GiB of 100 GiB)"
    assert _choose(needed=1.2 * H200).scan_unroll == 1


def test_unknown_memory_depth_or_one_layer():
    assert _choose(device=None) == layer_layout.LayerLayout(1, "the device's memory is unknown")
    assert _choose(layers=None).scan_unroll == 1  # a family without the activation arithmetic
    assert _choose(layers=1).scan_unroll == 1
    assert _choose(layers=2, needed=0.5 * GIB).describe() == "unrolled x2 (fits: ~512 MiB of 141 GiB)"


def test_num_layers_is_the_deepest_stack():
    assert layer_layout.num_layers(DecoderConfig(num_layers=5)) == 5
    assert layer_layout.num_layers(T5Config(num_encoder_layers=3, num_decoder_layers=6)) == 6


SMALL = ["BATCH_SIZE=8", "SEQUENCE_LENGTH=32", "DecoderConfig.num_layers=3", "DecoderConfig.vocab_size=512",
         "DecoderConfig.emb_dim=64", "DecoderConfig.mlp_dim=128", "DecoderConfig.head_dim=16",
         "DecoderConfig.dtype='bfloat16'", "DecoderConfig.remat_policy='minimal'", "DecoderConfig.scan_unroll='auto'"]
SMALL_T5 = ["BATCH_SIZE=4", "T5Config.num_encoder_layers=2", "T5Config.num_decoder_layers=3", "T5Config.emb_dim=64",
            "T5Config.mlp_dim=128", "T5Config.head_dim=16", "T5Config.scan_unroll='auto'"]


@pytest.mark.parametrize("run,bindings,microbatches", [("runs/quickstart.gin", SMALL, 1),
                                                       ("runs/quickstart.gin", SMALL, 2),
                                                       ("runs/t5_quickstart.gin", SMALL_T5, 1)])
def test_unrolled_step_bytes_are_the_estimates_total_without_remat(run, bindings, microbatches):
    """On a data-parallel mesh of 2 devices on a GPU: the train state, gradients, every layer's
    activations as with remat 'none' and the logits, to the byte what `t5x-lite estimate` adds up
    for that step (its state also counts the step counter's 4 bytes)."""
    settings = run_from_gin.run_settings(config_resolve.load_run(
        gin_files=[run], gin_bindings=[*bindings, f"train.microbatches={microbatches}"]))
    data = settings.train_data
    params, state = run_spec.train_state_bytes(settings)
    needed = layer_layout.unrolled_step_bytes(
        settings.model, rows=data.batch_size // 2 // microbatches, length=data.sequence_length,
        inputs_length=data.inputs_length, state_bytes=state, gradient_bytes=params * min(microbatches, 2),
        platform="gpu")
    layers = layer_layout.num_layers(settings.model)
    unrolled = dataclasses.replace(settings, model=dataclasses.replace(settings.model, remat_policy="none",
                                                                       scan_unroll=layers))
    total = estimate_memory.memory_estimate(unrolled, {"replica": 1, "data": 2, "fsdp": 1, "tensor": 1},
                                            platform="gpu")["total"]
    assert 0 <= total - needed <= 8, (total, needed)


@pytest.mark.parametrize("name,device_gib,unrolled", [("gpt2_350m", 141, True), ("gpt2_350m", 16, False),
                                                      ("mistral_7b", 141, False)])
def test_shipped_sizes_on_one_device(name, device_gib, unrolled):
    """gin/models files at batch 8 x 1024 on one GPU of `device_gib`: the 350M model (about 16 GiB
    without the loop, by the arithmetic) runs unrolled on an H200's memory, not in 16 GiB; Mistral
    7B's float32 state and Adam moments alone (108 GiB) keep the loop."""
    model = run_from_gin.model_from_gin(config_resolve.load_run(gin_files=[f"models/{name}.gin"], entry="train"))
    assert model.scan_unroll == "auto"
    spec = run_spec.RunSpec(model=model, train_data=DataConfig(mixture_or_task_name="unused", sequence_length=1024,
                                                                batch_size=8))
    params, state = run_spec.train_state_bytes(spec)
    chosen = layer_layout.choose(
        platform="gpu", mesh_shape={"data": 1}, num_layers=layer_layout.num_layers(model),
        device_bytes=device_gib * GIB,
        unrolled_bytes=lambda: layer_layout.unrolled_step_bytes(model, rows=8, length=1024, inputs_length=None,
                                                                state_bytes=state, gradient_bytes=params,
                                                                platform="gpu"))
    assert chosen.scan_unroll == (model.num_layers if unrolled else 1), chosen
