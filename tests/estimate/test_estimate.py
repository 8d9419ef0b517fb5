"""`t5x-lite estimate`: parameter counts of every model file against the real parameter tree,
arithmetic state bytes against the compiled train step, the time formula, the CLI and its errors."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from t5x_lite.config import resolve as config_resolve
from t5x_lite.errors import ConfigValueError
from t5x_lite.estimate import accelerators, run_from_gin
from t5x_lite.estimate import arithmetic as estimate_math
from t5x_lite.estimate import command as estimate
from t5x_lite.estimate import memory as estimate_memory
from tests.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILES = sorted((ROOT / "gin" / "models").glob("*.gin"))
# A quickstart run small enough to compile in a few seconds.
SMALL_RUN = ["BATCH_SIZE=8", "SEQUENCE_LENGTH=32", "DecoderConfig.num_layers=2", "DecoderConfig.vocab_size=512",
             "DecoderConfig.emb_dim=64", "DecoderConfig.mlp_dim=128", "DecoderConfig.head_dim=16"]


def _param_shapes(model):
    """The real module's parameter tree, as shapes (jax.eval_shape: a 1.3B model is not allocated)."""
    module = model.make_module()
    inputs = {k: jnp.zeros(v.shape, v.dtype) for k, v in model.init_inputs().items()}

    return jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **inputs)["params"])


def test_every_model_file_is_covered():
    assert len(MODEL_FILES) >= 14 and any(p.stem.startswith("t5_") for p in MODEL_FILES)


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_parameter_counts_match_the_real_parameter_tree(path):
    model = run_from_gin.model_from_gin(config_resolve.load_run(gin_files=[str(path)], entry="train"))
    leaves = jax.tree_util.tree_flatten_with_path(_param_shapes(model))[0]
    total = sum(math.prod(leaf.shape) for _, leaf in leaves)
    # Embedding parameters are the lookup tables (flax Embed's `embedding`: tokens, learned positions).
    embedding = sum(math.prod(leaf.shape) for keys, leaf in leaves if getattr(keys[-1], "key", None) == "embedding")
    counts = estimate.parameter_counts(model)
    assert (counts["total"], counts["embedding"]) == (total, embedding)
    assert counts["non_embedding"] == total - embedding


@pytest.mark.parametrize("mesh_file,num_devices", [("mesh/data_parallel.gin", 1), ("mesh/data_parallel.gin", 8),
                                                   ("mesh/fsdp.gin", 8), ("mesh/fsdp_tensor.gin", 8)])
def test_arithmetic_state_bytes_equal_the_compiled_arguments(mesh_file, num_devices):
    """The compiled step's arguments are the train state (params, Adam moments, counters) and the
    batch, per device. Both sides size the same arrays under the same PartitionSpecs, so on CPU
    they agree to the byte; the only allowed difference is the 8-byte dropout key, which jit
    keeps as an argument only when dropout uses it (it is pruned at dropout_rate=0)."""
    settings = run_from_gin.run_settings(config_resolve.load_run(gin_files=["runs/quickstart.gin", mesh_file],
                                                                 gin_bindings=SMALL_RUN))
    mesh_shape = estimate_math.resolve_mesh_shape(mesh_axes=settings.mesh_axes, num_devices=num_devices)
    state = estimate_memory.state_bytes_per_device(settings, mesh_shape)
    compiled = estimate_memory.compiled_memory(settings, num_devices=num_devices)
    arithmetic = state["params"] + state["optimizer_state"] + state["step"]
    assert 0 <= compiled["arguments"] - compiled["batch"] - arithmetic <= 8
    assert state["tree_params"] == settings.model.num_params()
    # AdamW keeps two float32 moments per parameter (plus two int32 step counters).
    assert state["optimizer_state"] == 2 * state["params"] + 8
    if mesh_file == "mesh/fsdp.gin":  # every parameter has an `embed` axis: all of it is split 8 ways
        assert state["params"] == 4 * settings.model.num_params() // 8


LARGE_MODEL_LENGTHS = {"decoder_1_3b": ["SEQUENCE_LENGTH=256"],
                       "t5_xl": ["INPUTS_LENGTH=512", "SEQUENCE_LENGTH=128"]}


