"""Verified checkpoints and readers that never write: manifests, step states, the fallback of every
reader to the newest good step, and a save in progress left untouched by every reader."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.checkpoints import info as checkpoint_info
from t5x_lite.checkpoints import lookup, manifest, restored_model, verify
from t5x_lite.checkpoints.retention import RetentionPolicy
from tests.cli_helpers import run_cli, run_cli_in_process


def _state(value: float) -> dict:
    return {"step": jnp.array(int(value)), "params": {"w": jnp.full((64, 64), value, jnp.float32)},
            "opt_state": {}, "dropout_rng": jax.random.PRNGKey(0)}


def _save_steps(model_dir: Path, steps=(1, 2, 3), *, async_save: bool = True) -> None:
    checkpointer = checkpoint_lib.Checkpointer(model_dir, retention=RetentionPolicy(keep_every=1),
                                               async_save=async_save)
    for step in steps:
        checkpointer.save(step, state=_state(step), iterator_state={"position": step}, metadata={"family": "x"})
    checkpointer.close()


def _biggest_file(step_dir: Path) -> Path:
    files = [Path(root) / name for root, _, names in os.walk(step_dir / "state") for name in names]
    return max(files, key=lambda p: p.stat().st_size)


def _flip_bytes(path: Path, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(min(count, len(data))):
        data[(len(data) // 2 + i) % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


def tree_digest(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file, and every directory (so that removals show)."""
    digest = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            digest[os.path.relpath(os.path.join(dirpath, name), root) + "/"] = "dir"
        for name in filenames:
            path = os.path.join(dirpath, name)
            digest[os.path.relpath(path, root)] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return digest


def _states(model_dir: Path) -> dict[int, str]:
    return {s.step: s.state for s in verify.directory_states(str(model_dir))}


# -- manifests and step states ------------------------------------------------------------------------


@pytest.mark.parametrize("split", [0, 1, 7, 4096, 100_003])
def test_crc32c_combine_equals_the_checksum_of_the_whole(split):
    import google_crc32c

    data = np.random.default_rng(split).integers(0, 256, 150_000, dtype=np.uint8).tobytes()
    a, b = data[:split], data[split:]
    assert manifest.crc32c_combine(google_crc32c.value(a), google_crc32c.value(b), len(b)) == google_crc32c.value(data)


def test_a_large_file_checksummed_in_pieces_matches_one_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(manifest, "_PIECE", 1000)  # many pieces and an odd-sized first one
    path = tmp_path / "big"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 25_123, dtype=np.uint8).tobytes())
    assert manifest._checksums(str(tmp_path), ["big"]) == {"big": manifest.crc32c_of(str(path))}


@pytest.mark.parametrize("async_save", [True, False])
def test_a_committed_step_has_a_manifest_of_every_file(tmp_path, async_save):
    _save_steps(tmp_path, async_save=async_save)
    for step in (1, 2, 3):
        step_dir = tmp_path / "checkpoints" / str(step)
        saved = json.loads((step_dir / manifest.MANIFEST).read_text())
        files = sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*")
                       if p.is_file() and p.name != manifest.MANIFEST)
        assert sorted(saved["files"]) == files and saved["step"] == step
        assert all(entry["size"] == (step_dir / name).stat().st_size for name, entry in saved["files"].items())
    assert _states(tmp_path) == {1: "good", 2: "good", 3: "good"}


def test_each_kind_of_damage_gets_its_own_state_and_names_the_file(tmp_path):
    _save_steps(tmp_path, steps=(1, 2, 3, 4, 5))
    root = tmp_path / "checkpoints"
    flipped = _biggest_file(root / "5")
    _flip_bytes(flipped)                                                    # silent corruption
    truncated = _biggest_file(root / "4")
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])  # cut short
    shutil.rmtree(root / "3" / "metadata")                                  # metadata/ removed
    (root / "2" / manifest.MANIFEST).unlink()                               # killed before the manifest
    states = {s.step: s for s in verify.directory_states(str(tmp_path))}
    assert {k: v.state for k, v in states.items()} == {1: "good", 2: "incomplete", 3: "damaged", 4: "damaged",
                                                        5: "damaged"}
    assert str(flipped.relative_to(root / "5")) in states[5].reason and "CRC32C" in states[5].reason
    assert str(truncated.relative_to(root / "4")) in states[4].reason and "bytes" in states[4].reason
    assert states[3].reason.startswith("metadata/") and states[3].reason.endswith("is missing")
    # Sizes only: the flipped bytes pass (same size), everything else is still caught.
    quick = {s.step: s.state for s in verify.directory_states(str(tmp_path), sizes_only=True)}
    assert quick == {1: "good", 2: "incomplete", 3: "damaged", 4: "damaged", 5: "good"}


