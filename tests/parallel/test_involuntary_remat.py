"""No shipped mesh makes XLA fall back to an involuntary full rematerialization (a reshard it can
only do by replicating a whole array on every device) in the train step of either model family."""

from __future__ import annotations

import subprocess
import sys

from tests.cli_helpers import ROOT, cli_env


def test_no_shipped_mesh_forces_an_involuntary_full_rematerialization():
    env = {**cli_env(8), "TF_CPP_MIN_LOG_LEVEL": "0"}  # XLA's warnings are what this test reads
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a cached program would not be partitioned again
    result = subprocess.run([sys.executable, "-m", "tests.parallel.compile_shipped_meshes"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = result.stdout.split()
    assert compiled.count("compiled") == 8, result.stdout  # 2 models x (3 mesh files + 2x2x2)
    warnings = [line for line in result.stderr.splitlines() if "Involuntary full rematerialization" in line]
    assert not warnings, "\n".join(line[:400] for line in warnings[:4])