@pytest.mark.parametrize("mesh_file", ["mesh/data_parallel.gin", "mesh/fsdp.gin", "mesh/fsdp_tensor.gin"])
@pytest.mark.parametrize("model", ["decoder_1_3b", "t5_xl"])
def test_compiled_large_model_step_memory_is_within_10_percent_of_the_arithmetic(model, mesh_file):
    """The 1.3B decoder's and T5-XL's whole train step per device (XLA's memory analysis on 8 host
    devices, compile only: nothing is allocated) against the arithmetic: state, gradients, gathered
    weights, activations and logits (bench large_models' settings: batch 16, decoder rows of 256,
    T5 inputs of 512 and targets of 128)."""
    settings = run_from_gin.run_settings(config_resolve.load_run(
        gin_files=[f"models/{model}.gin", mesh_file, "runs/pretrain.gin"],
        gin_bindings=["TRAIN_STEPS=1000", "MIXTURE_OR_TASK_NAME=None", "BATCH_SIZE=16", *LARGE_MODEL_LENGTHS[model]],
        entry="train", check_macros=False))
    mesh_shape = estimate_math.resolve_mesh_shape(mesh_axes=settings.mesh_axes, num_devices=8)
    arithmetic = estimate_memory.memory_estimate(settings, mesh_shape, platform="cpu")
    total = estimate_memory.compiled_memory(settings, num_devices=8)["total"]
    assert 0.9 <= total / arithmetic["total"] <= 1.1, (model, mesh_file, total / arithmetic["total"])


def test_pure_arithmetic():
    assert estimate_math.resolve_mesh_shape(mesh_axes=[("data", 1), ("fsdp", -1), ("tensor", 2)], num_devices=16) == {
        "data": 1, "fsdp": 8, "tensor": 2}
    assert estimate_math.resolve_mesh_shape(mesh_axes={"data": 4}, num_devices=4) == {"data": 4}
    assert estimate_math.spec_shards((None, ("data", "fsdp"), "tensor"), {"data": 2, "fsdp": 4, "tensor": 2}) == (1, 8, 2)
    # Uneven shards are padded: 10 over 4 devices is 3 per device.
    assert estimate_math.per_device_elements(shape=(10, 6), shards=(4, 1)) == 18
    assert estimate_math.steps_per_epoch(tokens_per_epoch=4097, batch_size=16, sequence_length=256) == 2
    # lm_task splits documents into pieces of at most L - 1 tokens, each with an EOS.
    assert estimate_math.lm_pieces(corpus_tokens=2550, documents=3, sequence_length=256) == 10
    assert estimate_math.lm_pieces(corpus_tokens=2550, documents=50, sequence_length=256) == 50
    assert estimate_math.planned_steps(train_steps=300, num_epochs=1, steps_per_epoch=100) == 100
    assert estimate_math.planned_steps(train_steps=None, num_epochs=2, steps_per_epoch=None) is None
    assert estimate.parse_count("300B", flag="tokens") == 3e11
    six_n, attention = estimate_math.flops_split(flops_per_token=10.0, flops_per_token_doubled_lengths=14.0)
    assert (six_n, attention) == (6.0, 4.0)
    # Gathering over fsdp keeps the tensor shards: ("fsdp", "tensor") -> "tensor".
    assert estimate_math.without_axes((("fsdp", "tensor"), "fsdp", None), ("fsdp",)) == (("tensor",), None, None)
    # Outside the loops two unscanned arrays whole, the larger twice; inside, one layer's weights + gradient.
    assert estimate_math.gathered_bytes(unscanned=[100.0, 40.0], layer_stacks=[30.0, 10.0]) == 100 + 40 + 100
    assert estimate_math.gathered_bytes(unscanned=[10.0], layer_stacks=[30.0, 10.0]) == 2 * 30
    assert estimate_math.gathered_bytes(unscanned=[], layer_stacks=[]) == 0


@pytest.mark.parametrize("attention", ["xla", "explicit", "cudnn"])
def test_remat_policies_order_the_activation_estimate(attention):
    sizes = dict(dtype_bytes=2, num_layers=24, tokens=8192, width=2048, q=2048, kv=4096, mlp=5632, n_mlp_in=2,
                 scores=16 * 2048, attention=attention)
    device = {p: estimate_math.activation_bytes(policy=p, **sizes)[0] for p in
              ("none", "save_dots", "minimal", "save_qkv_proj", "full", "minimal_offloaded")}
    assert device["full"] < device["save_qkv_proj"] < device["minimal"] < device["save_dots"] < device["none"]
    assert device["minimal_offloaded"] == device["full"]
    assert estimate_math.activation_bytes(policy="minimal_offloaded", **sizes)[1] > 0


