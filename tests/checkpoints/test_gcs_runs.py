"""A run whose data and MODEL_DIR are on gs://, through the CLI, against a real GCS emulator
(tests/gcs_emulator.py): killed with SIGKILL and resumed bitwise exactly while a second trainer
races it for the directory; then eval, sample and `checkpoint verify` read the run from gs://.
Orbax writes the arrays through its own GCS path (TensorStore), pointed at the emulator."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from t5x_lite import storage
from tests.checkpoints.test_checkpoint_runs import COMMON, STEPS
from tests.cli.test_cli_run import assert_trees_equal, final_params
from tests.cli_helpers import ROOT, TINY_MODEL, cli_env, losses, run_cli_in_process, start_cli, train
from tests.gcs_emulator import BUCKET


def _upload(local_dir, remote: str) -> str:
    for path in sorted(local_dir.rglob("*")):
        if path.is_file():
            storage.copy(str(path), f"{remote}/{path.relative_to(local_dir).as_posix()}")
    return remote


def _train_args(data: str, model_dir: str) -> list[str]:
    return ["train", "--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data}'", f"--gin.MODEL_DIR='{model_dir}'",
            *TINY_MODEL, *COMMON]


def test_a_run_on_gcs_resumes_bitwise_after_sigkill_and_one_trainer_wins(gcs_server, data_dir, tmp_path):
    data = _upload(data_dir, f"gs://{BUCKET}/data")
    straight = train(data, f"gs://{BUCKET}/straight", *COMMON)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "data: read by index" in straight.stdout

    run = f"gs://{BUCKET}/interrupted"
    killed = start_cli(*_train_args(data, run))
    for line in killed.stdout:
        if line.startswith("step 5: loss="):  # after the committed checkpoint of step 4 (or during it)
            killed.send_signal(signal.SIGKILL)
            break
    assert killed.wait(timeout=120) == -signal.SIGKILL
    committed = [int(s) for s in storage.listdir(f"{run}/checkpoints") if s.isdigit()]
    assert committed, "no checkpoint reached gs:// before the kill"

    # On an object store a killed holder's lease stays live until its ttl runs out: a restart
    # within it is refused in one line, naming the unlock command, which removes it.
    refused = run_cli_in_process(*_train_args(data, run))
    assert refused.returncode == 2 and f"checkpoint unlock {run} --force" in refused.stderr, refused.stderr[-2000:]
    unlocked = run_cli_in_process("checkpoint", "unlock", run, "--force")
    assert unlocked.returncode == 0, unlocked.stderr[-2000:]

    # Two trainers started at once: exactly one takes the lease (a generation precondition
    # decides), the other stops in one line.
    racers = [subprocess.Popen([sys.executable, "-m", "t5x_lite.cli", *_train_args(data, run)], cwd=ROOT,
                               env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in racers]
    winners = [r for r in results if r[0] == 0]
    losers = [r for r in results if r[0] != 0]
    assert len(winners) == 1 and len(losers) == 1, [(c, e[-1500:]) for c, _, e in results]
    code, _, err = losers[0]
    assert code == 2 and re.search(rf"error: {run} (is in use by another run|holds the lease)", err), err[-2000:]
    assert "Traceback" not in err
    assert re.search(r"Resuming from the checkpoint at step \d+", winners[0][1])

    step_a, params_a = final_params(f"gs://{BUCKET}/straight")
    step_b, params_b = final_params(run)
    assert step_a == step_b == STEPS
    assert_trees_equal(params_a, params_b)
    assert losses(straight.stdout)[-1] == losses(winners[0][1])[-1]
    assert storage.glob(f"{run}/tb/train/events.out.tfevents.*")  # written locally, copied up
    assert storage.exists(f"{run}/config.gin") and storage.exists(f"{run}/vocab/spm.model")

    verified = run_cli_in_process("checkpoint", "verify", run)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"step {STEPS}" in verified.stdout

    evaluated = run_cli_in_process("eval", "--gin_file=runs/quickstart_eval.gin", f"--gin.DATA_DIR='{data}'",
                                   f"--gin.MODEL_DIR='{run}'", "--gin.PerplexityEval.context_length=32",
                                   "--gin.PerplexityEval.stride=16", "--gin.PerplexityEval.max_documents=2",
                                   f"--gin.evaluate.output_dir='{run}/eval'")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert re.search(r"validation perplexity [0-9.]+", evaluated.stdout)
    with storage.open(f"{run}/eval/step_{STEPS}.json", "r") as f:
        assert json.load(f)["step"] == STEPS

    sampled = run_cli_in_process("sample", f"--model_dir={run}", "--prompt=def ", "--max_new_tokens=4",
                                 "--temperature=0")
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert sampled.stdout.strip()

    prompts = f"gs://{BUCKET}/prompts.jsonl"
    storage.write_whole(prompts, '{"prompt": "def "}\n{"prompt": "class "}\n')
    inferred = run_cli_in_process("infer", "--gin_file=runs/infer.gin", f"--gin.MODEL_DIR='{run}'",
                                  f"--gin.PROMPTS='{prompts}'", f"--gin.OUTPUT='{run}/outputs.jsonl'",
                                  "--gin.DecodingConfig.max_decode_length=4")
    assert inferred.returncode == 0, inferred.stderr[-3000:]
    with storage.open(f"{run}/outputs.jsonl", "r") as f:
        assert [json.loads(line)["prompt"] for line in f] == ["def ", "class "]

    exported = run_cli_in_process("convert", "to-hf", f"--checkpoint={run}", f"--out={tmp_path / 'hf'}")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (tmp_path / "hf" / "config.json").is_file()
    back = f"gs://{BUCKET}/from-hf"  # and back into a model directory on gs://: the same parameters
    imported = run_cli_in_process("convert", "from-hf", f"--model_dir={tmp_path / 'hf'}", f"--out={back}")
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert_trees_equal(final_params(back)[1], params_b)
    assert os.environ["STORAGE_EMULATOR_HOST"]  # every read above went to the emulator