def test_a_step_saved_without_a_manifest_is_unverified_and_still_readable(tmp_path):
    _save_steps(tmp_path, steps=(1,))
    step_dir = tmp_path / "checkpoints" / "1"
    (step_dir / manifest.MANIFEST).unlink()
    metadata = step_dir / "metadata" / "metadata"
    saved = json.loads(metadata.read_text())
    saved.pop("manifest")  # as a checkpoint of a version before manifests
    metadata.write_text(json.dumps(saved))
    assert _states(tmp_path) == {1: "unverified"}
    assert lookup.locate(str(tmp_path)) == (str(tmp_path), 1)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
    "bit-flipped": lambda step_dir: _flip_bytes(_biggest_file(step_dir)),
    "truncated": lambda step_dir: _truncate(_biggest_file(step_dir)),
    "metadata-less": lambda step_dir: shutil.rmtree(step_dir / "metadata"),
    "incomplete": lambda step_dir: (step_dir / manifest.MANIFEST).unlink(),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_kind_of_damage_to_the_latest_step_falls_back_for_readers(tmp_path, kind):
    _save_steps(tmp_path, steps=(1, 2))
    DAMAGE[kind](tmp_path / "checkpoints" / "2")
    before, warnings = tree_digest(tmp_path), []
    assert lookup.locate(str(tmp_path), warn=warnings.append) == (str(tmp_path), 1)
    assert len(warnings) == 1 and "step 2: " in warnings[0]
    with pytest.raises(lookup.DamagedCheckpointError, match="step 2"):
        lookup.locate(str(tmp_path), 2)
    assert tree_digest(tmp_path) == before


def test_locate_skips_damaged_steps_with_one_warning_each_and_refuses_a_named_one(tmp_path):
    _save_steps(tmp_path)
    _flip_bytes(_biggest_file(tmp_path / "checkpoints" / "3"))
    (tmp_path / "checkpoints" / "2" / manifest.MANIFEST).unlink()
    warnings = []
    assert lookup.locate(str(tmp_path), warn=warnings.append) == (str(tmp_path), 1)
    assert len(warnings) == 2 and "step 3: damaged" in warnings[0] and "step 2: incomplete" in warnings[1]
    assert all("using step 1" in w for w in warnings)
    with pytest.raises(lookup.DamagedCheckpointError, match="step 3 .* is damaged"):
        lookup.locate(str(tmp_path), 3)
    with pytest.raises(lookup.DamagedCheckpointError, match="step 3 .* is damaged"):
        lookup.locate(str(tmp_path / "checkpoints" / "3"))
    _flip_bytes(_biggest_file(tmp_path / "checkpoints" / "1"))
    before = tree_digest(tmp_path)
    with pytest.raises(lookup.DamagedCheckpointError, match="no checkpoint .* is whole"):
        lookup.locate(str(tmp_path), warn=warnings.append)
    assert tree_digest(tmp_path) == before  # a reader moves nothing aside


def test_the_trainer_moves_a_bit_flipped_latest_step_aside_and_restores_the_one_before(tmp_path):
    _save_steps(tmp_path)
    _flip_bytes(_biggest_file(tmp_path / "checkpoints" / "3"))
    warnings = []
    checkpointer = checkpoint_lib.Checkpointer(tmp_path, retention=RetentionPolicy(keep_every=1))
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _state(0))
    step, restored, iterator_state, _ = checkpointer.restore_latest_good(
        abstract_state=abstract, check=lambda m: None, warn=warnings.append)
    checkpointer.close()
    assert step == 2 and iterator_state == {"position": 2}
    np.testing.assert_array_equal(restored["params"]["w"], np.full((64, 64), 2.0, np.float32))
    assert len(warnings) == 1 and "step 3 is damaged" in warnings[0] and "CRC32C" in warnings[0]
    assert sorted(os.listdir(tmp_path / "checkpoints_damaged"))[0].startswith("3-")


