"""launch/tpu/*.sh against a fake `gcloud`: the exact commands they run, the quoting of the
remote command lines, DRY_RUN=1, and the refusals. No network, no TPU: the fake records its
argv (one JSON list per line) and exits 0."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
TPU = ROOT / "launch" / "tpu"
SETTINGS = ("TPU_NAME", "ZONE", "ACCELERATOR_TYPE", "RUNTIME_VERSION", "PROJECT", "SPOT", "DRY_RUN",
            "MODEL_DIR", "TRAIN_LOG")
BASE = {"TPU_NAME": "t5x-pod", "ZONE": "us-west4-a", "ACCELERATOR_TYPE": "v5litepod-16"}
TPU_VM = ["compute", "tpus", "tpu-vm"]

FAKE_GCLOUD = """#!{python} -I
import json, os, shutil, sys
args = sys.argv[1:]
log = os.environ["FAKE_GCLOUD_LOG"]
with open(log, "a") as f:
    f.write(json.dumps(args) + "\\n")
if "scp" in args:  # keep the copied file: install.sh deletes its temporary directory on exit
    shutil.copy(args[args.index("scp") + 1], log + ".scp")
"""

# Stands in for a program on the worker: records argv and working directory, prints a line and
# exits with FAKE_RC.
FAKE_PROGRAM = """#!{python} -I
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd()}}) + "\\n")
print("output of", os.path.basename(sys.argv[0]))
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


def _write_exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class Fake:
    def __init__(self, tmp_path: Path):
        self.bin = tmp_path / "bin"
        self.log = tmp_path / "gcloud.log"
        self.home = tmp_path / "home"
        self.home.mkdir()
        _write_exe(self.bin / "gcloud", FAKE_GCLOUD.format(python=sys.executable))

    def run(self, script: str, *args: str, **settings: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
        env.update(PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}", HOME=str(self.home),
                   FAKE_GCLOUD_LOG=str(self.log), **settings)
        return subprocess.run([str(TPU / script), *args], env=env, capture_output=True, text=True,
                              timeout=60)

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def program(self, path: Path) -> Path:
        """A fake program at `path` whose calls are read back with `program_calls(path)`."""
        return _write_exe(path, FAKE_PROGRAM.format(python=sys.executable, log=f"{path}.calls"))

    @staticmethod
    def program_calls(path: Path) -> list[dict]:
        log = Path(f"{path}.calls")
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def remote(self, command: str, **env: str) -> subprocess.CompletedProcess:
        """Runs an ssh --command string the way a worker does: gcloud passes
        `command.split(' ')` to ssh, ssh joins its arguments with spaces, and the worker's login
        shell (bash) runs the result with -c; here in the fake home, fake programs first on PATH."""
        over_ssh = " ".join(command.split(" "))
        full_env = {**os.environ, "HOME": str(self.home),
                    "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", **env}
        return subprocess.run(["bash", "-c", over_ssh], env=full_env, capture_output=True, text=True,
                              timeout=60)


@pytest.fixture
def fake(tmp_path):
    return Fake(tmp_path)


def _ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr
    return result


def _command_of(call: list[str]) -> str:
    [command] = [a.removeprefix("--command=") for a in call if a.startswith("--command=")]
    return command


# --- create / delete ----------------------------------------------------------------------------

def test_create_with_project_and_spot(fake):
    _ok(fake.run("create.sh", **BASE, PROJECT="my-project", SPOT="1"))
    assert fake.calls() == [TPU_VM + ["create", "t5x-pod", "--zone=us-west4-a", "--project=my-project",
                                      "--accelerator-type=v5litepod-16", "--version=v2-alpha-tpuv5-lite",
                                      "--spot"]]


@pytest.mark.parametrize("accelerator, version", [
    ("v4-32", "tpu-ubuntu2204-base"), ("v3-8", "tpu-ubuntu2204-base"), ("v5p-8", "v2-alpha-tpuv5"),
    ("v5litepod-4", "v2-alpha-tpuv5-lite"), ("v6e-16", "v2-alpha-tpuv6e")])
def test_create_default_runtime_version(fake, accelerator, version):
    _ok(fake.run("create.sh", **{**BASE, "ACCELERATOR_TYPE": accelerator}))
    assert fake.calls() == [TPU_VM + ["create", "t5x-pod", "--zone=us-west4-a",
                                      f"--accelerator-type={accelerator}", f"--version={version}"]]