def test_attention_implementations_keep_different_scores():
    """Without remat XLA's autodiff keeps four score arrays in the compute dtype, the explicit
    implementation one float32 array, cuDNN's flash kernel none; the rest of the layer is the same."""
    sizes = dict(policy="none", num_layers=4, tokens=1024, width=512, q=512, kv=1024, mlp=1408, n_mlp_in=2)
    scores = 8 * 1024  # 8 heads x 1024 attended positions per token
    for dtype_bytes in (2, 4):
        kept = {a: estimate_math.activation_bytes(attention=a, dtype_bytes=dtype_bytes, scores=scores, **sizes)[0]
                for a in ("xla", "explicit", "cudnn")}
        assert kept["xla"] - kept["cudnn"] == 4 * 4 * 1024 * scores * dtype_bytes
        assert kept["explicit"] - kept["cudnn"] == 4 * 1024 * scores * 4


@pytest.mark.parametrize("model_file,platform,dtype,want", [
    ("models/decoder_tiny.gin", "cpu", "float32", "explicit"),
    ("models/decoder_tiny.gin", "gpu", "bfloat16", "cudnn"),
    ("models/decoder_tiny.gin", "gpu", "float32", "xla"),
    ("models/decoder_tiny.gin", "tpu", "bfloat16", "xla"),
    ("models/t5_tiny.gin", "cpu", "bfloat16", "explicit"),
    ("models/t5_tiny.gin", "gpu", "bfloat16", "xla"),
])
def test_the_estimate_plans_the_attention_the_model_runs_on_the_platform(model_file, platform, dtype, want):
    settings = run_from_gin.run_settings(config_resolve.load_run(
        gin_files=[model_file, "runs/pretrain.gin"],
        gin_bindings=["TRAIN_STEPS=10", "MIXTURE_OR_TASK_NAME=None", "INPUTS_LENGTH=64"],
        entry="train", check_macros=False))
    model = dataclasses.replace(settings.model, dtype=dtype)
    assert model.attention(platform=platform) == want


def test_train_time_formula_by_hand():
    # 1e12 tokens x 6e9 FLOPs per token = 6e21 FLOPs; 8 devices x 1e15 FLOP/s x MFU 0.5 = 4e15 FLOP/s.
    seconds = estimate_math.train_seconds(tokens=1e12, flops_per_token=6e9, peak_flops_per_device=1e15, num_devices=8,
                                     mfu=0.5)
    assert seconds == pytest.approx(1.5e6)


