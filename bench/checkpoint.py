"""checkpoint: save and restore seconds and GB/s of a full train state, next to the disk's own speed.

The state is what `training.loop.train` saves: `checkpoint.to_saveable` of the state after one
`Trainer.train_step` from `Trainer.init_state` (step, float32 params, AdamW state: both moments,
non-zero after the step, clipping and schedule counters) plus the dropout RNG key, of a
decoder-only model (default: gin/models/decoder_125m.gin's shape with a 10240-token
vocabulary, about 100M parameters, 1.2 GB). Everything is written under a fresh temporary
directory in --dir (default: $TMPDIR or /tmp), deleted at the end. Each repetition:

1. `dd`: a --dd_mib MiB file written with oflag=direct conv=fsync and read back with
   iflag=direct (where O_DIRECT is refused: conv=fdatasync, and a read after the file's pages
   were dropped from the page cache; the table says so).
2. Synchronous save (`Checkpointer(..., async_save=False)`): `save` seconds; then the seconds to
   fsync every file it wrote (near 0 when the save left nothing in the page cache unwritten).
3. Asynchronous save (`async_save=True`): the seconds `save` blocked the caller (its return
   value), and the seconds until `wait()` returned.
4. `restore(step, abstract_state=...)` into `Trainer.abstract_state`'s shapes and shardings,
   until every array is ready: once with the files still in the page cache (just written), and
   once after they were dropped from it (fsync + posix_fadvise DONTNEED per file, no root needed),
   so that it reads the disk.

Each save goes to a new model directory (one step in it), as a run's first checkpoint; one
untimed save and restore first warms up Orbax. GB/s = the state's bytes (1 GB = 1e9 bytes) over
the seconds; the table shows the median of --repeats repetitions and every run. Orbax writes
the arrays zstd-compressed (its default), so the files are smaller than the state; the note
under the table gives both sizes, and how many cores other processes kept busy meanwhile.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from importlib import metadata as importlib_metadata

import jax

from bench import common

DEFAULTS = {"emb_dim": 768, "num_layers": 12, "num_heads": 12, "head_dim": 64, "mlp_dim": 2048,
            "vocab_size": 10240, "repeats": 3, "dd_mib": 1024, "dir": None}
QUICK = {"emb_dim": 256, "num_layers": 8, "num_heads": 4, "head_dim": 64, "mlp_dim": 1024, "vocab_size": 4096,
         "repeats": 1, "dd_mib": 256}
STEP = 1000
DD_BLOCK_MIB = 16


def add_arguments(parser) -> None:
    for key in ("emb_dim", "num_layers", "num_heads", "head_dim", "mlp_dim", "vocab_size", "repeats", "dd_mib"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]} (--quick: {QUICK.get(key, '-')})")
    parser.add_argument("--dir", help="where the temporary directory is made (default: $TMPDIR or /tmp); "
                                      "its disk is the one measured")


# ---------------------------------------------------------------------------- the state


def model_config(s: dict):
    from t5x_lite.models.decoder_only import DecoderConfig

    return DecoderConfig(vocab_size=s["vocab_size"], emb_dim=s["emb_dim"], num_heads=s["num_heads"],
                         num_kv_heads=s["num_heads"], head_dim=s["head_dim"], mlp_dim=s["mlp_dim"],
                         num_layers=s["num_layers"], max_len=2048, dtype="bfloat16", remat_policy="minimal")


def make_state(cfg) -> tuple[dict, dict]:
    """(the saveable state after one train step, its abstract tree with shardings), as `training.loop.train` builds them."""
    from t5x_lite.checkpoints import checkpoint as checkpoint_lib

    trainer = common.make_trainer(cfg)
    example = common.make_batch(cfg, batch=jax.device_count(), length=8)
    abstract = trainer.abstract_state(example)
    state = trainer.init_state(jax.random.PRNGKey(0), example)
    dropout_rng = jax.random.PRNGKey(1)
    # One train step, so that the Adam moments hold gradients rather than zeros (which compress).
    state, _ = trainer.train_step(state, common.global_batch(trainer, example), dropout_rng)
    saveable = checkpoint_lib.to_saveable(state, dropout_rng)
    abstract_rng = jax.ShapeDtypeStruct(dropout_rng.shape, dropout_rng.dtype, sharding=dropout_rng.sharding)
    jax.block_until_ready(saveable)
    return saveable, checkpoint_lib.to_saveable(abstract, abstract_rng)


def tree_bytes(tree) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


# ---------------------------------------------------------------------------- files and disk


def files_under(directory: str) -> list[str]:
    return [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names]


def du_bytes(directory: str) -> int:
    return sum(os.path.getsize(p) for p in files_under(directory))


def fsync_files(directory: str) -> None:
    for path in files_under(directory):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def drop_from_page_cache(directory: str) -> None:
    """Writes back and evicts the cached pages of every file under `directory` (this directory only)."""
    for path in files_under(directory):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_fraction(directory: str) -> float | None:
    """Fraction of the files' bytes in the page cache, by `fincore` (None where it is missing)."""
    paths = files_under(directory)
    if not paths or not shutil.which("fincore"):
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", *paths],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None
    resident = size = 0
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2:
            resident, size = resident + int(fields[0]), size + int(fields[1])
    return resident / size if size else None