def test_create_explicit_runtime_version_and_no_spot(fake):
    _ok(fake.run("create.sh", **BASE, RUNTIME_VERSION="v2-alpha-tpuv5-lite-custom", SPOT="0"))
    assert fake.calls() == [TPU_VM + ["create", "t5x-pod", "--zone=us-west4-a",
                                      "--accelerator-type=v5litepod-16", "--version=v2-alpha-tpuv5-lite-custom"]]


def test_create_unknown_family_needs_runtime_version(fake):
    result = fake.run("create.sh", **{**BASE, "ACCELERATOR_TYPE": "tpu7x-8"})
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        "create.sh: RUNTIME_VERSION is not set and has no default for ACCELERATOR_TYPE=tpu7x-8 "
        "(for example: export RUNTIME_VERSION=tpu-ubuntu2204-base)"]
    assert fake.calls() == []


def test_create_refuses_a_bad_spot_value(fake):
    result = fake.run("create.sh", **BASE, SPOT="yes")
    assert result.returncode != 0 and "SPOT must be 1 or 0" in result.stderr
    assert fake.calls() == []


def test_delete(fake):
    _ok(fake.run("delete.sh", TPU_NAME="t5x-pod", ZONE="us-west4-a", PROJECT="p"))
    assert fake.calls() == [TPU_VM + ["delete", "t5x-pod", "--zone=us-west4-a", "--project=p", "--quiet"]]


# --- install ------------------------------------------------------------------------------------

INSTALL_COMMAND = (
    "set -e; sudo apt-get -o DPkg::Lock::Timeout=600 -qq update"
    " && sudo apt-get -o DPkg::Lock::Timeout=600 -qq install -y python3.11 python3.11-venv make"
    " && mkdir -p ~/t5x_lite && tar -xzmf ~/t5x_lite.tar.gz -C ~/t5x_lite"
    " && cd ~/t5x_lite && make install-tpu PYTHON=python3.11")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True,
                          text=True).stdout


def test_install_copies_the_committed_tree_and_runs_make_install_tpu(fake):
    _ok(fake.run("install.sh", TPU_NAME="t5x-pod", ZONE="us-west4-a"))
    scp, ssh = fake.calls()
    local = scp[4]
    assert local.endswith("/t5x_lite.tar.gz")
    assert scp == TPU_VM + ["scp", local, "t5x-pod:t5x_lite.tar.gz", "--zone=us-west4-a", "--worker=all"]
    assert ssh == TPU_VM + ["ssh", "t5x-pod", "--zone=us-west4-a", "--worker=all",
                            f"--command={INSTALL_COMMAND}"]
    assert not Path(local).exists()  # the temporary tarball is removed

    # The tarball holds exactly the files of HEAD, with their committed content.
    tarball = Path(f"{fake.log}.scp")
    with tarfile.open(tarball) as tar:
        names = {m.name for m in tar.getmembers() if not m.isdir()}
        pyproject = tar.extractfile("pyproject.toml").read().decode()
    assert names == set(_git("ls-tree", "-r", "--name-only", "HEAD").splitlines())
    assert {"pyproject.toml", "Makefile", "requirements/lock.txt", "t5x_lite/cli.py"} <= names
    assert pyproject == _git("show", "HEAD:pyproject.toml")

    # On a worker: the tarball in the home directory, apt-get and make faked.
    shutil.copy(tarball, fake.home / "t5x_lite.tar.gz")
    sudo, make = fake.program(fake.bin / "sudo"), fake.program(fake.bin / "make")
    _ok(fake.remote(INSTALL_COMMAND))
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "-qq"]
    assert [c["argv"] for c in fake.program_calls(sudo)] == [
        apt + ["update"], apt + ["install", "-y", "python3.11", "python3.11-venv", "make"]]
    assert fake.program_calls(make) == [{"argv": ["install-tpu", "PYTHON=python3.11"],
                                         "cwd": str(fake.home / "t5x_lite")}]
    assert (fake.home / "t5x_lite" / "pyproject.toml").read_text() == pyproject


def test_install_stops_on_the_first_failing_step(fake):
    (fake.home / "t5x_lite.tar.gz").write_bytes(b"not a tarball")
    fake.program(fake.bin / "sudo")
    make = fake.program(fake.bin / "make")
    assert fake.remote(INSTALL_COMMAND).returncode != 0
    assert fake.program_calls(make) == []


# --- train --------------------------------------------------------------------------------------

