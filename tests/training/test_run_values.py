"""training/run_values.py and the other up-front checks of bad values, as pure functions: each bad
value one UserError naming it (the CLI's one `error:` line and exit 2: tests/cli/test_bad_input.py)."""

from __future__ import annotations

import dataclasses

import pytest

from t5x_lite.data.task_access import DataConfig
from t5x_lite.errors import RunConfigError, UserError
from t5x_lite.models.decoder_only import DecoderConfig
from t5x_lite.models.encoder_decoder import T5Config
from t5x_lite.parallel import partitioning
from t5x_lite.training import run_values
from t5x_lite.training.optim import AdamW, WarmupCosine
from t5x_lite.training.run_spec import RunSpec
from t5x_lite.training.trainer import LossConfig
from tests.cli_helpers import unwritable_directory

MODEL = DecoderConfig(vocab_size=512, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_layers=2, max_len=64)
TRAIN = DataConfig("t", sequence_length=64, batch_size=8)
EVAL = DataConfig("t", split="validation", sequence_length=64, batch_size=8)


def spec(**overrides) -> RunSpec:
    values = dict(model=MODEL, train_data=TRAIN, eval_data=EVAL, train_steps=10, model_dir="/tmp/run")
    return RunSpec(**{**values, **overrides})


def refused(run: RunSpec, **settings) -> str:
    with pytest.raises(RunConfigError) as e:
        run_values.check_values(run, **settings)
    assert isinstance(e.value, UserError)
    assert "\n" not in str(e.value)  # one line
    return str(e.value)


def test_a_good_run_passes():
    run_values.check_values(spec(), eval_period="1 epoch", checkpoint_period=500, eval_batches=None, log_period=10,
                            seed=0, init_loss_tolerance=1.0, sample_prompt=["def "], sample_max_new_tokens=64,
                            async_checkpoints=True, progress_bar=None, task_module=None)
    run_values.check_values(spec(train_steps=None, num_epochs=2, eval_data=None, peak_flops_per_device=2e11,
                                 optimizer=AdamW(clip_grad_norm=None, learning_rate=WarmupCosine(peak_learning_rate=1e12)),
                                 mesh_axes={"data": -1, "tensor": 2}))


