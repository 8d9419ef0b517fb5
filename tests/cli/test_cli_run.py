"""Whole runs through the real CLI in subprocesses, on a tiny corpus prepared by the test."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import types
from pathlib import Path

import numpy as np

from t5x_lite.checkpoints import restored_model
from tests.cli_helpers import TINY_MODEL, losses, run_cli, train


def final_params(model_dir: Path) -> dict:
    restored = restored_model.restore(str(model_dir))
    return restored.step, restored.params


def assert_trees_equal(a, b) -> None:
    import jax

    flat_a, tree_a = jax.tree.flatten(a)
    flat_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(flat_a, flat_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_train_loss_falls_and_sample(trained_run):
    """The main run (tests/conftest.py): 40 steps, evaluations at 20 and 40 with multiple choice
    and samples, a profile of steps 5-7; then `t5x-lite sample` from its directory."""
    run, stdout = trained_run
    result = types.SimpleNamespace(stdout=stdout)
    seen = losses(result.stdout)
    assert len(seen) == 8
    assert seen[-1] < seen[0] - 0.5, seen
    assert "validation loss" in result.stdout and "perplexity" in result.stdout
    assert "initial loss" in result.stdout
    assert (run / "config.gin").read_text().count("DecoderConfig.emb_dim = 64") == 1
    checkpoints = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    assert checkpoints == [30, 40]  # the last keep_last=2 of 10, 20, 30, 40
    assert list((run / "tb" / "train").glob("events.out.tfevents.*"))
    assert list((run / "tb" / "eval").glob("events.out.tfevents.*"))
    for step in (20, 40):  # at each evaluation: validation loss, multiple choice, samples
        assert f"step {step}: validation loss" in result.stdout
        assert re.search(rf"step {step}: hellaswag acc [01]\.\d+, acc_norm [01]\.\d+ \(6 examples\)", result.stdout)
        assert re.search(rf"step {step} samples \(t5x-lite sample --step={step} --seed=\d+ [^\n]*\):\n--- 'def '\ndef",
                         result.stdout)
        assert "--- 'class '\nclass" in result.stdout
    assert list((run / "tb" / "hellaswag").glob("events.out.tfevents.*"))
    # The profile: TensorBoard's layout, the steps 5 to 7 annotated, and the jitted train step in them.
    assert f"profile: trace of steps 5-7 written to {run / 'profile' / 'process_0'}" in result.stdout
    traces = list((run / "profile" / "process_0" / "plugins" / "profile").glob("*/*.trace.json.gz"))
    assert len(traces) == 1 and traces[0].with_name(traces[0].name.replace(".trace.json.gz", ".xplane.pb")).exists()
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    assert sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train") == [5, 6, 7]
    assert any(e.get("name") == "PjitFunction(_train_step_fn)" for e in events)

    sampled = run_cli("sample", f"--model_dir={run}", "--prompt=import ", "--max_new_tokens=8")
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert sampled.stdout.startswith("[step 40]\nimport")


def test_training_samples_are_what_the_sample_command_prints(trained_run):
    """The samples printed at step 40 name the `t5x-lite sample` command that prints them again
    from the step-40 checkpoint: one code path, one set of settings."""
    run, stdout = trained_run
    header, _, rest = stdout.partition("step 40 samples (")
    command, _, rest = rest.partition(" prints the same):\n")
    printed = rest.split("\nstep ")[0].rstrip("\n")
    assert printed.startswith("--- 'def '\n"), printed
    args = shlex.split(command)
    assert args[:2] == ["t5x-lite", "sample"], command
    sampled = run_cli("sample", f"--model_dir={run}", *args[2:])
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert sampled.stdout.strip("\n") == "[step 40]\n" + printed


def test_epochs_end_the_run_at_the_end_of_the_last_epoch(small_data_dir, tmp_path):
    """An epoch limit with eval and checkpoint periods given in epochs."""
    import re

    result = train(small_data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=None", "--gin.NUM_EPOCHS=2",
                   "--gin.train.log_period=1000", "--gin.train.eval_period='1 epoch'",
                   "--gin.train.checkpoint_period='1 epoch'", "--gin.train.eval_batches=2")
    assert result.returncode == 0, result.stderr[-3000:]
    per_epoch = int(re.search(r"data: read by index: (\d+) steps per epoch", result.stdout).group(1))
    ends = [int(m) for m in re.findall(r"epoch \d finished at step (\d+): [\d,]+ rows \([\d,]+ tokens\) read",
                                       result.stdout)]
    assert ends[0] == per_epoch and len(ends) == 2
    evals = [int(m) for m in re.findall(r"step (\d+): validation loss", result.stdout)]
    assert evals == ends, "one evaluation at the end of each epoch, none more"
    saved = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == ends


def test_user_task_module_and_search_paths(data_dir, tmp_path):
    """A task registered in the user's own module, named by flag; a gin file found by search path."""
    (tmp_path / "my_tasks.py").write_text(
        "from t5x_lite.data.tasks import lm\n"
        f"lm.register_lm_task('my_own_task', {str(data_dir)!r})\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "short.gin").write_text("TRAIN_STEPS = 3\n")
    result = run_cli("train", "--gin_file=runs/quickstart.gin", "--gin_file=short.gin",
                     f"--gin_search_paths={tmp_path / 'configs'}", *TINY_MODEL,
                     f"--gin.MODEL_DIR='{tmp_path / 'run'}'", "--gin.MIXTURE_OR_TASK_MODULE='my_tasks'",
                     "--gin.MIXTURE_OR_TASK_NAME='my_own_task'", extra_pythonpath=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    config = (tmp_path / "run" / "config.gin").read_text()
    assert "'my_own_task'" in config
    assert (tmp_path / "run" / "checkpoints" / "3").is_dir()
