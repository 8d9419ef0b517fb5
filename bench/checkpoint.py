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
5. The manifest (t5x_lite/checkpoints/manifest.py), timed apart: `manifest.write` again on the
   synchronous save's step (its files in the page cache, as in a save right after Orbax's
   commit), and `manifest.check` of every file's CRC32C before each restore of step 4, with the
   files in the page cache and after dropping them (then dropped again for the restore). Its
   share is of the operation that includes it: write / synchronous save (whose seconds include
   one write), check / (check + restore), the verified restore every reader runs. Next to it,
   CRC32C of CRC32C_MIB MiB already in memory: the checksum's own speed, without file reads.

Each save goes to a new model directory (one step in it), as a run's first checkpoint; one
untimed save and restore first warms up Orbax. GB/s = the state's bytes (1 GB = 1e9 bytes) over
the seconds; the table shows the median of --repeats repetitions and every run. Orbax writes
the arrays zstd-compressed (its default), so the files are smaller than the state; the note
under the table gives both sizes, and how many cores other processes kept busy meanwhile.
The manifest's rows count GB/s over the files' bytes on disk (what CRC32C reads); the note says
whether manifest.write stayed under GOAL_SHARE (5%) of the synchronous save's seconds.
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
GOAL_SHARE = 0.05
CRC32C_MIB = 256


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


