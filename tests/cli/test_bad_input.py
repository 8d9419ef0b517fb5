"""Bad input: one clear message naming the problem and the fix, exit 2, nothing touched.

What a run refuses before any work is checked through the CLI's `main` in this process
(`train_in_process`); what needs a real process (start-up output, signals, the device count
a user gets, errors met while reading data) runs the CLI in a subprocess."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.cli_helpers import (TINY_MODEL, VALIDATION_FRACTION, run_cli, run_cli_in_process, start_cli, train,
                               train_in_process)

# What TensorFlow printed on every start of a CPU machine, whatever TF_CPP_MIN_LOG_LEVEL said.
STARTUP_NOISE = ("Could not find cuda drivers", "failed call to cuInit",
                 "All log messages before absl::InitializeLog()", "oneDNN custom operations",
                 "Local rendezvous is aborting")


def assert_bad_input(result, *phrases: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, result.stderr[-3000:]
    for phrase in phrases:
        assert phrase in result.stderr, (phrase, result.stderr[-3000:])


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_quiet(stderr: str) -> None:
    for line in STARTUP_NOISE:
        assert line not in stderr, stderr[-3000:]


def copy_of_trained_run(trained_run, tmp_path) -> tuple[Path, dict[str, str], int]:
    """A copy of the tiny trained run to point a bad command at: (directory, digest, config.gin's mtime)."""
    model_dir = tmp_path / "run"
    shutil.copytree(trained_run[0], model_dir)
    return model_dir, tree_digest(model_dir), (model_dir / "config.gin").stat().st_mtime_ns


def assert_untouched(model_dir: Path, digest: dict[str, str], config_mtime: int) -> None:
    """Nothing written or lost: the same files with the same bytes (no TensorBoard file added), and
    config.gin not even rewritten."""
    assert tree_digest(model_dir) == digest
    assert (model_dir / "config.gin").stat().st_mtime_ns == config_mtime


def test_missing_data_dir(tmp_path):
    result = train_in_process(tmp_path / "nowhere", tmp_path / "run", "--gin.TRAIN_STEPS=2")
    assert_bad_input(result, "has no metadata.json", "t5x-lite prepare")
    assert not (tmp_path / "run").exists()


def test_empty_data_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    result = train_in_process(tmp_path / "empty", tmp_path / "run", "--gin.TRAIN_STEPS=2")
    assert_bad_input(result, "has no metadata.json", "t5x-lite prepare")


def test_vocabulary_size_disagrees_with_model(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2", "--gin.DecoderConfig.vocab_size=300")
    assert_bad_input(result, "vocabulary has 512 entries", "--gin.DecoderConfig.vocab_size=512")
    assert not (tmp_path / "run").exists()
    assert_quiet(result.stderr)  # TensorFlow was loaded (the task's vocabulary): with TF_CPP_MIN_LOG_LEVEL=2


def test_unknown_gin_binding_suggests_the_name(data_dir, tmp_path):
    result = train_in_process(data_dir, tmp_path / "run", "--gin.DecoderConfig.num_layer=2")
    assert_bad_input(result, "num_layer", "Did you mean num_layers")


def test_unknown_configurable_suggests_the_name(data_dir, tmp_path):
    result = train_in_process(data_dir, tmp_path / "run", "--gin.DecoderConfg.num_layers=2")
    assert_bad_input(result, "DecoderConfg", "Did you mean DecoderConfig")


def test_gin_syntax_error_names_file_and_line(data_dir, tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text("TRAIN_STEPS = 3\nDecoderConfig.num_layers = = 2\n")
    result = train_in_process(data_dir, tmp_path / "run", f"--gin_file={bad}")
    assert_bad_input(result, "bad.gin, line 2")


def test_sequence_length_that_does_not_fit(data_dir, tmp_path):
    result = train_in_process(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2", "--gin.SEQUENCE_LENGTH=128")
    assert_bad_input(result, "sequence_length=128", "max_len=64")


def test_model_dir_with_a_different_model_is_left_untouched(data_dir, trained_run, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(trained_run[0], model_dir)
    before = tree_digest(model_dir)
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=12", "--gin.DecoderConfig.emb_dim=32")
    assert_bad_input(result, "holds checkpoints of a different model", "emb_dim: checkpoint 64 vs config 32",
                     "new --gin.MODEL_DIR")
    assert tree_digest(model_dir) == before
    # The same model with another optimizer state (no clipping): refused when the state is read,
    # and the directory's config.gin still describes the run whose checkpoints it holds.
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=12", "--gin.AdamW.clip_grad_norm=None")
    assert_bad_input(result, "Nothing was changed")
    assert tree_digest(model_dir) == before


def test_missing_steps_and_epochs(data_dir, tmp_path):
    result = train_in_process(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=None")
    assert_bad_input(result, "TRAIN_STEPS", "num_epochs")


def test_unknown_cli_command():
    result = run_cli("trian")
    assert result.returncode == 2
    assert "unknown command 'trian'" in result.stderr


def test_missing_split_lists_the_splits(data_dir, tmp_path):
    result = train_in_process(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2",
                              "--gin.eval/DataConfig.split='test'")
    assert_bad_input(result, "no split 'test'", "['train', 'validation']", "eval/DataConfig.split")
    assert not (tmp_path / "run").exists()


def test_bad_period_names_the_flag(data_dir, tmp_path):
    result = train_in_process(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2",
                              "--gin.train.eval_period='each epoch'")
    assert_bad_input(result, "train.eval_period='each epoch'", "'1 epoch'")
    assert not (tmp_path / "run").exists()


def test_malformed_jsonl_line_names_file_and_line(data_dir, tmp_path):
    """A text task in 'fail' mode: the bad line stops the run with one message, exit 2."""
    import json

    lines = [json.dumps({"text": f"def f{i}(x):\n    return x + {i}\n" * 20}) for i in range(40)]
    lines[2] = '{"text": "no closing quote}'
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    result = train(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2",
                   "--gin.MIXTURE_OR_TASK_NAME=@text_task()", "--gin.text_task.name='bad_jsonl'",
                   f"--gin.text_task.splits={{'train': '{corpus}', 'validation': '{corpus}'}}",
                   f"--gin.text_task.vocabulary='{data_dir}/spm.model'")
    assert_bad_input(result, f"{corpus}, line 3", "on_bad_line='skip'")


# ------------------------------------------------------------------ every bad value refused up front

@pytest.mark.parametrize("flags, phrases", [
    (["--gin.TRAIN_STEPS=-5"], ["error: TRAIN_STEPS=-5 must be a positive integer or None."]),
    (["--gin.TRAIN_STEPS='ten'"],
     ["error: TRAIN_STEPS='ten' must be a positive integer or None (a number, without quotes)."]),
    (["--gin.SEQUENCE_LENGTH=0"],
     ["error: train/DataConfig.sequence_length (SEQUENCE_LENGTH)=0 must be a positive integer."]),
    (["--gin.BATCH_SIZE=0"], ["error: train/DataConfig.batch_size (BATCH_SIZE)=0 must be a positive integer."]),
    (["--gin.DecoderConfig.dtype='float17'"],
     ["error: Unknown DecoderConfig.dtype 'float17'; choose one of ['float32', 'bfloat16', 'float16']."]),
    (["--gin.WarmupCosine.peak_learning_rate=-0.1", "--gin.WarmupCosine.warmup_steps=-1",
      "--gin.train.log_period=0", "--gin.train.eval_period=-1", "--gin.train.microbatches=0",
      "--gin.train.eval_batches=0"],
     ["error: 6 values are invalid: train.microbatches=0 must be a positive integer",
      "WarmupCosine.peak_learning_rate=-0.1 must be a number > 0",
      "WarmupCosine.warmup_steps=-1 must be an integer >= 0", "train.eval_period=-1 is not a period",
      "train.eval_batches=0 must be a positive integer or None", "train.log_period=0 must be a positive integer"]),
], ids=["negative_steps", "string_steps", "zero_sequence_length", "zero_batch_size", "unknown_dtype",
        "rates_periods_and_counts"])
def test_a_bad_value_is_refused_before_anything_is_written(data_dir, trained_run, tmp_path, flags, phrases):
    """Against a run's directory: nothing in it changes, not even config.gin's time."""
    model_dir, digest, config_mtime = copy_of_trained_run(trained_run, tmp_path)
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=80", *flags)
    assert_bad_input(result, *phrases)
    assert_untouched(model_dir, digest, config_mtime)


def test_a_data_position_saved_by_the_other_reader_is_refused(data_dir, trained_run, tmp_path):
    """The trained run read its data by index; streaming it (another order) cannot continue it, and
    a changed batch size changes the epochs: both refused, the directory untouched."""
    model_dir, digest, config_mtime = copy_of_trained_run(trained_run, tmp_path)
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=80", "--gin.train/DataConfig.reader='stream'")
    assert_bad_input(result, "saved by the index reader", "reader=\"'index'\"", "Nothing was changed")
    assert_untouched(model_dir, digest, config_mtime)
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=80", "--gin.BATCH_SIZE=32")
    assert_bad_input(result, "epochs of", "BATCH_SIZE the run was saved with", "Nothing was changed")
    assert_untouched(model_dir, digest, config_mtime)


def test_a_mesh_larger_than_the_devices_is_refused_before_anything_is_written(data_dir, trained_run, tmp_path):
    """The same in a process of one device, as a user's CPU run has."""
    model_dir, digest, config_mtime = copy_of_trained_run(trained_run, tmp_path)
    result = train(data_dir, model_dir, "--gin.TRAIN_STEPS=80", "--gin.MESH_AXES=[('data', 16)]")
    assert_bad_input(result, "error: Mesh axes {'data': 16} need 16 devices but 1 is available",
                     "set one axis to -1", "or run on 16 devices")
    assert_untouched(model_dir, digest, config_mtime)


def test_a_model_dir_below_a_file_is_refused(data_dir, tmp_path):
    (tmp_path / "file.txt").write_text("not a directory")
    result = train_in_process(data_dir, tmp_path / "file.txt" / "run", "--gin.TRAIN_STEPS=2")
    assert_bad_input(result, f"error: MODEL_DIR '{tmp_path}/file.txt/run' cannot be created: '{tmp_path}/file.txt' "
                             "is a file, not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_an_unreachable_s3_endpoint_is_named(data_dir, monkeypatch):
    """Nothing listens on port 9 of the loopback: the model directory's first access fails, up front."""
    import s3fs

    for key, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()  # no file system of another test's endpoint
    try:
        result = train_in_process(data_dir, "s3://t5x-lite-test/unreachable", "--gin.TRAIN_STEPS=2")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert_bad_input(result, "error: Cannot reach 's3://t5x-lite-test/unreachable': the S3 endpoint "
                             "http://127.0.0.1:9 does not answer", "AWS_ENDPOINT_URL")


def test_an_unclosed_bracket_in_a_gin_file_names_file_and_line(data_dir, tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text("TRAIN_STEPS = 3\nMESH_AXES = [('data', -1),\n  ('fsdp', 1)\n")  # the file ends inside [ ]
    result = train_in_process(data_dir, tmp_path / "run", f"--gin_file={bad}")
    assert_bad_input(result, f"error: Cannot parse {bad}, line 2: '[' opened here is never closed")
    assert not (tmp_path / "run").exists()


def test_a_damaged_tfrecord_is_named(data_dir, tmp_path):
    """Streamed with epochs planned (eval_period in epochs), so the whole split is read before anything is
    written. TF_CPP_MIN_LOG_LEVEL unset, as a user's shell has it: TensorFlow's start-up lines and its
    DATA_LOSS warning stay quiet all the same."""
    damaged = tmp_path / "data"
    shutil.copytree(data_dir, damaged)
    shard = damaged / "train-00001-of-00002.tfrecord"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF  # inside the first record's data
    shard.write_bytes(bytes(data))
    result = train(damaged, tmp_path / "run", "--gin.TRAIN_STEPS=2", "--gin.train.eval_period='1 epoch'",
                   "--gin.train/DataConfig.reader='stream'", extra_env={"TF_CPP_MIN_LOG_LEVEL": None})
    assert_bad_input(result, f"error: Reading split 'train' of 'python_stdlib_lm' failed: {shard} is damaged "
                             "(bad data checksum in the record at byte 0)", "t5x-lite prepare")
    assert_quiet(result.stderr)
    assert not (tmp_path / "run").exists()


def test_a_damaged_record_read_by_index_is_named(data_dir, tmp_path):
    """Read by index, the first batch is read before anything is written; a damaged record in it names
    its shard."""
    import json

    import numpy as np

    damaged = tmp_path / "data"
    shutil.copytree(data_dir, damaged)
    entry = json.loads((damaged / "metadata.json").read_text())["splits"]["train"]
    first_of_shard_1 = entry["index"]["records_per_shard"][0]
    index = np.load(damaged / entry["index"]["file"])
    shard = damaged / "train-00001-of-00002.tfrecord"
    data = bytearray(shard.read_bytes())
    for offset in index[first_of_shard_1:-1, 0]:  # every record of the shard: the first batch reads one
        data[offset + 12] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = train_in_process(damaged, tmp_path / "run", "--gin.TRAIN_STEPS=2")
    assert_bad_input(result, f"error: '{shard}': the record at byte", "is damaged", "prepare the data again")
    assert not (tmp_path / "run").exists()


def _signal_before_the_first_step(data_dir, model_dir, sig, *, after_line: str | None, after_seconds: float = 0):
    """Starts a run and sends it `sig` when it prints `after_line` (or `after_seconds` after its start)."""
    process = start_cli("train", "--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data_dir}'",
                        f"--gin.MODEL_DIR='{model_dir}'", *TINY_MODEL, "--gin.TRAIN_STEPS=1000")
    lines = []
    if after_line is None:
        time.sleep(after_seconds)
        process.send_signal(sig)
    for line in process.stdout:
        lines.append(line)
        if after_line is not None and line.startswith(after_line):
            process.send_signal(sig)
            break
    lines.extend(process.stdout)
    return process.wait(timeout=300), "".join(lines)


STOPPED_AT_START = ("before the first step: nothing was saved; run the same command again to start (or to resume "
                    "from the checkpoint the model directory already holds).")


@pytest.mark.parametrize("sig, seconds, code", [(signal.SIGTERM, 1, 75), (signal.SIGINT, 1, 130)])
def test_a_signal_while_starting_exits_with_one_line(data_dir, tmp_path, sig, seconds, code):
    """A second in: JAX and the data pipeline still loading, before the model is built (with the
    persistent compilation cache the first step can start within 3 s)."""
    exit_code, out = _signal_before_the_first_step(data_dir, tmp_path / "run", sig, after_line=None,
                                                   after_seconds=seconds)
    assert exit_code == code, out[-3000:]
    for noise in ("Traceback", "Exception ignored", "KeyboardInterrupt"):
        assert noise not in out, out[-3000:]
    assert out.strip().splitlines()[-1] == f"received {sig.name} {STOPPED_AT_START}", out[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_sigterm_while_the_first_steps_compile_exits_75_with_one_line(data_dir, tmp_path):
    """After the "model:" line the state and the step compile: the signal waits for a compile to
    end (interrupted, XLA's compile thread would crash the exiting process), then stops the run at
    once, or, when the loop has started meanwhile, after saving the first step."""
    code, out = _signal_before_the_first_step(data_dir, tmp_path / "run", signal.SIGTERM, after_line="model:")
    assert code == 75, out[-3000:]
    assert "Traceback" not in out and "Exception ignored" not in out, out[-3000:]
    last = out.strip().splitlines()[-1]
    checkpoints = tmp_path / "run" / "checkpoints"
    steps = sorted(p.name for p in checkpoints.iterdir() if p.name.isdigit()) if checkpoints.exists() else []
    if last.startswith("received SIGTERM before"):
        assert last == f"received SIGTERM {STOPPED_AT_START}" and steps == [], (last, steps)
    else:
        assert last.startswith("received SIGTERM: saved a checkpoint at step 1 and stopped"), out[-3000:]
        assert steps == ["1"], steps


def test_a_sample_prompt_longer_than_the_context_is_refused_before_anything_is_written(data_dir, trained_run,
                                                                                        tmp_path):
    """The model's one prompt-length rule, checked at start-up rather than at the first evaluation."""
    model_dir, digest, config_mtime = copy_of_trained_run(trained_run, tmp_path)
    long_prompt = "def f(x): return x " * 40  # far more than max_len=64 tokens
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=80", f"--gin.train.sample_prompt='{long_prompt}'")
    assert_bad_input(result, "error: train.sample_prompt 0 has", "max_len=64", "shorten or drop that prompt")
    assert_untouched(model_dir, digest, config_mtime)


def test_sample_with_a_prompt_longer_than_the_context_is_one_line(trained_run):
    result = run_cli_in_process("sample", f"--model_dir={trained_run[0]}", "--prompt=" + "def f(x): return x " * 40)
    assert_bad_input(result, "error: prompt 0 has", "max_len=64", "shorten or drop that prompt")


def _binaries(folder: Path) -> Path:
    """A shared library's start, random bytes and a gzip file: what a corpus folder may also hold."""
    folder.mkdir()
    rng = random.Random(0)
    (folder / "lib.so").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(rng.randrange(256) for _ in range(4000)))
    (folder / "blob.bin").write_bytes(bytes(rng.randrange(256) for _ in range(4000)))
    (folder / "notes.txt.gz").write_bytes(gzip.compress(b"compressed text is not text " * 200))
    return folder


def test_prepare_of_binary_files_only_is_refused_and_leaves_the_out_dir_alone(data_dir, tmp_path):
    """Refused whatever --vocab_size says (a small one made the vocabulary trainer refuse, naming it),
    before anything is written: an earlier dataset in --out survives even with --overwrite."""
    out = tmp_path / "data"
    shutil.copytree(data_dir, out)
    digest = tree_digest(out)
    result = run_cli_in_process("prepare", f"--input={_binaries(tmp_path / 'bin')}", f"--out={out}",
                                "--vocab_size=300", "--overwrite")
    assert_bad_input(result, "error: Every input file is binary, not text: ", "lib.so (NUL bytes)",
                     "pass those to --input, or select them in a directory with --glob")
    assert "--vocab_size" not in result.stderr
    assert tree_digest(out) == digest


def test_prepare_skips_stray_binary_files_with_one_warning(tmp_path):
    import sysconfig

    corpus = _binaries(tmp_path / "code")  # beside the stdlib's json package's sources
    for path in (Path(sysconfig.get_paths()["stdlib"]) / "json").glob("*.py"):
        shutil.copy(path, corpus)
    out = tmp_path / "data"
    result = run_cli_in_process("prepare", f"--input={corpus}", f"--out={out}", "--vocab_size=512",
                                f"--validation_fraction={VALIDATION_FRACTION}", "--num_workers=1")
    assert result.returncode == 0, result.stderr[-3000:]
    (warning,) = [line for line in result.stdout.splitlines() if line.startswith("warning: ")]
    assert warning.startswith("warning: skipped 3 binary files of 8 ")
    assert all(name in warning for name in ("blob.bin (", "lib.so (NUL bytes)", "notes.txt.gz ("))
    pieces = [line.split("\t")[0] for line in (out / "spm.vocab").read_text().splitlines()]
    assert not [piece for piece in pieces if "\ufffd" in piece]  # no piece of undecodable bytes
    assert json.loads((out / "metadata.json").read_text())["sources"] == f"{corpus} (5 files)"
