"""Checkpoints in-process: retention, init-from mapping, damage recovery, resharding, s3, NaN steps."""

import json
import os

import jax
import numpy as np
import pytest

from t5x_lite import storage
from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.checkpoints import info as checkpoint_info
from t5x_lite.checkpoints import init_from, lookup
from t5x_lite.checkpoints.retention import RetentionPolicy, steps_to_keep
from t5x_lite.checkpoints.s3_mirror import COMMIT_MARKER
from t5x_lite.errors import ConfigValueError
from t5x_lite.parallel import partitioning
from t5x_lite.training.trainer import TrainState
from tests.conftest import S3_BUCKET
from tests.training.test_trainer import get_trainer, make_batch

# -- retention (pure) ----------------------------------------------------------------------------


def test_retention_keeps_last_every_and_best():
    steps = [100, 200, 300, 400, 500, 600]
    metrics = {100: {"eval/loss": 3.0}, 200: {"eval/loss": 1.5}, 300: {"eval/loss": 2.0},
               400: {"eval/loss": float("nan")}, 500: {}, 600: {"eval/loss": 2.5}}
    assert steps_to_keep(steps, metrics, RetentionPolicy(keep_last=2)) == {500, 600}
    assert steps_to_keep(steps, metrics, RetentionPolicy(keep_last=1, keep_every=300)) == {300, 600}
    # NaN and missing metrics never count as best.
    assert steps_to_keep(steps, metrics, RetentionPolicy(keep_last=1, keep_best=2)) == {200, 300, 600}
    accuracy = {s: {"eval/acc": float(s)} for s in steps}
    assert steps_to_keep(steps, accuracy, RetentionPolicy(keep_last=1, keep_best=2, best_metric="eval/acc",
                                                          best_mode="max")) == {500, 600}
    assert steps_to_keep([], {}, RetentionPolicy()) == set()


@pytest.mark.parametrize("kwargs", [{"keep_last": 0}, {"keep_every": 0}, {"keep_best": -1}, {"best_mode": "low"}])
def test_retention_rejects_bad_settings(kwargs):
    with pytest.raises(ConfigValueError, match="RetentionPolicy"):
        RetentionPolicy(**kwargs)


# -- init_from mapping (pure) --------------------------------------------------------------------


def test_init_from_mapping_rules_and_strictness():
    target = {"encoder/layer/kernel": (4, 4), "decoder/layer/kernel": (4, 4), "head/kernel": (4, 8)}
    source = {"encoder/layer/kernel": (4, 4), "enc2/layer/kernel": (4, 4), "head/kernel": (4, 8)}
    # decoder/... comes from enc2/... by a rule with a group.
    plan, warnings = init_from.plan_mapping(target, source, [(r"decoder/(.*)", r"enc2/\1")], strict=True)
    assert plan == {"encoder/layer/kernel": "encoder/layer/kernel", "decoder/layer/kernel": "enc2/layer/kernel",
                    "head/kernel": "head/kernel"}
    assert warnings == []
    # A None rule keeps the fresh initialisation, and unused source tensors are reported.
    plan, warnings = init_from.plan_mapping(target, source, [(r"decoder/.*", None)], strict=True)
    assert plan["decoder/layer/kernel"] is None
    assert any("enc2/layer/kernel" in w for w in warnings)
    # Strict: a target missing from the source is an error naming it.
    with pytest.raises(init_from.InitFromError, match="decoder/layer/kernel"):
        init_from.plan_mapping(target, source, [], strict=True)
    plan, warnings = init_from.plan_mapping(target, source, [], strict=False)
    assert plan["decoder/layer/kernel"] is None and "fresh initialisation" in warnings[0]
    # A shape mismatch is an error even when not strict.
    with pytest.raises(init_from.InitFromError, match=r"head/kernel: shape \(4, 8\)"):
        init_from.plan_mapping(target, {**source, "head/kernel": (4, 9)}, [], strict=False)
    with pytest.raises(ConfigValueError, match="not valid"):
        init_from.InitFrom(checkpoint="x", mapping=[("(", None)])