def test_a_run_killed_before_its_first_save_finished_starts_afresh(tmp_path):
    """Every step incomplete (committed by Orbax, no manifest: the run died before the save
    finished): nothing finished was ever saved, so the trainer moves them aside and starts from
    step 0. One damaged step among them still stops the run, moving nothing."""
    run, mixed = tmp_path / "run", tmp_path / "mixed"
    _save_steps(run, steps=(1, 2))
    for step in (1, 2):
        (run / "checkpoints" / str(step) / manifest.MANIFEST).unlink()
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _state(0))
    shutil.copytree(run, mixed)
    _flip_bytes(_biggest_file(mixed / "checkpoints" / "1"))
    (mixed / "checkpoints" / "1" / manifest.MANIFEST).write_text("{}")  # present but unreadable: damaged

    warnings = []
    checkpointer = checkpoint_lib.Checkpointer(run)
    assert checkpointer.restore_latest_good(abstract_state=abstract, check=lambda m: None,
                                            warn=warnings.append) is None
    assert checkpointer.all_steps() == []
    checkpointer.close()
    assert len(warnings) == 2 and all("incomplete" in w and "starting from step 0" in w for w in warnings)
    assert sorted(n.split("-")[0] for n in os.listdir(run / "checkpoints_damaged")) == ["1", "2"]

    before = tree_digest(mixed)
    checkpointer = checkpoint_lib.Checkpointer(mixed)
    with pytest.raises(checkpoint_lib.NoUsableCheckpointError, match="step 1: damaged"):
        checkpointer.restore_latest_good(abstract_state=abstract, check=lambda m: None, warn=warnings.append)
    checkpointer.close()
    assert tree_digest(mixed) == before


# -- readers never write -----------------------------------------------------------------------------


@pytest.fixture
def dir_with_a_save_in_progress(tmp_path):
    """Steps 1-2 committed and step 3 in Orbax's temporary directory, as while a save is in flight."""
    _save_steps(tmp_path, steps=(1, 2))
    in_flight = tmp_path / "checkpoints" / f"3{checkpoint_lib.TMP_MARKER}"
    shutil.copytree(tmp_path / "checkpoints" / "2", in_flight)
    (in_flight / manifest.MANIFEST).unlink()
    return tmp_path, in_flight


def test_a_writer_would_clean_up_the_temporary_directory(dir_with_a_save_in_progress):
    """What readers must not do: a Checkpointer that may write removes an unfinished save."""
    model_dir, in_flight = dir_with_a_save_in_progress
    writer = checkpoint_lib.Checkpointer(model_dir)
    writer.save(4, state=_state(4), iterator_state={}, metadata={})  # a save first waits for Orbax's clean-up
    writer.close()
    assert not in_flight.exists()


def test_every_reader_leaves_a_save_in_progress_untouched(dir_with_a_save_in_progress, tmp_path_factory):
    model_dir, in_flight = dir_with_a_save_in_progress
    before = tree_digest(model_dir)
    assert lookup.locate(str(model_dir)) == (str(model_dir), 2)
    info = checkpoint_info.describe(str(model_dir))
    assert info["step"] == 2 and [s.describe() for s in info["states"]][-1].startswith("step 3: incomplete")
    assert checkpoint_lib.Checkpointer(model_dir, read_only=True).all_steps() == [1, 2]
    assert _states(model_dir) == {1: "good", 2: "good", 3: "incomplete"}
    reader = checkpoint_lib.Checkpointer(model_dir, read_only=True, retention=RetentionPolicy(keep_last=1))
    reader.restore_params(2)
    reader.wait()
    reader.close()  # retention is never applied by a reader
    assert tree_digest(model_dir) == before and in_flight.exists()


