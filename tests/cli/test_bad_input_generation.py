"""Bad options of the commands that generate (sample, infer, lm-eval): one line, exit 2, nothing written.

sample's and infer's options are refused before the model is restored, so those run through the
CLI's `main` in this process; lm-eval's tasks are looked up by lm-eval itself, in a subprocess."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_bad_input import assert_bad_input, tree_digest
from tests.cli_helpers import run_cli, run_cli_in_process, unwritable_directory


@pytest.mark.parametrize("flag, message", [
    ("--max_new_tokens=-1", "--max_new_tokens=-1 must be at least 1"),
    ("--max_new_tokens=0", "--max_new_tokens=0 must be at least 1"),
    ("--temperature=-1", "--temperature=-1.0 must be >= 0 (0 means greedy)"),
    ("--top_k=-5", "--top_k=-5 must be >= 0"),
    ("--top_p=0", "--top_p=0.0 must be in (0, 1]"),
    ("--top_p=1.5", "--top_p=1.5 must be in (0, 1]"),
])
def test_sample_refuses_a_bad_option_in_one_line(trained_run, flag, message):
    result = run_cli_in_process("sample", f"--model_dir={trained_run[0]}", "--prompt=def ", flag)
    assert_bad_input(result, f"error: {message}")
    assert result.stdout == ""  # refused before anything was generated or printed


def test_sample_with_a_huge_max_new_tokens_stops_at_the_context(trained_run):
    """Generation stops when max_len (64) is full: a billion new tokens asked for prints what 64 does,
    with nothing sized by the billion."""
    outputs = [run_cli_in_process("sample", f"--model_dir={trained_run[0]}", "--prompt=def ", "--temperature=0",
                                  f"--max_new_tokens={n}") for n in (1_000_000_000, 64)]
    assert [result.returncode for result in outputs] == [0, 0], outputs[0].stderr[-3000:]
    assert outputs[0].stdout == outputs[1].stdout
    assert len(outputs[0].stdout) > len("[step 40]\ndef ")


def _infer(model_dir, tmp_path, output, *flags: str):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def "}) + "\n")
    return run_cli_in_process("infer", "--gin_file=runs/infer.gin", f"--gin.MODEL_DIR='{model_dir}'",
                              f"--gin.PROMPTS='{prompts}'", f"--gin.OUTPUT='{output}'", *flags)


@pytest.mark.parametrize("flags, message", [
    (["--gin.DecodingConfig.method='sample'", "--gin.DecodingConfig.temperature=-1.0"],
     "DecodingConfig.temperature=-1.0 must be >= 0"),
    (["--gin.DecodingConfig.top_k=-1"], "DecodingConfig.top_k=-1 must be >= 0"),
    (["--gin.DecodingConfig.top_p=0.0"], "DecodingConfig.top_p=0.0 must be in (0, 1]"),
])
def test_infer_refuses_bad_sampling_settings_before_writing(trained_run, tmp_path, flags, message):
    (tmp_path / "out").mkdir()
    result = _infer(trained_run[0], tmp_path, tmp_path / "out" / "outputs.jsonl", *flags)
    assert_bad_input(result, f"error: {message}")
    assert not any((tmp_path / "out").iterdir())


def test_infer_into_an_unwritable_directory_is_one_line_before_decoding(trained_run, tmp_path):
    """Refused in one line before the model is restored (cli_helpers.unwritable_directory)."""
    with unwritable_directory(tmp_path / "locked") as locked:
        result = _infer(trained_run[0], tmp_path, locked / "outputs.jsonl")
        assert_bad_input(result, f"error: '{locked}', where OUTPUT '{locked}/outputs.jsonl' is written, is not "
                                 "writable by this user", "choose an OUTPUT (or INFER_OUTPUT_DIR) you can write to")
        assert "decoding on" not in result.stdout  # refused before the model was restored
        assert tree_digest(locked) == {}


def test_lm_eval_with_an_unknown_task_names_it_and_how_to_list_tasks(trained_run, tmp_path):
    result = run_cli("lm-eval", "--model_args", f"model_dir={trained_run[0]}", "--tasks", "no_such_task",
                     "--output_path", str(tmp_path / "out"),
                     extra_env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert_bad_input(result, "error: lm-eval has no task no_such_task: `t5x-lite lm-eval ls tasks` lists them")
    assert not (tmp_path / "out").exists()
