"""docs/from_t5x.md's rewritten t5x README commands, run as the page writes them, on a tiny T5.

The task module and the four commands (pre-train, fine-tune, eval, infer) are read from the
page's marked code blocks; only the model file, its vocabulary and the lengths and step counts
are made tiny by flags appended after the page's own (gin applies the later flag).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import sentencepiece

from tests.cli_helpers import ROOT, run_cli

DOC = ROOT / "docs" / "from_t5x.md"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
TINY = ["--gin.T5Config.vocab_size=512", "--gin.T5Config.emb_dim=32", "--gin.T5Config.mlp_dim=64",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}"]


def doc_block(name: str) -> str:
    """The code block right after `<!-- from_t5x:NAME -->` in docs/from_t5x.md."""
    found = re.search(rf"<!-- from_t5x:{re.escape(name)} -->\n```\w*\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert found, f"docs/from_t5x.md has no block marked from_t5x:{name}"
    return found.group(1)


def doc_command(name: str, variables: dict[str, str]) -> list[str]:
    """The page's command as argv after `t5x-lite`, its ${VARIABLES} filled in."""
    text = doc_block(name).replace("\\\n", " ")
    for key, value in variables.items():
        text = text.replace("${" + key + "}", value)
    assert "${" not in text, text
    argv = shlex.split(text)
    assert argv[0] == "t5x-lite"
    return [a.replace("models/t5_base.gin", "models/t5_tiny.gin") for a in argv[1:]]


def write_pairs(folder: Path) -> None:
    """Word lists and their reversals: a text-to-text task with train, validation and test splits."""
    folder.mkdir()
    for split, count, offset in (("train", 64, 0), ("validation", 8, 3), ("test", 6, 5)):
        lines = []
        for i in range(count):
            words = [WORDS[(i * 7 + j * 3 + offset) % len(WORDS)] for j in range(2 + i % 3)]
            lines.append(f"{' '.join(words)}\t{' '.join(reversed(words))}\n")
        (folder / f"{split}.tsv").write_text("".join(lines))


@pytest.mark.subprocess
def test_t5x_readme_commands_rewritten_run_as_documented(data_dir, tmp_path):
    write_pairs(tmp_path / "pairs")
    module = doc_block("my_tasks.py").replace("data/python_stdlib/spm.model", str(data_dir / "spm.model"))
    (tmp_path / "my_tasks.py").write_text(module.replace('"pairs/', f'"{tmp_path}/pairs/'))
    run = {"extra_pythonpath": str(tmp_path)}
    pretrained, finetuned = tmp_path / "pretrained", tmp_path / "finetuned"

    pretrain = run_cli(*doc_command("pretrain", {"MODEL_DIR": str(pretrained)}), *TINY,
                       "--gin.TRAIN_STEPS=12", "--gin.BATCH_SIZE=8", "--gin.train.eval_batches=1", **run)
    assert pretrain.returncode == 0, pretrain.stderr[-3000:]
    # No mesh file: the default mesh, and the start-up line says why.
    assert "data parallel, chosen as no mesh file was given" in pretrain.stdout, pretrain.stdout
    metadata = json.loads((pretrained / "checkpoints" / "12" / "metadata" / "metadata").read_text())
    assert metadata["sequence_length"] == 16 and metadata["family"] == "encoder_decoder"
    assert "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 16}" in (pretrained / "config.gin").read_text()

    step_dir = pretrained / "checkpoints" / "12"
    finetune = run_cli(*doc_command("finetune", {"INITIAL_CHECKPOINT_PATH": str(step_dir),
                                                 "FINETUNE_MODEL_DIR": str(finetuned)}),
                       *TINY, "--gin.TRAIN_STEPS=4", "--gin.BATCH_SIZE=8", "--gin.train.eval_batches=1",
                       "--gin.train.log_period=1", **run)
    assert finetune.returncode == 0, finetune.stderr[-3000:]
    assert f"starting from train.init_from ({step_dir})" in finetune.stdout
    assert (finetuned / "checkpoints" / "4").is_dir()

    eval_out = tmp_path / "eval_out"
    evaluated = run_cli(*doc_command("eval", {"CHECKPOINT_PATH": str(step_dir), "EVAL_OUTPUT_DIR": str(eval_out)}),
                        "--gin.DecodingConfig.max_decode_length=16", **run)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    results = json.loads((eval_out / "step_12.json").read_text())
    assert 0 <= results["seqio"]["my_pairs"]["accuracy"] <= 100
    logged = (eval_out / "seqio" / "my_pairs-000012.jsonl").read_text().splitlines()
    assert len(logged) == 6  # the test split, as t5x's eval.gin reads by default

    infer_out = tmp_path / "infer_out"
    inferred = run_cli(*doc_command("infer", {"CHECKPOINT_PATH": str(finetuned), "INFER_OUTPUT_DIR": str(infer_out)}),
                       "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 5}", **run)
    assert inferred.returncode == 0, inferred.stderr[-3000:]
    lines = [json.loads(line) for line in (infer_out / "my_pairs.jsonl").read_text().splitlines()]
    test_split = (tmp_path / "pairs" / "test.tsv").read_text().splitlines()
    assert [line["inputs"] for line in lines] == [pair.split("\t")[0] for pair in test_split]
    # TASK_FEATURE_LENGTHS' 'targets' caps each output, as t5x's infer does.
    vocabulary = sentencepiece.SentencePieceProcessor(model_file=str(data_dir / "spm.model"))
    assert max(len(vocabulary.encode(line["output"])) for line in lines) <= 5
