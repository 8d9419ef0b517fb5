"""bench/loop_overhead.py: bare jitted step, Trainer.train_step and training.loop.train, at --quick sizes on a tiny corpus."""

import math

import pytest

from bench import loop_overhead, throughput
from bench.__main__ import BENCHMARKS, CPU_BENCHMARKS
from t5x_lite.data import task_access
from tests.bench_helpers import run_bench


@pytest.fixture(scope="module")
def report(small_data_dir):
    """(what run() returned, what it printed) for `loop_overhead --quick --data_dir=<tiny corpus>`."""
    return run_bench("loop_overhead", "--quick", f"--data_dir={small_data_dir}")


def test_registered_after_throughput_with_its_sizes():
    assert BENCHMARKS["loop_overhead"] is loop_overhead
    assert CPU_BENCHMARKS.index("loop_overhead") > CPU_BENCHMARKS.index("throughput")
    for key in loop_overhead.SIZES:
        assert loop_overhead.DEFAULTS[key] == throughput.DEFAULTS[key]
        assert loop_overhead.QUICK[key] == throughput.QUICK[key]
    assert (loop_overhead.DEFAULTS["batch_size"], loop_overhead.DEFAULTS["seq_len"]) == (8, 256)


def test_every_row_trains_and_has_a_speed(report, small_data_dir):
    result, _ = report
    s = result["settings"]

    assert s["vocab_size"] == task_access.vocabulary_size(task_access.DataConfig(loop_overhead.corpus(str(small_data_dir))[0]))
    for name in ("bare", "train_step", "loop"):
        assert result[name]["tokens_per_s"] > 0, name
        assert result[name]["step_s"] > 0, name
    uniform = math.log(s["vocab_size"])
    for name in ("bare", "train_step"):
        r = result[name]
        assert abs(r["first_loss"] - uniform) < 1.0, (name, r["first_loss"], uniform)
        assert r["loss"] < r["first_loss"], (name, r["first_loss"], r["loss"])
        assert r["steps"] == s["warmup_steps"] + s["windows"] * s["steps"]
    loop = result["loop"]
    assert loop["steps"] == (1 + s["windows"]) * s["steps"]
    assert len(loop["window_tokens_per_s"]) == 1 + s["windows"]  # one report every --steps steps
    assert abs(loop["first_loss"] - uniform) < 1.0
    assert loop["wall_tokens_per_s"] > 0
    assert result["loop_overhead"] == pytest.approx(1 - loop["tokens_per_s"] / result["train_step"]["tokens_per_s"])
    assert result["trainer_vs_bare"] == pytest.approx(
        result["train_step"]["tokens_per_s"] / result["bare"]["tokens_per_s"])


def test_report_is_one_header_a_table_notes_and_settings(report):
    _, out = report
    lines = out.strip().splitlines()
    assert lines[0].startswith("**") and "command: `python -m bench loop_overhead --quick" in lines[0]
    rows = [line for line in lines if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows[1:]] == [
        "1. bare jitted step", "2. Trainer.train_step", "3. training.loop.train"]
    assert lines[-1].startswith("settings: ") and "vocab_size=" in lines[-1]
    assert "step 0:" not in out  # the loop's own log lines go to stderr