# -- a real train state --------------------------------------------------------------------------


def _state(mesh_axes=(("data", 1), ("fsdp", 1), ("tensor", 1)), steps=2):
    trainer = get_trainer(mesh_axes=mesh_axes)
    batch = make_batch()
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    global_batch = partitioning.host_batch_to_global(batch, trainer.batch_sharding)
    for _ in range(steps):
        state, _ = trainer.train_step(state, global_batch, jax.random.PRNGKey(1))
    return trainer, state


def _saveable(state):
    return checkpoint_lib.to_saveable(state, jax.random.PRNGKey(7))


def _abstract(trainer):
    return checkpoint_lib.to_saveable(trainer.abstract_state(make_batch()), jax.random.PRNGKey(0))


def _assert_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _save(checkpointer, step, state, metrics=None):
    checkpointer.save(step, state=_saveable(state), iterator_state={"epoch": 0, "batches_in_epoch": step},
                      metadata={"family": "decoder_only"}, config_text="train.seed = 0\n", metrics=metrics)


@pytest.fixture(scope="module")
def trained():
    return _state()


def test_async_save_restores_exactly_and_applies_retention(trained, tmp_path):
    trainer, state = trained
    checkpointer = checkpoint_lib.Checkpointer(tmp_path, retention=RetentionPolicy(keep_last=2, keep_every=4))
    for step in range(1, 8):
        _save(checkpointer, step, state)
    checkpointer.close()
    reader = checkpoint_lib.Checkpointer(tmp_path, read_only=True)
    assert reader.all_steps() == [4, 6, 7]
    restored, iterator_state, metadata = reader.restore(7, abstract_state=_abstract(trainer))
    _assert_equal(restored, _saveable(state))
    assert iterator_state == {"epoch": 0, "batches_in_epoch": 7}
    assert metadata["step"] == 7 and reader.config_text(7) == "train.seed = 0\n"
    reader.close()
    # Nothing half-written is left behind.
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["4", "6", "7"]


def test_damaged_latest_falls_back_to_the_previous_one(trained, tmp_path):
    trainer, state = trained
    checkpointer = checkpoint_lib.Checkpointer(tmp_path)
    for step in (1, 2, 3):
        _save(checkpointer, step, state)
    checkpointer.close()
    # Step 3: an array file cut short. Step 2: its metadata overwritten with garbage.
    files = [os.path.join(root, f) for root, _, names in os.walk(tmp_path / "checkpoints" / "3" / "state")
             for f in names]
    biggest = max(files, key=os.path.getsize)
    with open(biggest, "r+b") as f:
        f.truncate(os.path.getsize(biggest) // 2)
    (tmp_path / "checkpoints" / "2" / "metadata" / "metadata").write_text("{not json")

    warnings = []
    reader = checkpoint_lib.Checkpointer(tmp_path)
    step, restored, _, _ = reader.restore_latest_good(abstract_state=_abstract(trainer), check=lambda m: None,
                                                      warn=warnings.append)
    reader.close()
    assert step == 1
    _assert_equal(restored, _saveable(state))
    assert len(warnings) == 2 and "step 3 is damaged" in warnings[0] and "step 2 is damaged" in warnings[1]
    # Moved aside, not deleted.
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]
    assert sorted(n.split("-")[0] for n in os.listdir(tmp_path / "checkpoints_damaged")) == ["2", "3"]


def test_no_restorable_checkpoint_changes_nothing(trained, tmp_path):
    trainer, state = trained
    checkpointer = checkpoint_lib.Checkpointer(tmp_path)
    _save(checkpointer, 1, state)
    checkpointer.close()
    (tmp_path / "checkpoints" / "1" / "metadata" / "metadata").write_text("")
    reader = checkpoint_lib.Checkpointer(tmp_path)
    with pytest.raises(checkpoint_lib.NoUsableCheckpointError, match="step 1"):
        reader.restore_latest_good(abstract_state=_abstract(trainer), check=lambda m: None, warn=print)
    reader.close()
    assert os.listdir(tmp_path / "checkpoints") == ["1"] and not (tmp_path / "checkpoints_damaged").exists()