@pytest.mark.parametrize("overrides, message", [
    # The cases a user reported: steps, lengths and batches positive integers, types checked.
    (dict(train_steps=-5), "TRAIN_STEPS=-5 must be a positive integer or None"),
    (dict(train_steps=0), "TRAIN_STEPS=0 must be a positive integer"),
    (dict(train_steps="ten"), "TRAIN_STEPS='ten' must be a positive integer or None (a number, without quotes)"),
    (dict(train_steps=1e3), "TRAIN_STEPS=1000.0 must be a positive integer or None (write 1000"),
    (dict(train_steps=True), "TRAIN_STEPS=True must be a positive integer or None (not True/False)"),
    (dict(num_epochs=0), "train.num_epochs (NUM_EPOCHS)=0 must be a positive integer"),
    (dict(train_data=dataclasses.replace(TRAIN, sequence_length=0)),
     "train/DataConfig.sequence_length (SEQUENCE_LENGTH)=0 must be a positive integer"),
    (dict(train_data=dataclasses.replace(TRAIN, batch_size=0)), "train/DataConfig.batch_size (BATCH_SIZE)=0"),
    (dict(eval_data=dataclasses.replace(EVAL, batch_size=-8)), "eval/DataConfig.batch_size (BATCH_SIZE)=-8"),
    (dict(train_data=dataclasses.replace(TRAIN, batch_size=8.0)),
     "(BATCH_SIZE)=8.0 must be a positive integer (write 8"),
    (dict(model=T5Config(vocab_size=512, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64),
          train_data=DataConfig("t", sequence_length=64, inputs_length=-1, batch_size=8), eval_data=None),
     "train/DataConfig.inputs_length (INPUTS_LENGTH)=-1 must be a positive integer or None"),
    (dict(train_data=dataclasses.replace(TRAIN, seed=-1)),
     "train/DataConfig.seed (SEED)=-1 must be an integer >= 0"),
    (dict(train_data=dataclasses.replace(TRAIN, shuffle="yes")),
     "train/DataConfig.shuffle='yes' must be True or False"),
    # Learning rate, warmup, microbatches and the rest of the optimizer and loss.
    (dict(optimizer=AdamW(learning_rate=WarmupCosine(peak_learning_rate=-1.0))),
     "WarmupCosine.peak_learning_rate=-1.0 must be a number > 0"),
    (dict(optimizer=AdamW(learning_rate=WarmupCosine(peak_learning_rate=float("nan")))),
     "peak_learning_rate=nan must be a number > 0"),
    (dict(optimizer=AdamW(learning_rate=WarmupCosine(warmup_steps=-1))),
     "WarmupCosine.warmup_steps=-1 must be an integer >= 0"),
    (dict(optimizer=AdamW(learning_rate=WarmupCosine(decay_steps=0))),
     "WarmupCosine.decay_steps=0 must be a positive integer or None"),
    (dict(optimizer=AdamW(b2=1.0)), "AdamW.b2=1.0 must be a number in [0, 1)"),
    (dict(optimizer=AdamW(learning_rate=WarmupCosine(final_learning_rate_fraction=2))),
     "final_learning_rate_fraction=2 must be a number in [0, 1]"),
    (dict(optimizer=AdamW(clip_grad_norm=-1.0)),
     "AdamW.clip_grad_norm=-1.0 must be a number >= 0 or None"),
    (dict(loss=LossConfig(label_smoothing=1.0)), "LossConfig.label_smoothing=1.0 must be a number in [0, 1)"),
    (dict(loss=LossConfig(z_loss="1e-4")),
     "LossConfig.z_loss='1e-4' must be a number >= 0 (a number, without quotes)"),
    (dict(microbatches=0), "train.microbatches=0 must be a positive integer"),
    (dict(peak_flops_per_device=-1.0), "train.peak_flops_per_device=-1.0 must be a number > 0 or None"),
    (dict(model_dir=""), "MODEL_DIR='' must be a non-empty string"),
    # Meshes and rule tables: known axis names, one -1 at most.
    (dict(mesh_axes=[("data", -1), ("fsdp", -1)]), "with at most one -1"),
    (dict(mesh_axes=[("data", 0)]), "needs sizes that are positive integers"),
    (dict(mesh_axes=[("dta", -1)]), "('dta' is not one)"),
    (dict(mesh_axes=[("data", 2), ("data", 4)]), "at most once"),
    (dict(mesh_axes=16), "must be a list of (axis name, size) pairs"),
    (dict(logical_axis_rules=[("batch", "dta")]), "LOGICAL_AXIS_RULES entry 'batch'='dta' must be None, a mesh axis"),
])
def test_each_bad_value_is_named(overrides, message):
    assert message in refused(spec(**overrides))


@pytest.mark.parametrize("settings, message", [
    (dict(log_period=0), "train.log_period=0 must be a positive integer"),
    (dict(eval_batches=0), "train.eval_batches=0 must be a positive integer or None"),
    (dict(eval_period=-1), "train.eval_period=-1 is not a period"),
    (dict(checkpoint_period=1.5), "train.checkpoint_period=1.5 is not a period"),
    (dict(seed=-3), "train.seed (SEED)=-3 must be an integer >= 0"),
    (dict(sample_max_new_tokens=0), "train.sample_max_new_tokens=0 must be a positive integer"),
    (dict(sample_prompt=["def ", 3]), "train.sample_prompt=['def ', 3] must be a string in quotes"),
    (dict(init_loss_tolerance=-1), "train.init_loss_tolerance=-1 must be a number >= 0"),
    (dict(async_checkpoints="no"), "train.async_checkpoints='no' must be True or False"),
    (dict(progress_bar=1), "train.progress_bar=1 must be True or False or None"),
    (dict(task_module=""), "MIXTURE_OR_TASK_MODULE='' must be a non-empty string"),
    (dict(metric_writers="tb"), "train.metric_writers='tb' must be a list of metric writers"),
])
def test_each_bad_setting_of_train_is_named(settings, message):
    assert message in refused(spec(), **settings)


