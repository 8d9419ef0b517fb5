"""A step directory with neither manifest.json nor the Orbax metadata a reader starts from (a copy
that was interrupted) is `incomplete` for every command, by one rule (manifest.check): readers fall
back to the step before it with one warning, a command naming it stops in one line, and
`checkpoint verify` counts it as damage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.checkpoints import manifest, verify
from tests.cli.test_bad_input import assert_bad_input, tree_digest
from tests.cli_helpers import run_cli_in_process


@pytest.fixture
def interrupted_copy(trained_run, tmp_path) -> tuple[Path, int, int]:
    """(a copy of the trained run, its newest step, a newer step whose copy was interrupted: the
    newest step's files without its manifest and Orbax's metadata)."""
    copy = tmp_path / "run"
    shutil.copytree(trained_run[0], copy)
    good = max(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
    bad = good + 10
    step_dir = copy / "checkpoints" / str(bad)
    shutil.copytree(copy / "checkpoints" / str(good), step_dir)
    for name in (manifest.MANIFEST, "_CHECKPOINT_METADATA", *manifest.READER_METADATA):
        (step_dir / name).unlink()
    return copy, good, bad


@pytest.mark.parametrize("removed", [manifest.READER_METADATA, manifest.READER_METADATA[:1],
                                     manifest.READER_METADATA[1:]])
def test_a_step_without_manifest_or_reader_metadata_is_incomplete(trained_run, tmp_path, removed):
    copy = tmp_path / "run"
    shutil.copytree(trained_run[0], copy)
    good = max(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
    step_dir = copy / "checkpoints" / str(good)
    (step_dir / manifest.MANIFEST).unlink()
    saved = json.loads((step_dir / "metadata" / "metadata").read_text())
    saved.pop("manifest")  # as before manifests existed: unverified while its metadata is there
    (step_dir / "metadata" / "metadata").write_text(json.dumps(saved))
    assert manifest.check(str(step_dir), step=good).state == manifest.UNVERIFIED
    for name in removed:
        (step_dir / name).unlink()
    state = manifest.check(str(step_dir), step=good)
    assert state.state == manifest.INCOMPLETE and not state.readable and not state.manifest_due
    assert state.reason.startswith(f"no manifest.json and no {removed[0]}: a copy or save of the step was interrupted")


def test_checkpoint_info_falls_back_to_the_step_before_with_one_warning(interrupted_copy):
    copy, good, bad = interrupted_copy
    before = tree_digest(copy)
    result = run_cli_in_process("checkpoint", "info", str(copy))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stdout.startswith(f"checkpoint: {copy} step {good}\n")
    assert f"  step {bad}: incomplete (no manifest.json and no metadata/metadata" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and warnings[0].startswith(f"WARNING: skipping the checkpoint at step {bad}: incomplete")
    assert warnings[0].endswith(f"using step {good}.")
    assert tree_digest(copy) == before


def test_eval_of_the_latest_falls_back_with_one_warning(interrupted_copy, tmp_path):
    copy, good, bad = interrupted_copy
    choices = tmp_path / "choices.jsonl"
    choices.write_text("".join(json.dumps({"context": "def f(x):", "label": 0, "endings": ["return x", "pass"]}) + "\n"
                               for _ in range(2)))
    result = run_cli_in_process("eval", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{copy}'",
                                f"--gin.evaluate.output_dir='{tmp_path / 'eval'}'",
                                "--gin.evaluate.multiple_choice=[@MultipleChoiceEval()]",
                                f"--gin.MultipleChoiceEval.path='{choices}'")
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and f"skipping the checkpoint at step {bad}: incomplete" in warnings[0], warnings
    assert sorted(p.name for p in (tmp_path / "eval").glob("step_*.json")) == [f"step_{good}.json"]


def _named_step_commands(copy: Path, bad: int, tmp_path: Path) -> dict[str, tuple[str, ...]]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def "}) + "\n")
    choices = tmp_path / "choices.jsonl"
    choices.write_text(json.dumps({"context": "def f(x):", "label": 0, "endings": ["return x", "pass"]}) + "\n")
    return {
        "info --step": ("checkpoint", "info", str(copy), f"--step={bad}"),
        "info of the step directory": ("checkpoint", "info", str(copy / "checkpoints" / str(bad))),
        "sample --step": ("sample", f"--model_dir={copy}", f"--step={bad}", "--prompt=def ", "--max_new_tokens=2"),
        "infer.step": ("infer", "--gin_file=runs/infer.gin", f"--gin.MODEL_DIR='{copy}'", f"--gin.PROMPTS='{prompts}'",
                       f"--gin.OUTPUT='{tmp_path / 'out.jsonl'}'", f"--gin.infer.step={bad}"),
        "evaluate.step": ("eval", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{copy}'", f"--gin.evaluate.step={bad}",
                          f"--gin.evaluate.output_dir='{tmp_path / 'eval'}'",
                          "--gin.evaluate.multiple_choice=[@MultipleChoiceEval()]",
                          f"--gin.MultipleChoiceEval.path='{choices}'"),
    }


@pytest.mark.parametrize("command", ["info --step", "info of the step directory", "sample --step", "infer.step",
                                     "evaluate.step"])
def test_a_command_naming_the_step_stops_in_one_line(interrupted_copy, tmp_path, command):
    copy, _, bad = interrupted_copy
    before = tree_digest(copy)
    result = run_cli_in_process(*_named_step_commands(copy, bad, tmp_path)[command])
    assert_bad_input(result, f"step {bad}", "incomplete", "a copy or save of the step was interrupted",
                     "checkpoint verify")
    assert tree_digest(copy) == before


def test_verify_reports_the_step_as_incomplete_and_exits_one(interrupted_copy):
    copy, good, bad = interrupted_copy
    result = run_cli_in_process("checkpoint", "verify", str(copy))
    assert result.returncode == verify.EXIT_DAMAGE_FOUND, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert f"step {good}: good" in lines
    assert any(line.startswith(f"step {bad}: incomplete (no manifest.json") for line in lines), lines
    assert lines[-1].endswith("1 damaged or incomplete")


def test_train_stops_on_an_interrupted_copy_and_moves_nothing(tmp_path):
    """Only a run killed before its manifest was written starts afresh; a step whose copy was
    interrupted is not that, so the trainer stops rather than move it aside and start from step 0."""
    state = {"w": jnp.ones((8, 8), jnp.float32)}
    saver = checkpoint_lib.Checkpointer(tmp_path)
    saver.save(1, state=state, iterator_state={}, metadata={})
    saver.close()
    for name in (manifest.MANIFEST, *manifest.READER_METADATA):
        (tmp_path / "checkpoints" / "1" / name).unlink()
    before = tree_digest(tmp_path)
    trainer = checkpoint_lib.Checkpointer(tmp_path)
    with pytest.raises(checkpoint_lib.NoUsableCheckpointError, match="step 1: incomplete .no manifest.json"):
        trainer.restore_latest_good(abstract_state=jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                                                state), check=lambda metadata: None, warn=print)
    trainer.close()
    assert tree_digest(tmp_path) == before