def test_accelerator_table():
    assert set(accelerators.ACCELERATORS) >= {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l4",
                                              "l40s", "v100", "tpu-v3", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"}
    assert accelerators.get("H100 SXM") is accelerators.get("h100") is accelerators.ACCELERATORS["h100-sxm"]
    assert accelerators.peak_flops(accelerators.get("a100_80gb"), "bfloat16") == (312e12, "bf16")
    assert accelerators.peak_flops(accelerators.get("a100-80gb"), "float32") == (156e12, "tf32")
    assert accelerators.peak_flops(accelerators.get("v5p"), "float32") == (459e12, "bf16")
    assert accelerators.peak_flops(accelerators.get("v100"), "bfloat16") == (15.7e12, "fp32")


def test_unknown_accelerator_names_the_known_ones():
    with pytest.raises(ConfigValueError) as e:
        accelerators.get("h1000")
    message = str(e.value)
    assert "Unknown accelerator 'h1000'" in message and "Did you mean 'h100-sxm'?" in message
    assert all(name in message for name in accelerators.ACCELERATORS)


def test_cli_without_the_data_reports_parameters_and_unknown_epochs(tmp_path, capsys):
    missing = tmp_path / "absent"
    assert estimate.main(["--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{missing}'"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"total\s+1,836,160", out) and re.search(r"embedding\s+524,288", out)
    assert re.search(r"tokens per epoch\s+unknown\s+.*has no metadata.json", out)
    assert re.search(r"planned steps\s+300", out)  # TRAIN_STEPS still gives the run's length


def test_cli_json_with_prepared_metadata(tmp_path, capsys):
    """A directory holding only metadata.json is enough: the estimate never opens the shards."""
    data_dir = tmp_path / "prepared"
    data_dir.mkdir()
    (data_dir / "metadata.json").write_text(json.dumps(
        {"splits": {"train": {"num_examples": 160, "num_tokens": 40800}}}))
    args = ["--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data_dir}'", "--gin.TRAIN_STEPS=None",
            "--gin.NUM_EPOCHS=3", "--num_devices=2", "--peak_flops=1e12", "--mfu=0.5", "--json"]
    assert estimate.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["parameters"] == {"total": 1_836_160, "embedding": 524_288, "non_embedding": 1_311_872}
    data = result["data"]
    # 40,800 tokens + one EOS for each of the 160 documents = 40,960 = 10 steps of 16 x 256.
    assert (data["tokens_per_epoch"], data["steps_per_epoch"], data["planned_steps"]) == (40_960, 10, 30)
    assert result["mesh"]["shape"] == {"replica": 1, "data": 2, "fsdp": 1, "tensor": 1}
    model = run_from_gin.model_from_gin(config_resolve.load_run(gin_files=["models/decoder_tiny.gin"], entry="train"))
    per_token = model.train_flops_per_token(targets_length=256)
    assert result["flops"]["per_token"] == pytest.approx(per_token)
    assert result["time"]["tokens"] == 30 * 16 * 256
    assert result["time"]["seconds"] == pytest.approx(30 * 16 * 256 * per_token / (0.5 * 1e12 * 2))
    assert result["memory"]["state_total"] == result["memory"]["train_state"] + result["memory"]["gradients"]
    assert result["memory"]["gathered"] == 0  # data parallel: nothing is gathered


def test_an_indexed_split_gives_the_exact_epoch(data_dir, capsys):
    """Read by index, an epoch is ceil(ceil(stream tokens / length) / batch) steps: what the run prints."""
    from t5x_lite.data import task_access, task_factories
    from t5x_lite.data.indexed import index_plan, indexed_input

    assert estimate.main(["--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data_dir}'", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    task = task_factories.lm_task(name="test_estimate_indexed", data_dir=str(data_dir))
    plan, _ = index_plan.plan(task_access.DataConfig(task, sequence_length=256, batch_size=16))
    assert data["steps_per_epoch"] == indexed_input.IndexedBatchIterator(plan, num_epochs=1,
                                                                         host_batch_size=16).steps_per_epoch
    assert data["tokens_per_epoch"] == plan.tasks[0].records.stream_tokens
    assert estimate.main(["--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data_dir}'"]) == 0
    assert re.search(r"steps per epoch\s+[\d,]+\s+rows of the token stream / batch 16: exact", capsys.readouterr().out)


@pytest.mark.parametrize("args,message", [
    (["--mfu=0"], "--mfu=0 must be in (0, 1]"),
    (["--mfu=1.5"], "--mfu=1.5 must be in (0, 1]"),
    (["--accelerator=h1000"], "Unknown accelerator 'h1000'. Did you mean 'h100-sxm'?"),
    (["--gin_file=mesh/fsdp_tensor.gin", "--num_devices=3"], "--num_devices=3 cannot be used by MESH_AXES"),
    (["--num_devices=8", "--gin.BATCH_SIZE=4"], "batch_size=4 must be a multiple of the 8 batch shards"),
    (["--gin.train.microbatches=3"], "must be a multiple of microbatches x batch shards"),
    (["--num_devices=two"], "--num_devices='two' is not a number"),
    (["--frobnicate"], "Unknown argument '--frobnicate'"),
    (["--compile", "--num_devices=16"], "needs 16 devices, but JAX has 8 cpu device(s)"),
])
def test_bad_input_is_one_error_line_and_exit_2(args, message, capsys):
    assert jax.device_count() == 8  # JAX has started: --compile cannot add devices any more
    with pytest.raises(SystemExit) as e:
        estimate.main(["--gin_file=runs/quickstart.gin", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err, err


def test_cli_compiles_on_the_devices_it_asks_for():
    """A fresh process started with one CPU device compiles on an 8-device FSDP mesh."""
    result = run_cli("estimate", "--gin_file=runs/quickstart.gin", "--gin_file=mesh/fsdp.gin", "--num_devices=8",
                     "--compile", "--json", *(f"--gin.{b}" for b in SMALL_RUN), devices=1)
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert out["mesh"]["shape"]["fsdp"] == 8 and out["compiled"]["device"].startswith("8 x ")
    assert 0 <= out["compiled"]["arguments"] - out["compiled"]["batch"] - out["memory"]["train_state"] <= 8