def filesystem(directory: str) -> str:
    out = subprocess.run(["df", "--output=source,fstype,target", directory], capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    return " ".join(lines[-1].split()) if out.returncode == 0 and len(lines) > 1 else "unknown"


def _dd(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(["dd", *args], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    return time.perf_counter() - start, done


def dd_speeds(directory: str, mib: int) -> dict:
    """Seconds of a sequential write and read of `mib` MiB with dd, and how each was made."""
    path = os.path.join(directory, "dd_test")
    count = max(1, mib // DD_BLOCK_MIB)
    common_args = [f"bs={DD_BLOCK_MIB}M", f"count={count}"]
    try:
        write_s, done = _dd("if=/dev/zero", f"of={path}", *common_args, "oflag=direct", "conv=fsync")
        write_how = "oflag=direct conv=fsync"
        if done.returncode != 0:
            write_s, done = _dd("if=/dev/zero", f"of={path}", *common_args, "conv=fdatasync")
            write_how = "conv=fdatasync (oflag=direct refused here)"
            if done.returncode != 0:
                raise RuntimeError(f"dd could not write {path}: {done.stderr.strip()}")
        read_s, done = _dd(f"if={path}", "of=/dev/null", f"bs={DD_BLOCK_MIB}M", "iflag=direct")
        read_how = "iflag=direct"
        if done.returncode != 0:
            drop_from_page_cache(directory)
            read_s, done = _dd(f"if={path}", "of=/dev/null", f"bs={DD_BLOCK_MIB}M")
            read_how = "page cache dropped first (iflag=direct refused here)"
            if done.returncode != 0:
                raise RuntimeError(f"dd could not read {path}: {done.stderr.strip()}")
        return {"bytes": count * DD_BLOCK_MIB * common.MIB, "write_s": write_s, "read_s": read_s,
                "write_how": write_how, "read_how": read_how, "dd_report": _dd_rate(done.stderr)}
    finally:
        if os.path.exists(path):
            os.remove(path)


def _dd_rate(stderr: str) -> str:
    match = re.search(r"copied, ([\d.]+ s, [\d.]+ \S+)", stderr)
    return match.group(1) if match else ""


def release_memory() -> None:
    """Frees what the last measurement dropped and returns it to the OS (untimed, between measurements).

    glibc keeps freed buffers of Orbax's and TensorStore's threads in per-thread arenas; without
    this the process grows by about 1 GB per repetition.
    """
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


# ---------------------------------------------------------------------------- checkpoints


def checkpointer(model_dir: str, *, async_save: bool):
    from t5x_lite.checkpoints.checkpoint import Checkpointer
    from t5x_lite.checkpoints.retention import RetentionPolicy

    return Checkpointer(model_dir, retention=RetentionPolicy(keep_last=1), create=True, async_save=async_save)


def save_args(num_params: int) -> dict:
    return {"iterator_state": {"epoch": 0, "batches_taken": STEP},
            "metadata": {"bench": "checkpoint", "num_params": num_params}, "config_text": "", "metrics": None}


def step_dir(model_dir: str) -> str:
    from t5x_lite.checkpoints.checkpoint import checkpoints_dir

    return os.path.join(checkpoints_dir(model_dir), str(STEP))


def timed_restore(model_dir: str, abstract: dict) -> float:
    from t5x_lite.checkpoints.checkpoint import Checkpointer

    ckpt = Checkpointer(model_dir, create=False, async_save=False)
    try:
        start = time.perf_counter()
        state, _, _ = ckpt.restore(STEP, abstract_state=abstract)
        jax.block_until_ready(state)
        seconds = time.perf_counter() - start
    finally:
        ckpt.close()
    del state
    return seconds


def timed_save(model_dir: str, state: dict, num_params: int, *, async_save: bool) -> tuple[float, float]:
    """(seconds the caller was blocked, seconds until the step was written) of one save."""
    release_memory()
    ckpt = checkpointer(model_dir, async_save=async_save)
    start = time.perf_counter()
    blocked = ckpt.save(STEP, state=state, **save_args(num_params))
    ckpt.wait()
    total = time.perf_counter() - start
    ckpt.close()
    return blocked, total


def repetition(root: str, index: int, state: dict, abstract: dict, num_params: int) -> dict:
    """One of each measurement; the model directories are deleted at the end."""
    sync_dir, async_dir = os.path.join(root, f"sync_{index}"), os.path.join(root, f"async_{index}")
    out = {}
    try:
        common.progress(f"checkpoint: repetition {index}: synchronous save")
        out["sync_returned_s"], out["sync_s"] = timed_save(sync_dir, state, num_params, async_save=False)
        _, out["fsync_after_sync_s"] = common.timed(lambda: fsync_files(step_dir(sync_dir)))
        common.progress(f"checkpoint: repetition {index}: asynchronous save")
        out["async_blocked_s"], out["async_total_s"] = timed_save(async_dir, state, num_params, async_save=True)

        common.progress(f"checkpoint: repetition {index}: restore (page cache, then disk)")
        release_memory()
        out["cached_before_warm"] = cached_fraction(step_dir(async_dir))
        out["restore_warm_s"] = timed_restore(async_dir, abstract)
        release_memory()
        drop_from_page_cache(step_dir(sync_dir))
        out["cached_before_cold"] = cached_fraction(step_dir(sync_dir))
        out["restore_cold_s"] = timed_restore(sync_dir, abstract)
        out["disk_bytes"] = du_bytes(step_dir(sync_dir))
    finally:
        for d in (sync_dir, async_dir):
            shutil.rmtree(d, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------- other work on the CPUs


def cpu_seconds() -> tuple[float, float, float]:
    """(busy CPU seconds of the whole machine from /proc/stat, this process's and its children's, wall)."""
    import resource

    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = (sum(fields[:7]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # user..softirq, no idle, iowait, steal
    own = sum(getattr(resource.getrusage(who), k) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for k in ("ru_utime", "ru_stime"))
    return busy, own, time.perf_counter()


def other_cores(start: tuple[float, float, float]) -> float:
    """Cores that other processes kept busy on average since `start` (0: the machine was ours)."""
    busy, own, wall = (b - a for a, b in zip(start, cpu_seconds()))
    return max(0.0, (busy - own) / wall)


# ---------------------------------------------------------------------------- report


def run(args, command: str) -> dict:
    s = common.resolve(args, DEFAULTS, QUICK)
    if s["repeats"] < 1:
        raise SystemExit("--repeats must be at least 1.")
    parent = s["dir"] or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    try:
        cpu_start = cpu_seconds()
    except OSError:  # no /proc/stat
        cpu_start = None
    cfg = model_config(s)
    common.progress(f"checkpoint: initialising a {cfg.num_params():,}-parameter train state")
    state, abstract = make_state(cfg)
    state_bytes = tree_bytes(state)
    release_memory()
    root = tempfile.mkdtemp(prefix="bench_checkpoint_", dir=parent)
    try:
        common.progress(f"checkpoint: warm-up save and restore in {root}")
        warm_dir = os.path.join(root, "warmup")
        ckpt = checkpointer(warm_dir, async_save=True)
        ckpt.save(STEP, state=state, **save_args(cfg.num_params()))
        ckpt.close()
        timed_restore(warm_dir, abstract)
        shutil.rmtree(warm_dir)
        release_memory()

        dd_runs, runs = [], []
        for index in range(s["repeats"]):
            common.progress(f"checkpoint: repetition {index}: dd")
            dd_runs.append(dd_speeds(root, s["dd_mib"]))
            runs.append(repetition(root, index, state, abstract, cfg.num_params()))
        fs = filesystem(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    others = f"{other_cores(cpu_start):.2f}" if cpu_start else "unknown"

    def row(name: str, values: list[float], nbytes: int | None) -> list:
        median = statistics.median(values)
        rate = f"{nbytes / median / 1e9:.2f}" if nbytes else "-"
        return [name, f"{(nbytes or state_bytes) / 1e9:.2f}", f"{median:.2f}", rate,
                " / ".join(f"{v:.2f}" for v in values)]

    dd_bytes = dd_runs[0]["bytes"]
    col = lambda key: [r[key] for r in runs]  # noqa: E731
    rows = [
        row(f"dd write ({dd_runs[0]['write_how']})", [r["write_s"] for r in dd_runs], dd_bytes),
        row(f"dd read ({dd_runs[0]['read_how']})", [r["read_s"] for r in dd_runs], dd_bytes),
        row("save, async_save=False", col("sync_returned_s"), state_bytes),
        row("save, async_save=True: caller blocked", col("async_blocked_s"), None),
        row("save, async_save=True: until wait() returns", col("async_total_s"), state_bytes),
        row("restore, files in the page cache", col("restore_warm_s"), state_bytes),
        row("restore, files dropped from the page cache", col("restore_cold_s"), state_bytes),
    ]
    print(common.header(command))
    print()
    print(common.table(["measurement", "GB", "seconds (median)", "GB/s (median)", "seconds of each run"], rows))
    print()
    warm = [r["cached_before_warm"] for r in runs]
    cold = [r["cached_before_cold"] for r in runs]
    cache = ("" if None in warm + cold else
             f" Resident in the page cache before the restores (fincore): {min(warm):.0%} to {max(warm):.0%} "
             f"for the first, {min(cold):.0%} to {max(cold):.0%} for the second.")
    print(f"State: decoder-only LLaMA style, {cfg.num_params():,} parameters, AdamW (float32 params, mu, nu), "
          f"{len(jax.tree.leaves(state))} arrays, {state_bytes / 1e9:.3f} GB; checkpoint on disk "
          f"{statistics.median(col('disk_bytes')) / 1e9:.3f} GB. 1 GB = 1e9 bytes. "
          f"Synchronous save: `save` returned after {statistics.median(col('sync_returned_s')):.2f} s, "
          f"`wait()` after {statistics.median(col('sync_s')):.2f} s; fsync of every file afterwards took "
          f"{statistics.median(col('fsync_after_sync_s')):.2f} s (median)." + cache)
    print(f"Directory: a temporary directory in {parent} (filesystem: {fs}), deleted afterwards. "
          f"orbax-checkpoint {importlib_metadata.version('orbax-checkpoint')}, "
          f"tensorstore {importlib_metadata.version('tensorstore')}, optax {importlib_metadata.version('optax')}. "
          f"Other processes kept {others} of {os.cpu_count()} cores busy on average during the run. "
          f"Last dd read as dd reported it: {dd_runs[-1]['dd_report']}.")
    print(common.settings_line(s))
    return {"state_bytes": state_bytes, "runs": runs, "dd": dd_runs}
