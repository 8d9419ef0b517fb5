"""`t5x-lite eval` and `infer` as 2 real processes (gloo, 2 host devices each): each process
computes half of the rows, and the results are the single-process run's.

eval runs one SPMD program over the 4 devices of both processes (each batch's rows split
between them); infer gives each process its own chunks of prompts, decoded on its own devices.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli, run_processes
from tests.evaluation.model_dirs import random_decoder_dir
from tests.parallel.test_distributed import free_port

PROCESS_LINE = re.compile(r"process (\d): (?:step \d+: )?computed (\d+) rows in (\d+) batches on (.+)")


def _two_processes(tmp_path: Path, name: str, *args: str) -> list[str]:
    """Runs `t5x-lite ARGS` as processes 0 and 1 of one run, 2 host devices each; returns their stdout."""
    logs = tmp_path / name
    logs.mkdir()
    results = run_processes(["-m", "t5x_lite.cli", *args], logs, devices=2, port=free_port())
    for i, (code, stdout, stderr) in enumerate(results):
        assert code == 0, (i, stdout, stderr[-3000:])
    return [stdout for _, stdout, _ in results]


def _shares(outputs: list[str]) -> list[tuple[int, int]]:
    """(rows, batches) each process says it computed."""
    shares = []
    for i, stdout in enumerate(outputs):
        [match] = [m for m in map(PROCESS_LINE.match, stdout.splitlines()) if m]
        assert int(match.group(1)) == i, stdout
        shares.append((int(match.group(2)), int(match.group(3))))
    return shares


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, data_dir):
    return random_decoder_dir(tmp_path_factory.mktemp("two_process") / "run", data_dir)


def test_eval_over_two_processes_splits_every_batch_and_matches_one_process(model_dir, data_dir, tmp_path):
    choices = tmp_path / "choices.jsonl"
    choices.write_text("".join(json.dumps({"context": f"def f{i}(x):", "label": i % 3,
                                           "endings": ["return x", "pass", "import os"]}) + "\n" for i in range(6)))
    args = ["eval", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{model_dir}'",
            "--gin.evaluate.perplexity=@PerplexityEval()", "--gin.PerplexityEval.mixture_or_task_name=@lm_task()",
            "--gin.lm_task.name='two_process_lm'", f"--gin.lm_task.data_dir='{data_dir}'",
            "--gin.PerplexityEval.max_documents=4", "--gin.PerplexityEval.context_length=64",
            "--gin.PerplexityEval.stride=32", "--gin.PerplexityEval.batch_size=8",
            "--gin.evaluate.multiple_choice=[@hellaswag/MultipleChoiceEval()]",
            f"--gin.hellaswag/MultipleChoiceEval.path='{choices}'"]
    single = run_cli(*args, f"--gin.evaluate.output_dir='{tmp_path / 'one'}'", devices=4)
    assert single.returncode == 0, single.stderr[-3000:]
    outputs = _two_processes(tmp_path, "eval", *args, f"--gin.evaluate.output_dir='{tmp_path / 'two'}'")
    one = json.loads((tmp_path / "one" / "step_5.json").read_text())
    two = json.loads((tmp_path / "two" / "step_5.json").read_text())
    assert two["perplexity"]["tokens"] == one["perplexity"]["tokens"] > 1000
    assert two["perplexity"]["loss"] == pytest.approx(one["perplexity"]["loss"], rel=1e-6)
    assert two["hellaswag"] == one["hellaswag"]
    # Half of every batch each: the windows and the 18 (context, ending) rows, split evenly.
    shares = _shares(outputs)
    rows = [r for r, _ in shares]
    assert sum(rows) == one["perplexity"]["windows"] + 18
    assert abs(rows[0] - rows[1]) <= 8, rows  # at most the padding of the two passes' last batches
    assert shares[0][1] == shares[1][1]  # every batch is one program over both processes
    assert "replica" not in outputs[0] and "data 4 over 4 devices" in outputs[0]


def test_infer_over_two_processes_each_decodes_its_own_chunks(model_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(16)))
    args = ["infer", "--gin_file=runs/infer.gin", f"--gin.MODEL_DIR='{model_dir}'", f"--gin.PROMPTS='{prompts}'",
            "--gin.infer.chunk_size=4", "--gin.infer.batch_size=2", "--gin.DecodingConfig.max_decode_length=6"]
    single = run_cli(*args, f"--gin.OUTPUT='{tmp_path / 'one.jsonl'}'", devices=2)
    assert single.returncode == 0, single.stderr[-3000:]
    outputs = _two_processes(tmp_path, "infer", *args, f"--gin.OUTPUT='{tmp_path / 'two.jsonl'}'")
    assert (tmp_path / "two.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()
    assert len((tmp_path / "one.jsonl").read_text().splitlines()) == 16
    # Chunks 0 and 2 to process 0, 1 and 3 to process 1: 8 prompts in 4 batches each.
    assert _shares(outputs) == [(8, 4), (8, 4)]
    assert "data 2 over 2 devices" in outputs[0]