def test_a_changed_train_state_is_a_mismatch_not_damage(trained, tmp_path):
    _, state = trained
    checkpointer = checkpoint_lib.Checkpointer(tmp_path)
    _save(checkpointer, 1, state)
    checkpointer.close()
    sgd_trainer = get_trainer(optimizer="sgd")  # another optimizer: another opt_state tree
    reader = checkpoint_lib.Checkpointer(tmp_path)
    with pytest.raises(checkpoint_lib.CheckpointMismatchError, match="in the checkpoint only: opt_state"):
        reader.restore_latest_good(abstract_state=_abstract(sgd_trainer), check=lambda m: None, warn=print)
    reader.close()
    assert os.listdir(tmp_path / "checkpoints") == ["1"]


@pytest.mark.parametrize("target_axes", [(("data", 1), ("fsdp", 1), ("tensor", 1)),
                                         (("data", 2), ("fsdp", 4), ("tensor", 1))], ids=["1_device", "2x4"])
def test_restore_on_another_mesh_continues_with_the_same_loss(tmp_path, target_axes):
    """Saved under 8-way FSDP, restored on 1 device and on a 2x4 mesh: same next losses."""
    source, state = _state(mesh_axes=(("data", 1), ("fsdp", 8), ("tensor", 1)))
    checkpointer = checkpoint_lib.Checkpointer(tmp_path)
    _save(checkpointer, 2, state)
    checkpointer.close()

    target = get_trainer(mesh_axes=target_axes)
    reader = checkpoint_lib.Checkpointer(tmp_path, read_only=True)
    restored, _, _ = reader.restore(2, abstract_state=_abstract(target))
    reader.close()
    restored.pop("dropout_rng")

    restored = TrainState(**restored)
    assert restored.params["logits"]["kernel"].sharding == target.state_shardings.params["logits"]["kernel"]
    batch = make_batch(seed=1)
    losses = {}
    for name, trainer, st in (("source", source, state), ("target", target, restored)):
        global_batch = partitioning.host_batch_to_global(batch, trainer.batch_sharding)
        _, metrics = trainer.train_step(st, global_batch, jax.random.PRNGKey(1))
        st2, metrics2 = trainer.train_step(_, global_batch, jax.random.PRNGKey(1))
        losses[name] = [float(m["loss_sum"] / m["weight_sum"]) for m in (metrics, metrics2)]
    np.testing.assert_allclose(losses["target"], losses["source"], rtol=1e-5)


def test_init_from_loads_params_into_a_new_state(trained, tmp_path):
    trainer, state = trained
    checkpointer = checkpoint_lib.Checkpointer(tmp_path / "source")
    _save(checkpointer, 5, state)
    checkpointer.close()
    fresh = trainer.init_state(jax.random.PRNGKey(3), make_batch())
    messages = []
    loaded = init_from.load_params(init_from.InitFrom(checkpoint=str(tmp_path / "source" / "checkpoints" / "5")),
                                   target_params=fresh.params, warn=messages.append)
    _assert_equal(loaded, state.params)
    assert "Initialised 11 of 11 parameter arrays" in messages[-1] or "parameter arrays from" in messages[-1]
    # Keep the embedding fresh: a None rule.
    loaded = init_from.load_params(
        init_from.InitFrom(checkpoint=str(tmp_path / "source"), mapping=[("token_embed/.*", None)]),
        target_params=fresh.params, warn=messages.append)
    _assert_equal(loaded["token_embed"], fresh.params["token_embed"])
    _assert_equal(loaded["logits"], state.params["logits"])
    with pytest.raises(init_from.InitFromError, match="no checkpoint"):
        init_from.resolve(init_from.InitFrom(checkpoint=str(tmp_path / "nothing")))