def crc32c_in_memory_s(mib: int) -> float:
    """Seconds of CRC32C (google_crc32c, as manifest.py takes it) over `mib` MiB of random bytes
    already in memory, in the manifest's chunks: the checksum's own speed, without the file reads."""
    import google_crc32c

    from t5x_lite.checkpoints import manifest

    chunk_mib = manifest._CHUNK // common.MIB
    chunks = [os.urandom(manifest._CHUNK) for _ in range(max(1, mib // chunk_mib))]
    start = time.perf_counter()
    checksum = google_crc32c.Checksum()
    for chunk in chunks:
        checksum.update(chunk)
    return time.perf_counter() - start


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

    return Checkpointer(model_dir, retention=RetentionPolicy(keep_last=1), async_save=async_save)


def save_args(num_params: int) -> dict:
    return {"iterator_state": {"epoch": 0, "batches_taken": STEP},
            "metadata": {"bench": "checkpoint", "num_params": num_params}, "config_text": "", "metrics": None}


def step_dir(model_dir: str) -> str:
    from t5x_lite.checkpoints.checkpoint import checkpoints_dir

    return os.path.join(checkpoints_dir(model_dir), str(STEP))


def timed_restore(model_dir: str, abstract: dict) -> float:
    from t5x_lite.checkpoints.checkpoint import Checkpointer

    ckpt = Checkpointer(model_dir, read_only=True, async_save=False)
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


def timed_manifest_write(directory: str) -> tuple[float, int, int]:
    """(seconds of `manifest.write` over a committed step, the manifest's bytes, files it lists).

    Rewrites the manifest the save wrote, and checks that it came out the same.
    """
    from t5x_lite.checkpoints import manifest

    path = os.path.join(directory, manifest.MANIFEST)
    with open(path) as f:
        saved = f.read()
    written, seconds = common.timed(lambda: manifest.write(directory, step=STEP))
    with open(path) as f:
        if f.read() != saved:
            raise RuntimeError(f"manifest.write over {directory} differs from the one the save wrote")
    return seconds, os.path.getsize(path), len(written["files"])


def timed_manifest_check(directory: str) -> float:
    from t5x_lite.checkpoints import manifest

    found, seconds = common.timed(lambda: manifest.check(directory, step=STEP))
    if found.state != manifest.GOOD:
        raise RuntimeError(f"manifest.check: {found.describe()}")
    return seconds


def repetition(root: str, index: int, state: dict, abstract: dict, num_params: int) -> dict:
    """One of each measurement; the model directories are deleted at the end."""
    sync_dir, async_dir = os.path.join(root, f"sync_{index}"), os.path.join(root, f"async_{index}")
    sync_step, async_step = step_dir(sync_dir), step_dir(async_dir)
    out = {}
    try:
        common.progress(f"checkpoint: repetition {index}: synchronous save, manifest write")
        out["sync_returned_s"], out["sync_s"] = timed_save(sync_dir, state, num_params, async_save=False)
        _, out["fsync_after_sync_s"] = common.timed(lambda: fsync_files(sync_step))
        out["manifest_write_s"], out["manifest_bytes"], out["manifest_files"] = timed_manifest_write(sync_step)
        common.progress(f"checkpoint: repetition {index}: asynchronous save")
        out["async_blocked_s"], out["async_total_s"] = timed_save(async_dir, state, num_params, async_save=True)

        common.progress(f"checkpoint: repetition {index}: check and restore (page cache, then disk)")
        release_memory()
        out["cached_before_warm"] = cached_fraction(async_step)
        out["check_warm_s"] = timed_manifest_check(async_step)
        out["restore_warm_s"] = timed_restore(async_dir, abstract)
        release_memory()
        drop_from_page_cache(sync_step)
        out["cached_before_check_cold"] = cached_fraction(sync_step)
        out["check_cold_s"] = timed_manifest_check(sync_step)
        drop_from_page_cache(sync_step)  # the check read every file back into the page cache
        out["cached_before_cold"] = cached_fraction(sync_step)
        out["restore_cold_s"] = timed_restore(sync_dir, abstract)
        out["disk_bytes"] = du_bytes(sync_step)
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


def manifest_shares(runs: list[dict]) -> list[tuple[str, list[float], list[float]]]:
    """(row, the manifest's seconds of each run, their share of the operation that includes them)."""
    def share(part: str, whole: str, *, add: bool) -> tuple[list[float], list[float]]:
        return [r[part] for r in runs], [r[part] / (r[whole] + (r[part] if add else 0.0)) for r in runs]

    return [("write / synchronous save (which includes one write)", *share("manifest_write_s", "sync_returned_s",
                                                                          add=False)),
            ("write / asynchronous save until wait()", *share("manifest_write_s", "async_total_s", add=False)),
            ("check / (check + restore), page cache", *share("check_warm_s", "restore_warm_s", add=True)),
            ("check / (check + restore), dropped from the page cache", *share("check_cold_s", "restore_cold_s",
                                                                             add=True))]


def manifest_note(runs: list[dict], shares: list) -> str:
    """The manifest's size, and whether the issue's goal (under GOAL_SHARE of the save) was met."""
    median = lambda key: statistics.median(r[key] for r in runs)
    write_share = statistics.median(shares[0][2])
    sync_s, write_s = median("sync_returned_s"), median("manifest_write_s")
    if write_share < GOAL_SHARE:
        verdict = f"met: manifest.write is {write_share:.1%} of the synchronous save"
    else:
        verdict = (f"missed by {(write_share - GOAL_SHARE) * 100:.1f} percentage points: manifest.write is "
                   f"{write_share:.1%} of the synchronous save; {GOAL_SHARE:.0%} would need it under "
                   f"{GOAL_SHARE / (1 - GOAL_SHARE) * (sync_s - write_s):.2f} s, not {write_s:.2f} s")
    checks = " and ".join(f"{statistics.median(share):.1%}" for _, _, share in shares[2:])
    return (f"Manifest: {median('manifest_bytes'):,.0f} bytes of JSON listing {median('manifest_files'):,.0f} files "
            f"(size and CRC32C of each). Goal (the manifest under {GOAL_SHARE:.0%} of the save's seconds): "
            f"{verdict}. A verified restore spends {checks} of its seconds in manifest.check (files in the page "
            "cache, dropped from it; measured apart: a check from disk leaves the files in the page cache for "
            "the restore after it).")


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
            runs[-1]["crc32c_memory_s"] = crc32c_in_memory_s(CRC32C_MIB)
            # Each repetition's seconds as they come, so a run cut short still reports what it measured.
            common.progress(f"checkpoint: repetition {index} seconds: " + ", ".join(
                f"{k}={v:.2f}" for k, v in {**dd_runs[-1], **runs[-1]}.items() if isinstance(v, float)))
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
    disk_bytes = int(statistics.median(col("disk_bytes")))
    rows = [
        row(f"dd write ({dd_runs[0]['write_how']})", [r["write_s"] for r in dd_runs], dd_bytes),
        row(f"dd read ({dd_runs[0]['read_how']})", [r["read_s"] for r in dd_runs], dd_bytes),
        row("save, async_save=False", col("sync_returned_s"), state_bytes),
        row("save, async_save=True: caller blocked", col("async_blocked_s"), None),
        row("save, async_save=True: until wait() returns", col("async_total_s"), state_bytes),
        row("restore, files in the page cache", col("restore_warm_s"), state_bytes),
        row("restore, files dropped from the page cache", col("restore_cold_s"), state_bytes),
        row(f"CRC32C of {CRC32C_MIB} MiB in memory", col("crc32c_memory_s"), CRC32C_MIB * common.MIB),
        row("manifest.write, files in the page cache", col("manifest_write_s"), disk_bytes),
        row("manifest.check, files in the page cache", col("check_warm_s"), disk_bytes),
        row("manifest.check, files dropped from the page cache", col("check_cold_s"), disk_bytes),
    ]
    shares = manifest_shares(runs)
    print(common.header(command))
    print()
    print(common.table(["measurement", "GB", "seconds (median)", "GB/s (median)", "seconds of each run"], rows))
    print()
    print(common.table(["manifest's share", "seconds (median)", "share (median)", "share of each run"],
                       [[name, f"{statistics.median(part):.2f}", f"{statistics.median(share):.1%}",
                         " / ".join(f"{v:.1%}" for v in share)] for name, part, share in shares]))
    print()
    warm, cold, check_cold = col("cached_before_warm"), col("cached_before_cold"), col("cached_before_check_cold")
    cache = ("" if None in warm + cold + check_cold else
             f" Resident in the page cache before the restores (fincore): {min(warm):.0%} to {max(warm):.0%} "
             f"for the first, {min(cold):.0%} to {max(cold):.0%} for the second; before the check from disk "
             f"{min(check_cold):.0%} to {max(check_cold):.0%}.")
    print(f"State: decoder-only LLaMA style, {cfg.num_params():,} parameters, AdamW (float32 params, mu, nu), "
          f"{len(jax.tree.leaves(state))} arrays, {state_bytes / 1e9:.3f} GB; checkpoint on disk "
          f"{disk_bytes / 1e9:.3f} GB. 1 GB = 1e9 bytes. "
          f"Synchronous save: `save` returned after {statistics.median(col('sync_returned_s')):.2f} s, "
          f"`wait()` after {statistics.median(col('sync_s')):.2f} s; fsync of every file afterwards took "
          f"{statistics.median(col('fsync_after_sync_s')):.2f} s (median)." + cache)
    print(manifest_note(runs, shares))
    print(f"Directory: a temporary directory in {parent} (filesystem: {fs}), deleted afterwards. "
          f"orbax-checkpoint {importlib_metadata.version('orbax-checkpoint')}, "
          f"tensorstore {importlib_metadata.version('tensorstore')}, optax {importlib_metadata.version('optax')}. "
          f"Other processes kept {others} of {os.cpu_count()} cores busy on average during the run. "
          f"Last dd read as dd reported it: {dd_runs[-1]['dd_report']}.")
    print(common.settings_line(s))
    return {"state_bytes": state_bytes, "runs": runs, "dd": dd_runs}