def test_every_bad_value_is_reported_at_once_and_a_shared_macro_once():
    message = refused(spec(train_steps=-1, train_data=dataclasses.replace(TRAIN, batch_size=0),
                           eval_data=dataclasses.replace(EVAL, batch_size=0)), log_period=0)
    assert message.startswith("3 values are invalid: TRAIN_STEPS=-1"), message
    assert "train/DataConfig.batch_size (BATCH_SIZE)=0" in message and "eval/DataConfig.batch_size" not in message
    assert "train.log_period=0" in message


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="float17"), "Unknown DecoderConfig.dtype 'float17'; choose one of ['float32', 'bfloat16', 'float16']"),
    (dict(num_layers=0), "DecoderConfig.num_layers=0 must be a positive integer"),
    (dict(emb_dim=64.0), "DecoderConfig.emb_dim=64.0 must be a positive integer"),
    (dict(scan_layers="yes"), "DecoderConfig.scan_layers='yes' must be True or False"),
    (dict(dropout_rate=1.0), "DecoderConfig.dropout_rate=1.0 must be in [0, 1)"),
    (dict(norm_epsilon=-1e-6), "DecoderConfig.norm_epsilon=-1e-06 must be a number >= 0 or None"),
])
def test_model_configs_refuse_bad_values_when_built(kwargs, message):
    with pytest.raises(UserError) as e:
        DecoderConfig(**kwargs)
    assert message in str(e.value)
    with pytest.raises(UserError, match="T5Config.dtype 'float17'"):
        T5Config(dtype="float17")


@pytest.mark.parametrize("axes, devices, message", [
    ([("data", 16)], 1, "need 16 devices but 1 is available (jax.device_count()); set one axis to -1"),
    ([("data", -1), ("tensor", 3)], 8, "do not divide the 8 devices"),
    ([("data", -1), ("fsdp", -1)], 8, "at most one axis may have size -1"),
    ([("data", 0)], 8, "each size must be a positive integer or -1"),
])
def test_mesh_errors_are_user_errors_naming_the_device_count(axes, devices, message):
    import jax

    with pytest.raises(partitioning.MeshError) as e:
        partitioning.make_mesh(axes=axes, devices=jax.devices()[:devices])
    assert isinstance(e.value, UserError) and message in str(e.value)
    with pytest.raises(partitioning.MeshError, match="cannot be laid over 3 hosts"):
        partitioning.split_over_granules({"data": 4}, 3)
    with pytest.raises(partitioning.MeshError, match="uneven or overlapping rows"):
        partitioning.data_shard_from_rows({0: (0, 4), 1: (2, 6)}, 0)


def test_a_batch_the_mesh_cannot_split_is_a_user_error():
    import jax

    mesh = partitioning.make_mesh(axes=[("data", -1)], devices=jax.devices()[:8])
    sharding = partitioning.batch_sharding(mesh, partitioning.rules_for_mesh(partitioning.DEFAULT_RULES, mesh))
    assert partitioning.process_data_shard(sharding, 16) == (0, 1, 16)
    for rows in (0, 12, 8.0):
        with pytest.raises(partitioning.MeshError, match="batch shards of mesh"):
            partitioning.process_data_shard(sharding, rows)


def test_the_model_dir_must_be_a_directory_we_can_write(tmp_path):
    run_values.check_model_dir(str(tmp_path))  # exists
    run_values.check_model_dir(str(tmp_path / "new" / "run"))  # can be made
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(RunConfigError, match="file.txt' is a file, not a directory"):
        run_values.check_model_dir(str(tmp_path / "file.txt"))
    with pytest.raises(RunConfigError, match=r"cannot be created: '.*file.txt' is a file, not a directory"):
        run_values.check_model_dir(str(tmp_path / "file.txt" / "run"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # nothing made


def test_an_unwritable_model_dir_is_refused(tmp_path):
    """Refused before anything is made (cli_helpers.unwritable_directory)."""
    with unwritable_directory(tmp_path / "locked") as locked:
        with pytest.raises(RunConfigError, match="locked' is not writable by this user"):
            run_values.check_model_dir(str(locked))
        with pytest.raises(RunConfigError, match="locked', where MODEL_DIR .*/run' would be made, is not writable"):
            run_values.check_model_dir(str(locked / "run"))


def test_values_checked_elsewhere_already_stay_refused():
    """Regression: a retention that keeps nothing and a task nobody registered (exit 2 before too)."""
    from t5x_lite.checkpoints.retention import RetentionPolicy
    from t5x_lite.data import task_access

    with pytest.raises(UserError, match=r"RetentionPolicy.keep_last=0: keep at least the newest checkpoint \(1\)"):
        RetentionPolicy(keep_last=0)
    with pytest.raises(UserError, match="No seqio task or mixture named 'no_such_task'"):
        task_access.get_task("no_such_task")