def test_nonfinite_step_leaves_the_state_unchanged(trained):
    trainer, state = trained
    copy = lambda: jax.tree.map(lambda x: jax.device_put(np.asarray(x), x.sharding), state)  # noqa: E731 (donated)
    poisoned = copy()
    kernel = np.asarray(poisoned.params["logits"]["kernel"]).copy()
    kernel[0, 0] = np.inf
    poisoned.params["logits"]["kernel"] = jax.device_put(kernel, state.params["logits"]["kernel"].sharding)
    before = jax.tree.map(np.asarray, (poisoned.params, poisoned.opt_state))
    global_batch = partitioning.host_batch_to_global(make_batch(), trainer.batch_sharding)
    after, metrics = trainer.train_step(poisoned, global_batch, jax.random.PRNGKey(1))
    assert float(metrics["nonfinite_steps"]) == 1.0
    assert int(after.step) == int(state.step) + 1
    _assert_equal((after.params, after.opt_state), before)
    _, metrics = trainer.train_step(copy(), global_batch, jax.random.PRNGKey(1))
    assert float(metrics["nonfinite_steps"]) == 0.0


# -- s3 against moto's server ----------------------------------------------------------------------


def test_s3_save_resume_retention_and_uncommitted_steps(trained, s3_server, tmp_path, monkeypatch):

    trainer, state = trained
    monkeypatch.setenv("T5X_LITE_STAGING_DIR", str(tmp_path / "machine_a"))
    run = f"s3://{S3_BUCKET}/ckpt-run"
    checkpointer = checkpoint_lib.Checkpointer(run, retention=RetentionPolicy(keep_last=2))
    storage.makedirs(checkpointer.work_dir)
    (open(os.path.join(checkpointer.work_dir, "config.gin"), "w")).write("x = 1\n")
    for step in (1, 2, 3):
        _save(checkpointer, step, state, metrics={"eval/loss": 1.0 / step})
    checkpointer.close()
    assert checkpoint_lib.Checkpointer(run, read_only=True).all_steps() == [2, 3]
    assert storage.exists(f"{run}/config.gin")
    # An upload that did not finish: files without the COMMITTED marker are not a checkpoint.
    with storage.open(f"{run}/checkpoints/9/state/junk", "wb") as f:
        f.write(b"partial")

    # Another machine (an empty staging directory) resumes from s3.
    monkeypatch.setenv("T5X_LITE_STAGING_DIR", str(tmp_path / "machine_b"))
    reader = checkpoint_lib.Checkpointer(run, retention=RetentionPolicy(keep_last=2))
    assert reader.all_steps() == [2, 3]
    step, restored, iterator_state, metadata = reader.restore_latest_good(
        abstract_state=_abstract(trainer), check=lambda m: None, warn=print)
    assert step == 3 and iterator_state["batches_in_epoch"] == 3 and metadata["metrics"] == {"eval/loss": 1 / 3}
    _assert_equal(restored, _saveable(state))
    _save(reader, 9, state)  # the stale step-9 objects are replaced, then committed
    reader.close()
    assert checkpoint_lib.Checkpointer(run, read_only=True).all_steps() == [3, 9]
    assert not storage.exists(f"{run}/checkpoints/9/state/junk")
    assert storage.exists(f"{run}/checkpoints/9/{COMMIT_MARKER}")
    info = json.loads(storage.open(f"{run}/checkpoints/9/metadata/metadata", "r").read())
    assert info["step"] == 9


# -- faults during a save ---------------------------------------------------------------------------


@pytest.fixture
def small_disk(small_tmpfs):
    """A 600 KiB tmpfs: room for one checkpoint of the tiny state, not two."""
    return small_tmpfs("600k")


def test_full_disk_fails_the_save_loudly_and_keeps_the_earlier_checkpoint(trained, small_disk):
    trainer, state = trained
    checkpointer = checkpoint_lib.Checkpointer(small_disk / "run", retention=RetentionPolicy(keep_last=1))
    _save(checkpointer, 1, state)
    checkpointer.wait()
    with pytest.raises(Exception, match="(?i)no space|space left|ENOSPC|resource exhausted"):
        _save(checkpointer, 2, state)
        checkpointer.wait()
    try:
        checkpointer.close()
    except Exception:  # noqa: BLE001 - the failed save may be reported again on close
        pass
    reader = checkpoint_lib.Checkpointer(small_disk / "run", read_only=True)
    assert reader.all_steps() == [1]
    restored, _, _ = reader.restore(1, abstract_state=_abstract(trainer))
    _assert_equal(restored, _saveable(state))
    reader.close()