def test_restored_model_reads_the_newest_good_step(tmp_path, trained_run, capfd):
    run, _ = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    latest = max(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
    _flip_bytes(_biggest_file(copy / "checkpoints" / str(latest)))
    before = tree_digest(copy)
    restored = restored_model.restore(str(copy))
    assert restored.step < latest
    assert f"skipping the checkpoint at step {latest}: damaged" in capfd.readouterr().err
    assert tree_digest(copy) == before


# -- the commands --------------------------------------------------------------------------------------


def _damaged_copy(run: Path, target: Path) -> tuple[Path, int, int]:
    """A copy of a trained run whose latest step has flipped bytes: (copy, damaged step, good step)."""
    shutil.copytree(run, target)
    steps = sorted(int(p.name) for p in (target / "checkpoints").iterdir() if p.name.isdigit())
    _flip_bytes(_biggest_file(target / "checkpoints" / str(steps[-1])))
    return target, steps[-1], steps[-2]


def test_commands_fall_back_from_a_damaged_latest_step_and_refuse_a_named_one(trained_run, data_dir, tmp_path):
    run, _ = trained_run
    copy, bad, good = _damaged_copy(run, tmp_path / "run")
    before = tree_digest(copy)

    sampled = run_cli("sample", f"--model_dir={copy}", "--prompt=import ", "--max_new_tokens=4")
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert sampled.stdout.startswith(f"[step {good}]")
    assert f"skipping the checkpoint at step {bad}: damaged" in sampled.stderr
    assert "Traceback" not in sampled.stderr

    info = run_cli("checkpoint", "info", str(copy))
    assert info.returncode == 0, info.stderr[-2000:]
    assert f"checkpoint: {copy} step {good}" in info.stdout and f"step {bad}: damaged" in info.stdout

    named = run_cli_in_process("checkpoint", "info", str(copy), f"--step={bad}")  # refused up front
    assert named.returncode == 2 and "Traceback" not in named.stderr
    assert f"error: the checkpoint at step {bad}" in named.stderr and "damaged" in named.stderr

    evaluated = run_cli("eval", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{copy}'",
                        f"--gin.evaluate.output_dir='{tmp_path / 'eval'}'", "--gin.evaluate.every_checkpoint=True",
                        "--gin.evaluate.perplexity=@PerplexityEval()", "--gin.PerplexityEval.mixture_or_task_name="
                        "@lm_task()", "--gin.lm_task.name='damage_lm'", f"--gin.lm_task.data_dir='{data_dir}'",
                        "--gin.PerplexityEval.context_length=32", "--gin.PerplexityEval.stride=16",
                        "--gin.PerplexityEval.max_documents=2")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert f"skipping the checkpoint at step {bad}: damaged" in evaluated.stdout + evaluated.stderr
    assert sorted(p.name for p in (tmp_path / "eval").glob("step_*.json")) == [f"step_{good}.json"]

    verified = run_cli("checkpoint", "verify", str(copy))
    assert verified.returncode == verify.EXIT_DAMAGE_FOUND
    assert f"step {good}: good" in verified.stdout and f"step {bad}: damaged" in verified.stdout
    assert tree_digest(copy) == before


def test_verify_exits_zero_on_a_whole_directory_and_two_on_a_missing_one(trained_run, tmp_path):
    run, _ = trained_run
    result = run_cli("checkpoint", "verify", str(run))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "none damaged or incomplete" in result.stdout
    missing = run_cli_in_process("checkpoint", "verify", str(tmp_path / "nothing"))  # refused up front
    assert missing.returncode == 2 and "error: no checkpoint in" in missing.stderr and "Traceback" not in missing.stderr


def test_every_command_that_reads_leaves_a_running_trainers_save_alone(trained_run, tmp_path):
    """A trained run's copy with a save in flight (Orbax's temporary directory) and a live trainer's
    lease (held by this test process): each reading command leaves every file as it was."""
    from t5x_lite.checkpoints import lease as lease_lib

    run, _ = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    latest = max(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
    in_flight = copy / "checkpoints" / f"{latest + 10}{checkpoint_lib.TMP_MARKER}"
    shutil.copytree(copy / "checkpoints" / str(latest), in_flight)
    (in_flight / manifest.MANIFEST).unlink()
    with lease_lib.Lease.acquire(str(copy)):
        before = tree_digest(copy)
        info = run_cli("checkpoint", "info", str(copy))
        assert info.returncode == 0, info.stderr[-2000:]
        assert f"step {latest + 10}: in progress (being written by pid {os.getpid()}" in info.stdout
        sampled = run_cli("sample", f"--model_dir={copy}", "--prompt=import ", "--max_new_tokens=4")
        assert sampled.returncode == 0 and sampled.stdout.startswith(f"[step {latest}]"), sampled.stderr[-2000:]
        converted = run_cli("convert", "to-hf", f"--checkpoint={copy}", f"--out={tmp_path / 'hf'}")
        assert converted.returncode == 0, converted.stderr[-2000:]
        assert tree_digest(copy) == before
    assert not (copy / lease_lib.LEASE_FILE).exists()
