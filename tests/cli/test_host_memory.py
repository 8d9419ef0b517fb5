"""host_memory: a program run through `run_program` maps its large buffers in huge pages, so a
290 MiB temporary buffer allocated on every call costs a few hundred page faults instead of
74,000; `T5X_LITE_MALLOC=system` keeps glibc's defaults; the environment rules are pure.

Each program is its own process: glibc reads its tunables only when a process starts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from t5x_lite import host_memory
from tests.cli_helpers import ROOT, cli_env

# A jitted program with a temporary buffer of about 290 MiB (the cumulative sum's, by XLA's memory
# analysis), which XLA:CPU allocates on each call and frees after it, run three times; prints the
# page faults of the third call and the tunables the program ran with.
PROGRAM = """
import json, os, resource
from t5x_lite import host_memory

def main():
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x: jnp.sum(jnp.cumsum(x)))
    x = jnp.ones((64 * 1024 * 1024,), jnp.float32)
    for _ in range(2):
        f(x).block_until_ready()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
                      "tunables": os.environ.get("GLIBC_TUNABLES")}))
    return 3

host_memory.run_program(main)
"""


def _run(malloc: str | None) -> dict:
    # Compiled as users' programs are: the tests' level-0 backend (conftest.py) makes this large
    # cumulative sum several times slower.
    env = {**cli_env(), "XLA_FLAGS": "", "T5X_LITE_MALLOC": malloc or ""}
    env.pop("GLIBC_TUNABLES", None)
    out = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 3, out.stderr  # main's return value is the exit code, after the restart too
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(host_memory.huge_page_environment({}) is None,
                    reason="needs Linux, glibc >= 2.35 and transparent huge pages in madvise mode")
def test_run_program_maps_large_buffers_in_huge_pages_and_system_opts_out():
    huge, system = _run(None), _run("system")
    assert huge["tunables"] == host_memory.HUGE_PAGES and system["tunables"] is None
    # 290 MiB of 4 KiB pages is about 74,000 faults: glibc maps the block anew on each call.
    assert system["faults"] > 30_000, system
    assert huge["faults"] < 3_000, huge


def test_huge_page_environment_keeps_the_users_tunables_and_never_restarts_twice(monkeypatch):
    monkeypatch.setattr(host_memory, "_glibc", lambda: True)
    monkeypatch.setattr(host_memory, "_thp_mode", lambda: "madvise")
    env = host_memory.huge_page_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "A": "1"})
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "A": "1"}
    assert host_memory.huge_page_environment(env) is None  # the restarted program runs on
    assert host_memory.huge_page_environment({"T5X_LITE_MALLOC": "system"}) is None
    for mode in ("always", "never", None):
        monkeypatch.setattr(host_memory, "_thp_mode", lambda: mode)
        assert host_memory.huge_page_environment({}) is None
