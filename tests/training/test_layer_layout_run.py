"""`scan_unroll='auto'` in a run: resolved once at start-up into the number every later step sees
(the train step, the checkpoint metadata), named on the start-up line; its checkpoint restores."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from t5x_lite.checkpoints import restored_model
from t5x_lite.data.task_access import DataConfig
from t5x_lite.models import DecoderConfig
from t5x_lite.parallel import partitioning, placement
from t5x_lite.training import startup
from t5x_lite.training.run_spec import RunSpec
from tests import cli_helpers

GIB = 2**30


def test_auto_trains_scanned_on_cpu_and_its_checkpoint_restores(small_data_dir, tmp_path):
    model_dir = tmp_path / "auto"
    result = cli_helpers.train_in_process(small_data_dir, model_dir, "--gin.TRAIN_STEPS=2", "--gin.train.log_period=1",
                                          "--gin.train.eval_period=0", "--gin.DecoderConfig.scan_unroll='auto'")
    assert result.returncode == 0, result.stderr
    assert "\nlayers: scanned (cpu backend)\n" in result.stdout
    assert len(cli_helpers.losses(result.stdout)) == 2
    assert "DecoderConfig.scan_unroll = 'auto'" in (model_dir / "config.gin").read_text()  # as given
    # The checkpoint holds the number chosen; readers rebuild the model from it...
    restored = restored_model.restore(str(model_dir))
    assert restored.step == 2 and restored.config.scan_unroll == 1
    # ... and a config given explicitly that still says 'auto' is the same model.
    again = restored_model.restore(str(model_dir), expected=dataclasses.replace(restored.config, scan_unroll="auto"))
    assert again.config.layers_per_iteration == 1
    sampled = cli_helpers.run_cli_in_process("sample", f"--model_dir={model_dir}", "--prompt=import ",
                                             "--max_new_tokens=4")
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("[step 2]\n")


def _spec(**model) -> RunSpec:
    return RunSpec(model=DecoderConfig(num_layers=3, dtype="bfloat16", **model),
                   train_data=DataConfig(mixture_or_task_name="unused", sequence_length=64, batch_size=8))


def _placement(axes) -> placement.Placement:
    return placement.Placement(mesh=partitioning.make_mesh(axes=axes, devices=jax.devices()))


@pytest.mark.parametrize("axes,device_bytes,expected", [
    (placement.DATA_PARALLEL_AXES, 80 * GIB, (3, None)),
    (placement.DATA_PARALLEL_AXES, 2**20, (1, "unrolled would need ~")),
    (placement.FSDP_AXES, 80 * GIB, (1, f"fsdp axis of {jax.device_count()}")),
    (placement.DATA_PARALLEL_AXES, None, (1, "the device's memory is unknown"))])
def test_on_a_gpu_the_choice_follows_the_mesh_and_the_memory(axes, device_bytes, expected):
    """The start-up resolution with a GPU's platform and memory given (the choice is pure; these
    CPU devices stand in for the mesh): no loop where the step fits, the loop under FSDP or
    without room, and the resolved config carries the number."""
    spec = _spec(scan_unroll="auto")
    resolved, words = startup.resolve_layer_layout(spec, _placement(axes), platform="gpu", device_bytes=device_bytes)
    unroll, reason = expected
    assert resolved.model.scan_unroll == unroll
    assert resolved.model == dataclasses.replace(spec.model, scan_unroll=unroll)
    if unroll == 3:
        assert words.startswith("unrolled x3 (fits: ~") and words.endswith(" MiB of 80 GiB)"), words
    elif reason.endswith("~"):
        assert words.startswith(f"scanned ({reason}") and words.endswith(" MiB of 1 MiB)"), words
    else:
        assert words == f"scanned ({reason})"


def test_a_configured_number_or_unscanned_layers_are_kept():
    data_parallel = _placement(placement.DATA_PARALLEL_AXES)
    for unroll, words in ((1, "scanned (as configured)"), (2, "scan_unroll=2 (as configured)")):
        spec = _spec(scan_unroll=unroll)
        assert startup.resolve_layer_layout(spec, data_parallel, platform="gpu", device_bytes=80 * GIB) == (spec, words)
    resolved, words = startup.resolve_layer_layout(_spec(scan_layers=False, scan_unroll="auto"), data_parallel,
                                                   platform="gpu", device_bytes=80 * GIB)
    assert (resolved.model.scan_unroll, words) == (1, "unrolled (scan_layers=False)")