def test_unreachable_bucket_fails_the_save_loudly_and_keeps_the_earlier_checkpoint(
        trained, s3_server, tmp_path, monkeypatch):
    import s3fs

    trainer, state = trained
    monkeypatch.setenv("T5X_LITE_STAGING_DIR", str(tmp_path / "staging"))
    run = f"s3://{S3_BUCKET}/unreachable-run"
    checkpointer = checkpoint_lib.Checkpointer(run, retention=RetentionPolicy(keep_last=1))
    _save(checkpointer, 1, state)
    checkpointer.wait()
    # The endpoint goes away: nothing listens on port 9 of the loopback.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(Exception, match="(?i)connect|endpoint"):
        _save(checkpointer, 2, state)
        checkpointer.wait()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    s3fs.S3FileSystem.clear_instance_cache()
    reader = checkpoint_lib.Checkpointer(run, read_only=True)
    assert reader.all_steps() == [1]
    restored, _, _ = reader.restore(1, abstract_state=_abstract(trainer))
    _assert_equal(restored, _saveable(state))
    reader.close()


def test_checkpoint_info_describes_a_step_without_loading_it(trained, tmp_path):
    _, state = trained
    checkpointer = checkpoint_lib.Checkpointer(tmp_path)
    for step in (3, 6):
        _save(checkpointer, step, state, metrics={"eval/loss": 2.5})
    checkpointer.close()
    info = checkpoint_info.describe(str(tmp_path))
    assert info["step"] == 6 and info["steps_present"] == [3, 6]
    assert info["metadata"]["family"] == "decoder_only" and info["metadata"]["metrics"] == {"eval/loss": 2.5}
    assert info["data_iterator"] == {"epoch": 0, "batches_in_epoch": 6}
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    assert info["arrays"]["params"][1] == num_params and info["arrays"]["params"][2] == 4 * num_params
    assert info["config"] == "train.seed = 0\n"
    text = checkpoint_info.format_info(info)
    assert f"params: {len(jax.tree.leaves(state.params))} arrays, {num_params:,} values" in text
    # A step directory names its own step; a step that is not there is an error naming those that are.
    assert checkpoint_info.describe(str(tmp_path / "checkpoints" / "3"))["step"] == 3
    with pytest.raises(lookup.CheckpointNotFoundError, match=r"available: \[3, 6\]"):
        checkpoint_info.describe(str(tmp_path), step=4)
    with pytest.raises(lookup.CheckpointNotFoundError, match="no checkpoint in"):
        checkpoint_info.describe(str(tmp_path / "empty"))


def test_s3_keep_best_ranks_steps_saved_by_an_earlier_run(trained, s3_server, tmp_path, monkeypatch):
    """The metrics of steps already on s3 are read from their metadata objects to rank them."""
    _, state = trained
    run = f"s3://{S3_BUCKET}/best-run"
    policy = RetentionPolicy(keep_last=1, keep_best=1)
    monkeypatch.setenv("T5X_LITE_STAGING_DIR", str(tmp_path / "first"))
    checkpointer = checkpoint_lib.Checkpointer(run, retention=policy)
    for step in (1, 2, 3):
        _save(checkpointer, step, state, metrics={"eval/loss": float(step)})
    checkpointer.close()
    assert checkpoint_lib.Checkpointer(run, read_only=True).all_steps() == [1, 3]
    monkeypatch.setenv("T5X_LITE_STAGING_DIR", str(tmp_path / "second"))
    checkpointer = checkpoint_lib.Checkpointer(run, retention=policy)
    _save(checkpointer, 4, state, metrics={"eval/loss": 4.0})
    checkpointer.close()
    assert checkpoint_lib.Checkpointer(run, read_only=True).all_steps() == [1, 4]
