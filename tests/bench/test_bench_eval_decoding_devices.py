"""bench/decoding.py and bench/evaluation.py on 1 and 2 host devices (`--quick`), as subprocesses:
the benchmarks make their own host devices, and every multi-device row gives the 1-device outputs."""

import os
import subprocess
import sys

import pytest

from tests.cli_helpers import ROOT

# rows per table at --quick: decoder-only (batches 1, 2 x cache or not x 1, 2 devices), T5 (3 methods x 2);
# perplexity (2 strides x 2), multiple choice (1 model x 2)
TABLE_ROWS = {"decoding": [8, 6], "evaluation": [4, 2]}


def tables(out: str) -> list[list[dict[str, str]]]:
    """Each markdown table of a report as a list of {column: cell} rows."""
    found, lines = [], out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| ") and (i == 0 or not lines[i - 1].startswith("|")):
            headers = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("| "):
                    break
                rows.append(dict(zip(headers, (c.strip() for c in row.strip("|").split("|")))))
            found.append(rows)
    return found


@pytest.fixture(scope="module")
def reports():
    """{name: CompletedProcess} of `python -m bench NAME --quick`, both run at once, with no XLA_FLAGS given."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    procs = {name: subprocess.Popen([sys.executable, "-m", "bench", name, "--quick"], cwd=ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in TABLE_ROWS}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize("name", sorted(TABLE_ROWS))
def test_every_row_on_two_devices_gives_the_one_device_outputs(reports, name):
    result = reports[name]
    assert result.returncode == 0, result.stderr[-3000:]
    header = result.stdout.splitlines()[0]
    assert "accelerator: 2 x cpu" in header and "--xla_force_host_platform_device_count=2" in header, header
    found = tables(result.stdout)
    assert [len(t) for t in found] == TABLE_ROWS[name]
    for table in found:
        assert [row["devices"] for row in table].count("1") == [row["devices"] for row in table].count("2")
        for row in table:
            if row["devices"] == "1":
                assert (row["mesh"], row["same as 1 device"]) == ("one device", "-"), row
            else:
                assert row["devices"] == "2" and row["mesh"] == "fsdp 2", row
                assert row["same as 1 device"].startswith("yes"), row
    assert result.stdout.strip().splitlines()[-1].endswith("devices=1,2, mesh=fsdp")


def test_devices_beyond_a_started_backend_fail_with_one_clear_line():
    import jax

    from bench import decoding
    from bench.__main__ import parser

    have = jax.device_count()  # starts the backend (8 host devices under tests/conftest.py)
    args = parser().parse_args(["decoding", "--quick", f"--devices=1,{have + 1}"])
    s = decoding.common.resolve(args, decoding.DEFAULTS, decoding.QUICK)
    with pytest.raises(SystemExit, match=f"needs {have + 1} devices") as exc:
        decoding.setup(args, s)
    assert "\n" not in str(exc.value)
    # the default counts shrink to the devices there are (`bench all` starts JAX before `decoding`)
    args = parser().parse_args(["decoding"])
    s = {**decoding.common.resolve(args, decoding.DEFAULTS, decoding.QUICK), "devices": f"1,{have + 1}"}
    decoding.setup(args, s)
    assert s["device_counts"] == [1] and f"instead of --devices=1,{have + 1}" in s["devices_note"]
