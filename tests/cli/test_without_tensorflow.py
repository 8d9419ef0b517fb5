"""The whole CLI on prepared data where TensorFlow, seqio and t5 cannot be imported, as on an
accelerator image that has JAX alone: `python -m bench e2e --quick` runs prepare, train, a kill -9
and an exact resume, eval, sample and infer through `t5x-lite`, each in its own process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.cli_helpers import ROOT, cli_env

BLOCKED = ("tensorflow", "tensorflow_text", "seqio", "t5")


def blocking_packages(folder: Path) -> Path:
    """A folder that, first on PYTHONPATH, makes importing each of BLOCKED fail."""
    for name in BLOCKED:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    return folder


def test_prepare_train_kill_resume_eval_sample_infer_without_tensorflow_seqio_or_t5(tmp_path):
    blocked = blocking_packages(tmp_path / "blocked")
    env = cli_env(extra_pythonpath=None)
    env["PYTHONPATH"] = f"{blocked}:{env['PYTHONPATH']}"
    for name in BLOCKED:
        probe = subprocess.run([sys.executable, "-c", f"import {name}"], env=env, capture_output=True, text=True)
        assert probe.returncode != 0 and "is not installed here" in probe.stderr

    result = subprocess.run([sys.executable, "-m", "bench", "e2e", "--quick", f"--dir={tmp_path}"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = result.stdout
    assert "killed after 'step 4: checkpoint saved'" in report
    resumed_from = int(re.search(r"resumed from step (\d+)", report).group(1))
    assert 4 <= resumed_from < 12  # a checkpoint before the end: the resumed run trained the rest
    assert "| final params of A and B bitwise equal" in report and "| True (step 12)" in report
    assert "4 prompts answered" in report
    for name in BLOCKED:  # nothing reached for them and went on quietly without
        assert f"{name} is not installed here" not in result.stderr