def test_train_command(fake):
    _ok(fake.run("train.sh", "--gin_file=runs/pretrain.gin", "--gin.TRAIN_STEPS=1000",
                 **BASE, MODEL_DIR="gs://bucket/runs/d125m", PROJECT="p"))
    assert fake.calls() == [TPU_VM + [
        "ssh", "t5x-pod", "--zone=us-west4-a", "--project=p", "--worker=all",
        "--command=cd ~/t5x_lite && mkdir -p logs && set -o pipefail && .venv/bin/t5x-lite train"
        " --gin_file=runs/pretrain.gin --gin.TRAIN_STEPS=1000"
        " \"--gin.MODEL_DIR='gs://bucket/runs/d125m'\" 2>&1 | tee -a logs/train.log"]]


TRICKY = [
    "--gin_file=runs/quickstart.gin",
    "--gin.train.sample_prompt='def f(x):\\n    return \"a  b\"'",  # quotes, double space
    "--gin.DATA_DIR='gs://bucket/data with space'",
    "--gin.note=\"it's $HOME `id` $(id) ; && | * ~ \\\\\"",  # shell syntax that must stay text
    "--gin.multi='line one\nline two\ttab'",
    "",
]


def test_train_arguments_reach_t5x_lite_exactly(fake):
    _ok(fake.run("train.sh", *TRICKY, **BASE, MODEL_DIR="gs://bucket/runs/d125m"))
    command = _command_of(fake.calls()[0])

    t5x_lite = fake.program(fake.home / "t5x_lite" / ".venv" / "bin" / "t5x-lite")
    result = _ok(fake.remote(command))
    [call] = fake.program_calls(t5x_lite)
    assert call == {"argv": ["train", *TRICKY, "--gin.MODEL_DIR='gs://bucket/runs/d125m'"],
                    "cwd": str(fake.home / "t5x_lite")}
    # The output goes to the ssh session and is appended to the log on the worker.
    assert result.stdout == "output of t5x-lite\n"
    _ok(fake.remote(command))
    assert (fake.home / "t5x_lite" / "logs" / "train.log").read_text() == "output of t5x-lite\n" * 2


def test_train_exit_status_survives_the_tee(fake):
    _ok(fake.run("train.sh", "--gin_file=runs/pretrain.gin", **BASE, MODEL_DIR="gs://b/r",
                 TRAIN_LOG="my logs/run 1.log"))
    command = _command_of(fake.calls()[0])
    fake.program(fake.home / "t5x_lite" / ".venv" / "bin" / "t5x-lite")
    assert fake.remote(command, FAKE_RC="3").returncode == 3
    assert (fake.home / "t5x_lite" / "my logs" / "run 1.log").read_text() == "output of t5x-lite\n"


@pytest.mark.parametrize("accelerator", ["v4-32", "v4-16", "v5litepod-16", "v6e-32", "v2-32", "v5p-128"])
def test_train_refuses_a_local_model_dir_on_several_workers(fake, accelerator):
    result = fake.run("train.sh", "--gin_file=runs/pretrain.gin",
                      **{**BASE, "ACCELERATOR_TYPE": accelerator}, MODEL_DIR="/tmp/run")
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        f"train.sh: MODEL_DIR=/tmp/run is not gs://, but {accelerator} has several workers and each "
        "reads and writes it (for example: export MODEL_DIR=gs://my-bucket/runs/d125m)"]
    assert fake.calls() == []


@pytest.mark.parametrize("accelerator", ["v4-8", "v5litepod-8", "v5litepod-1", "v6e-4", "v5p-8", "v3-8"])
def test_train_accepts_a_local_model_dir_on_one_worker(fake, accelerator):
    _ok(fake.run("train.sh", "--gin_file=runs/pretrain.gin",
                 **{**BASE, "ACCELERATOR_TYPE": accelerator}, MODEL_DIR="runs/d125m"))
    assert "\"--gin.MODEL_DIR='runs/d125m'\"" in _command_of(fake.calls()[0])


@pytest.mark.parametrize("missing", ["MODEL_DIR", "ACCELERATOR_TYPE"])
def test_train_needs_model_dir_and_accelerator_type(fake, missing):
    settings = {**BASE, "MODEL_DIR": "gs://b/r"}
    del settings[missing]
    result = fake.run("train.sh", "--gin_file=runs/pretrain.gin", **settings)
    assert result.returncode != 0
    assert len(result.stderr.splitlines()) == 1
    assert f"{missing} is not set (for example: export {missing}=" in result.stderr
    assert fake.calls() == []


