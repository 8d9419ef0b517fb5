"""t5x's flag names and run files, the default mesh, and the macro-never-set message (docs/from_t5x.md).

Each name is checked where it lands: the value the train/evaluate/infer call would receive,
read from the resolved gin config without running anything.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from t5x_lite.config import parsing
from t5x_lite.config import resolve as config_resolve
from t5x_lite.data.task_access import DEFAULT_SEQUENCE_LENGTH, DataConfig
from t5x_lite.models import DecoderConfig
from t5x_lite.errors import ConfigValueError
from t5x_lite.estimate.run_from_gin import run_settings
from t5x_lite.parallel import partitioning, placement
from t5x_lite.training import run_spec

TRAIN = ["--gin.MODEL_DIR='/tmp/unused'", "--gin.TRAIN_STEPS=5", "--gin.MIXTURE_OR_TASK_NAME='some_task'"]


def load(files: list[str], flags: list[str], entry: str = "train"):
    gin_files, bindings, paths, rest = parsing.split_gin_flags([f"--gin_file={f}" for f in files] + flags)
    assert not rest
    return config_resolve.load_run(gin_files=gin_files, gin_bindings=bindings, gin_search_paths=paths, entry=entry)


def param(resolved, label: str, name: str):
    """The value the call `label` (e.g. 'train', 'train/DataConfig') receives for `name`."""
    for call, params in resolved.calls:
        if call.label == label:
            return next(p for p in params if p.name == name).value
    raise AssertionError(f"{label} is not called; calls: {[c.label for c, _ in resolved.calls]}")


def train_spec(files, flags):
    return run_settings(load(files, flags))


# ------------------------------------------------------------------ the macro-never-set message


def test_macro_never_set_names_the_macro(tmp_path):
    run = tmp_path / "run.gin"
    run.write_text("include 'runs/quickstart.gin'\ntrain.log_period = %LOG_EVERY_N\n")
    with pytest.raises(parsing.ConfigError) as e:
        load([str(run)], [])
    message = str(e.value)
    assert "%LOG_EVERY_N is used but never set" in message
    assert "--gin.LOG_EVERY_N=VALUE" in message and "{name}" not in message


def test_a_macro_read_only_by_an_overridden_binding_is_not_required(tmp_path):
    run = tmp_path / "run.gin"
    run.write_text("include 'runs/quickstart.gin'\ntrain.log_period = %NEVER_SET\ntrain.log_period = 7\n")
    assert param(load([str(run)], []), "train", "log_period") == 7


# ------------------------------------------------------------------------------- run files


@pytest.mark.parametrize("name", ["pretrain", "finetune", "eval", "infer"])
def test_t5x_run_files_are_found_under_their_t5x_path(name):
    found = Path(parsing.builtin_gin_dir(), "t5x", "configs", "runs", f"{name}.gin")
    assert found.is_file()
    entry = {"pretrain": "train", "finetune": "train", "eval": "evaluate", "infer": "infer"}[name]
    flags = {"train": TRAIN + (["--gin.INITIAL_CHECKPOINT_PATH='/ckpt'"] if name == "finetune" else []),
             "evaluate": ["--gin.CHECKPOINT_PATH='/ckpt'", "--gin.EVAL_OUTPUT_DIR='/out'",
                          "--gin.MIXTURE_OR_TASK_NAME='some_task'"],
             "infer": ["--gin.CHECKPOINT_PATH='/ckpt'", "--gin.INFER_OUTPUT_DIR='/out'",
                       "--gin.MIXTURE_OR_TASK_NAME='some_task'", "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 4}"],
             }[entry]
    models = ["models/t5_tiny.gin"] if entry == "train" else []
    resolved = load(models + [f"t5x/configs/runs/{name}.gin"], flags, entry=entry)
    if entry == "evaluate":
        assert param(resolved, "evaluate", "model_dir") == "/ckpt"
        assert param(resolved, "evaluate", "output_dir") == "/out"
        assert param(resolved, "SeqioEval", "split") == "test"
    elif entry == "infer":
        assert param(resolved, "infer", "model_dir") == "/ckpt"
        assert param(resolved, "infer", "output_dir") == "/out"
        assert param(resolved, "infer", "mixture_or_task_name") == "some_task"
        assert param(resolved, "infer", "task_feature_lengths") == {"inputs": 8, "targets": 4}
    elif name == "finetune":
        assert param(resolved, "InitFrom", "checkpoint") == "/ckpt"


def test_finetune_without_an_initial_checkpoint_names_the_macro():
    with pytest.raises(ConfigValueError, match="INITIAL_CHECKPOINT_PATH"):
        train_spec(["models/decoder_tiny.gin", "runs/finetune.gin"], TRAIN)


# --------------------------------------------------------------------------------- t5x names


def test_random_seed_use_cached_tasks_and_task_module_reach_the_run():
    resolved = load(["models/decoder_tiny.gin", "t5x/configs/runs/pretrain.gin"],
                    TRAIN + ["--gin.RANDOM_SEED=17", "--gin.USE_CACHED_TASKS=True",
                             "--gin.MIXTURE_OR_TASK_MODULE='my_tasks'"])
    assert param(resolved, "train", "seed") == 17
    assert param(resolved, "train/DataConfig", "seed") == 17
    assert param(resolved, "train/DataConfig", "use_cached") is True
    assert param(resolved, "eval/DataConfig", "use_cached") is True
    assert param(resolved, "train", "task_module") == "my_tasks"


def test_a_name_and_its_t5x_alias_set_differently_is_an_error():
    with pytest.raises(parsing.ConfigError, match=r"SEED=3 .* and RANDOM_SEED=4 .*set only one of them"):
        load(["models/decoder_tiny.gin", "runs/pretrain.gin"], TRAIN + ["--gin.SEED=3", "--gin.RANDOM_SEED=4"])
    # The same value twice is no conflict; the project's own name alone still works.
    assert param(load(["models/decoder_tiny.gin", "runs/pretrain.gin"], TRAIN + ["--gin.SEED=3", "--gin.RANDOM_SEED=3"]),
                 "train", "seed") == 3
    assert param(load(["models/decoder_tiny.gin", "runs/pretrain.gin"], TRAIN + ["--gin.SEED=5"]), "train", "seed") == 5
    with pytest.raises(parsing.ConfigError, match="CHECKPOINT_PATH"):
        load(["runs/eval.gin"], ["--gin.MODEL_DIR='/a'", "--gin.CHECKPOINT_PATH='/b'"], entry="evaluate")


def test_task_feature_lengths_set_the_sequence_lengths_of_each_family():
    t5 = train_spec(["models/t5_tiny.gin", "t5x/configs/runs/pretrain.gin"],
                    TRAIN + ["--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}"])
    assert (t5.train_data.inputs_length, t5.train_data.sequence_length) == (64, 16)
    assert t5.train_data.seqio_lengths() == {"inputs": 64, "targets": 16} == t5.eval_data.seqio_lengths()
    lm = train_spec(["models/decoder_tiny.gin", "runs/pretrain.gin"], TRAIN + ["--gin.TASK_FEATURE_LENGTHS={'targets': 128}"])
    assert lm.train_data.seqio_lengths() == {"targets": 128}
    prefix = train_spec(["models/decoder_tiny.gin", "runs/pretrain.gin"],
                        TRAIN + ["--gin.TASK_FEATURE_LENGTHS={'inputs': 96, 'targets': 32}",
                                 "--gin.DataConfig.feature_converter='prefix_lm'"])
    assert prefix.train_data.sequence_length == 128  # t5x's prefix LM row: inputs + targets
    assert prefix.train_data.seqio_lengths() == {"inputs": 96, "targets": 32}
    # Unset, the default length; agreeing lengths given both ways are fine.
    assert train_spec(["models/decoder_tiny.gin", "runs/pretrain.gin"], TRAIN).train_data.sequence_length == \
        DEFAULT_SEQUENCE_LENGTH
    both = train_spec(["models/t5_tiny.gin", "runs/pretrain.gin"],
                      TRAIN + ["--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}", "--gin.INPUTS_LENGTH=64"])
    assert both.train_data.inputs_length == 64


@pytest.mark.parametrize("lengths, extra, message", [
    ({"inputs": 64, "targets": 16}, {"sequence_length": 32}, r"makes SEQUENCE_LENGTH .* 16, but it is set to 32"),
    ({"inputs": 64, "targets": 16}, {"inputs_length": 48}, r"makes INPUTS_LENGTH .* 64, but it is set to 48"),
    ({"inputs": 64}, {}, r"must map 'targets'"),
    ({"targets": 16, "input": 3}, {}, r"must map 'targets'"),
    ({"targets": "16"}, {}, r"positive lengths"),
    ({"targets": 16}, {"feature_converter": "prefix_lm"}, r"needs 'inputs' for the 'prefix_lm'"),
])
def test_task_feature_lengths_that_disagree_or_are_malformed_fail_with_the_fix(lengths, extra, message):
    with pytest.raises(ConfigValueError, match=message):
        DataConfig(mixture_or_task_name="t", task_feature_lengths=lengths, **extra)


def test_task_feature_lengths_with_inputs_for_a_plain_decoder_says_what_to_do():
    config = DataConfig(mixture_or_task_name="t", task_feature_lengths={"inputs": 8, "targets": 16})
    with pytest.raises(ConfigValueError, match="prefix_lm"):
        config.for_model(DecoderConfig())


# ------------------------------------------------------------------------------ default mesh


@pytest.mark.parametrize("mesh_first", [True, False])
def test_a_mesh_file_counts_before_or_after_the_run_file(mesh_first):
    files = ["models/decoder_tiny.gin", "mesh/fsdp.gin", "runs/pretrain.gin"]
    if not mesh_first:
        files = [files[0], files[2], files[1]]
    spec = train_spec(files, TRAIN)
    assert dict(spec.mesh_axes)["fsdp"] == -1 and dict(spec.logical_axis_rules)["embed"] == "fsdp"


def test_without_a_mesh_file_the_mesh_is_chosen_from_the_state_size():
    resolved = load(["models/decoder_tiny.gin", "runs/pretrain.gin"], TRAIN)
    assert resolved.macro("MESH_AXES").binding.source.startswith("default (no mesh file given")
    spec = run_settings(resolved)
    assert spec.mesh_axes == placement.DATA_PARALLEL_AXES and spec.logical_axis_rules == partitioning.DEFAULT_RULES
    # The same run on devices too small for its float32 params and AdamW state (3 x 4 bytes a
    # parameter) is FSDP; on devices with room, data parallel.
    state_bytes = 12 * spec.model.num_params()
    unset = dataclasses.replace(spec, mesh_axes=None)
    small, note = run_spec.with_default_mesh(unset, device_bytes=state_bytes)
    assert small.mesh_axes == placement.FSDP_AXES and note.startswith("FSDP, chosen as no mesh file was given")
    roomy, note = run_spec.with_default_mesh(unset, device_bytes=4 * state_bytes)
    assert roomy.mesh_axes == placement.DATA_PARALLEL_AXES and note.startswith("data parallel")