def test_train_refuses_a_quote_in_model_dir(fake):
    result = fake.run("train.sh", "--gin_file=runs/pretrain.gin", **BASE, MODEL_DIR="gs://b/it's")
    assert result.returncode != 0 and "MODEL_DIR must not contain a quote" in result.stderr
    assert fake.calls() == []


def test_train_refuses_a_model_dir_flag(fake):
    result = fake.run("train.sh", "--gin.MODEL_DIR='/tmp/x'", **BASE, MODEL_DIR="gs://b/r")
    assert result.returncode != 0 and "set MODEL_DIR instead" in result.stderr
    assert fake.calls() == []


# --- all scripts: DRY_RUN and the settings check --------------------------------------------------

RUNS = {
    "create.sh": ((), {**BASE, "SPOT": "1"}),
    "delete.sh": ((), BASE),
    "train.sh": (tuple(TRICKY), {**BASE, "MODEL_DIR": "gs://b/r"}),
}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_dry_run_prints_the_commands_and_runs_nothing(fake, script):
    args, settings = RUNS[script]
    dry = _ok(fake.run(script, *args, **settings, DRY_RUN="1"))
    assert fake.calls() == []
    _ok(fake.run(script, *args, **settings))
    printed = dry.stderr.rstrip("\n")  # one command (train's holds newlines inside quotes)
    assert printed.startswith("+ gcloud ")
    assert shlex.split(printed[2:]) == ["gcloud", *fake.calls()[0]]  # printed = run, copy-pastable


def test_install_dry_run(fake):
    result = _ok(fake.run("install.sh", TPU_NAME="t5x-pod", ZONE="us-west4-a", DRY_RUN="1"))
    assert fake.calls() == []
    printed = [shlex.split(line[2:]) for line in result.stderr.splitlines() if line.startswith("+ ")]
    assert [p[:5] for p in printed] == [["git", "-C", str(ROOT), "archive", "--format=tar.gz"],
                                        ["gcloud", *TPU_VM, "scp"], ["gcloud", *TPU_VM, "ssh"]]
    assert printed[2][-1] == f"--command={INSTALL_COMMAND}"
    assert not Path(printed[0][-2]).exists()  # the tarball was not written


@pytest.mark.parametrize("script", ["create.sh", "install.sh", "train.sh", "delete.sh"])
@pytest.mark.parametrize("missing", ["TPU_NAME", "ZONE"])
def test_a_missing_setting_is_one_line_and_runs_nothing(fake, script, missing):
    settings = {**BASE, "MODEL_DIR": "gs://b/r"}
    del settings[missing]
    result = fake.run(script, **settings)
    assert result.returncode != 0
    assert result.stderr.splitlines() == [f"{script}: {missing} is not set (for example: export {missing}="
                                          f"{'t5x-v5e-16' if missing == 'TPU_NAME' else 'us-west4-a'})"]
    assert result.stdout == "" and fake.calls() == []


@pytest.mark.parametrize("script", ["create.sh", "install.sh", "train.sh", "delete.sh"])
def test_help(fake, script):
    result = _ok(fake.run(script, "--help"))
    assert "Settings (environment)" in result.stdout and fake.calls() == []


# --- requirements/tpu.txt and make install-tpu ----------------------------------------------------

def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_tpu_pins_satisfy_jax_tpu_extra():
    """Every package of the installed jax's `tpu` extra is pinned, in tpu.txt or in the lock, at a
    version the extra accepts; tpu.txt pins nothing else (so a jax upgrade shows here)."""
    tpu, lock = _pins(ROOT / "requirements" / "tpu.txt"), _pins(ROOT / "requirements" / "lock.txt")
    extra = [r for r in map(Requirement, importlib.metadata.requires("jax"))
             if r.marker is not None and r.marker.evaluate({"extra": "tpu"})]
    names = {r.name.lower() for r in extra}
    assert names == {"jaxlib", "libtpu", "requests"}
    for req in extra:
        version = tpu.get(req.name.lower(), lock.get(req.name.lower()))
        assert version is not None and req.specifier.contains(version), (req, version)
    assert set(tpu) <= names and not set(tpu) & set(lock)


def test_make_install_tpu_installs_tpu_txt():
    out = subprocess.run(["make", "-n", "install-tpu"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "--no-deps -r requirements/tpu.txt" in out
