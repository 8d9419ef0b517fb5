"""storage: checkpoint save/restore and by-index reads on gs:// (a local GCS emulator) beside local disk.

A sanity ratio of the gs:// paths against the local ones in one sitting, not a cloud figure: the
emulator is fake-gcs-server (bench/gcs_emulator.py) on 127.0.0.1 with an in-memory backend,
started for the run and stopped after, sharing the machine's cores with this process; the local
side writes under a fresh temporary directory in --dir (default: $TMPDIR or /tmp), whose files
stay in the page cache. gs:// paths go as a run's do: gcsfs for files, Orbax's own GCS path
(TensorStore) for checkpoint arrays, both pointed at the emulator by $STORAGE_EMULATOR_HOST.

1. Checkpoints: the train state `bench/checkpoint.py` builds (`checkpoint.to_saveable` of a
   decoder's state after one `Trainer.train_step`: float32 params, AdamW moments, counters, plus
   the dropout key), default ~34M parameters, ~0.4 GB. `Checkpointer(..., async_save=True)`:
   seconds from `save` until `wait()` returned (the step committed), then `restore` into the
   abstract state until every array is ready. One untimed save and restore on each side first;
   then --repeats rounds, local then gs://, each to a new model directory deleted after.
   MB/s = the state's bytes (1 MB = 1e6 bytes) over the seconds.
2. Reading by index: the Python standard library (--quick: its json and urllib packages)
   prepared once locally (`input_pipeline`'s corpus; or --data_dir, read in place), each file
   copied to gs:// with `storage.copy` (the upload's MB/s is shown). Each round, on each side, an
   `IndexedBatchIterator` (packed rows of --seq_len, --batch_size rows) takes one batch untimed,
   then --batches batches are timed; every batch must equal the local one. tokens/s counts
   every row position (as `input_pipeline`); MB/s counts the records' bytes the reader fetched
   (each a ranged read on gs://, CRC-checked).

The tables show the median of the rounds and every round, and the ratio gs:// / local of the
medians; the note gives the load average before and after (other processes share the machine).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid

import numpy as np

from bench import checkpoint as checkpoint_bench
from bench import common, gcs_emulator, input_pipeline

DEFAULTS = {"emb_dim": 512, "num_layers": 8, "num_heads": 8, "head_dim": 64, "mlp_dim": 1408, "vocab_size": 8192,
            "repeats": 3, "seq_len": 256, "batch_size": 16, "batches": 100, "dir": None, "data_dir": None}
QUICK = {"emb_dim": 128, "num_layers": 2, "num_heads": 2, "head_dim": 64, "mlp_dim": 256, "vocab_size": 1024,
         "repeats": 1, "batches": 5}
BUCKET = "t5x-lite-bench"
SIDES = ("local", "gs://")


def add_arguments(parser) -> None:
    for key in ("emb_dim", "num_layers", "num_heads", "head_dim", "mlp_dim", "vocab_size", "repeats", "seq_len",
                "batch_size", "batches"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]} (--quick: {QUICK.get(key, '-')})")
    parser.add_argument("--dir", help="where the local temporary directory is made (default: $TMPDIR or /tmp)")
    parser.add_argument("--data_dir", help="a local prepared directory to read (and copy to gs://) instead of "
                                           "preparing one, e.g. data/python_stdlib")


# ---------------------------------------------------------------------------- checkpoints


def checkpoint_rounds(bases: dict[str, str], s: dict) -> tuple[dict, int, int]:
    """({side: {"save_s": [...], "restore_s": [...]}}, the state's bytes, its parameters)."""
    cfg = checkpoint_bench.model_config(s)
    common.progress(f"storage: initialising a {cfg.num_params():,}-parameter train state")
    state, abstract = checkpoint_bench.make_state(cfg)
    nbytes = checkpoint_bench.tree_bytes(state)
    from t5x_lite import storage

    def one(side: str, name: str) -> tuple[float, float]:
        model_dir = storage.join(bases[side], name)
        _, save_s = checkpoint_bench.timed_save(model_dir, state, cfg.num_params(), async_save=True)
        restore_s = checkpoint_bench.timed_restore(model_dir, abstract)
        storage.remove_tree(model_dir)
        return save_s, restore_s

    for side in SIDES:
        common.progress(f"storage: warm-up checkpoint save and restore, {side}")
        one(side, "ckpt_warmup")
    out = {side: {"save_s": [], "restore_s": []} for side in SIDES}
    for index in range(s["repeats"]):
        for side in SIDES:
            save_s, restore_s = one(side, f"ckpt_{index}")
            out[side]["save_s"].append(save_s)
            out[side]["restore_s"].append(restore_s)
            common.progress(f"storage: checkpoint round {index}, {side}: save {save_s:.2f} s, "
                            f"restore {restore_s:.2f} s")
    return out, nbytes, cfg.num_params()


# ---------------------------------------------------------------------------- reading by index


def upload(local_dir: str, remote: str) -> tuple[float, int]:
    """(seconds, bytes) of `storage.copy` of every file of `local_dir` to `remote`."""
    from t5x_lite import storage

    paths = [os.path.join(root, name) for root, _, names in os.walk(local_dir) for name in names]
    start = time.perf_counter()
    for path in sorted(paths):
        storage.copy(path, storage.join(remote, os.path.relpath(path, local_dir)))
    return time.perf_counter() - start, sum(os.path.getsize(p) for p in paths)


def counting_reads(iterator) -> list[int]:
    """Makes every task's record reader of `iterator` add the bytes it returns to the one-item list returned."""
    fetched = [0]
    for task in iterator.plan.tasks:
        records = task.records
        read = records.read

        def counted(keys, read=read):
            data = read(keys)
            fetched[0] += sum(len(d) for d in data)
            return data

        records.read = counted
    return fetched


def read_round(task: str, s: dict) -> tuple[float, int, list[dict]]:
    """(seconds of --batches batches after the first, record bytes fetched for them, the batches)."""
    iterator = input_pipeline.indexed_iterator_for(task, s)
    try:
        fetched = counting_reads(iterator)
        next(iterator)
        start_bytes = fetched[0]
        start = time.perf_counter()
        batches = [next(iterator) for _ in range(s["batches"])]
        seconds = time.perf_counter() - start
        # The reader reads one batch ahead in a thread: the bytes are the timed batches' give or take one batch.
        return seconds, fetched[0] - start_bytes, batches
    finally:
        iterator.close()


def read_rounds(bases: dict[str, str], root: str, s: dict) -> tuple[dict, dict]:
    """({side: {"seconds": [...], "bytes": [...]}}, the corpus and upload's figures)."""
    from t5x_lite.data import task_factories
    from t5x_lite.data.records import prepared_dataset

    if s["data_dir"]:
        data_dir = os.path.abspath(s["data_dir"])
        source = f"{s['data_dir']}, prepared from {prepared_dataset.read_metadata(data_dir)['sources']}"
    else:
        common.progress("storage: preparing the corpus locally")
        data_dir = os.path.join(root, "data")
        prepared = input_pipeline.prepare_corpus(data_dir, s["quick"])
        source = f"{prepared['input_mb']:,.1f} MB of text prepared"
    remote = f"{bases['gs://']}/data"
    common.progress(f"storage: copying it to {remote}")
    upload_s, upload_bytes = upload(data_dir, remote)
    tasks = {side: task_factories.lm_task(name=f"bench_storage_{i}_{uuid.uuid4().hex[:8]}", data_dir=d)
             for i, (side, d) in enumerate((("local", data_dir), ("gs://", remote)))}
    out = {side: {"seconds": [], "bytes": []} for side in SIDES}
    for index in range(s["repeats"]):
        reference = None
        for side in SIDES:
            seconds, nbytes, batches = read_round(tasks[side], s)
            if reference is None:
                reference = batches
            else:
                for got, want in zip(batches, reference):
                    for key in want:
                        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{side} batch differs: {key}")
            out[side]["seconds"].append(seconds)
            out[side]["bytes"].append(nbytes)
            common.progress(f"storage: read round {index}, {side}: {seconds:.2f} s, {nbytes / 1e6:.1f} MB")
    corpus = {"upload_s": upload_s, "upload_bytes": upload_bytes, "source": source}
    return out, corpus


# ---------------------------------------------------------------------------- report


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def measure(s: dict, root: str) -> dict:
    from t5x_lite import storage

    with gcs_emulator.running(os.path.join(root, "emulator.log"), bucket=BUCKET) as url:
        saved = {k: os.environ.get(k) for k in gcs_emulator.environment(url)}
        os.environ.update(gcs_emulator.environment(url))
        try:
            prefix = f"gs://{BUCKET}/{uuid.uuid4().hex[:8]}"
            bases = {"local": os.path.join(root, "local"), "gs://": prefix}
            os.makedirs(bases["local"])
            storage.check_bucket(prefix)
            ckpt, state_bytes, num_params = checkpoint_rounds(bases, s)
            reads, corpus = read_rounds(bases, root, s)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return {"checkpoint": ckpt, "state_bytes": state_bytes, "num_params": num_params, "read": reads, **corpus}


def run(args, command: str) -> dict:
    from t5x_lite.data.records import prepared_dataset

    s = {"quick": args.quick, **common.resolve(args, DEFAULTS, QUICK)}
    if s["data_dir"] and prepared_dataset.read_metadata(s["data_dir"]) is None:
        raise SystemExit(f"--data_dir={s['data_dir']}: no prepared dataset there (no metadata.json)")
    load_before = loadavg()
    root = tempfile.mkdtemp(prefix="bench_storage_", dir=s["dir"])
    try:
        result = measure(s, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_after = loadavg()
    tokens = s["batches"] * s["batch_size"] * s["seq_len"]
    rows, summary = [], {}

    def add(what: str, side: str, seconds: list[float], nbytes: list[int] | int, count: int | None = None):
        median = statistics.median(seconds)
        per = [nbytes] * len(seconds) if isinstance(nbytes, int) else nbytes
        mb_s = statistics.median(b / t for b, t in zip(per, seconds)) / 1e6
        rate = f"{count / median:,.0f}" if count else "-"
        rows.append([what, side, f"{median:.3f}", f"{mb_s:,.1f}", rate, ", ".join(f"{t:.3f}" for t in seconds)])
        summary[(what, side)] = {"seconds": median, "mb_per_s": mb_s,
                                 **({"tokens_per_s": count / median} if count else {})}

    for what, key in (("checkpoint save until committed", "save_s"), ("checkpoint restore", "restore_s")):
        for side in SIDES:
            add(what, side, result["checkpoint"][side][key], result["state_bytes"])
    for side in SIDES:
        add(f"read {s['batches']} batches by index", side, result["read"][side]["seconds"],
            result["read"][side]["bytes"], tokens)

    print(common.header(command))
    print()
    print(f"train state: {result['num_params']:,} parameters + AdamW, {result['state_bytes'] / 1e6:,.0f} MB; "
          f"corpus: {result['source']}, {result['upload_bytes'] / 1e6:,.1f} MB of files, copied to gs:// in "
          f"{result['upload_s']:.2f} s ({result['upload_bytes'] / result['upload_s'] / 1e6:,.1f} MB/s); "
          f"batches of {s['batch_size']} x {s['seq_len']}")
    print()
    print(common.table(["operation", "where", "median s", "MB/s", "tokens/s", "every round, s"], rows))
    print()
    ratios = []
    for what in dict.fromkeys(r[0] for r in rows):
        ratio = summary[(what, "gs://")]["seconds"] / summary[(what, "local")]["seconds"]
        summary[(what, "ratio")] = ratio
        ratios.append(f"{what}: {ratio:.2f}x")
    print("gs:// seconds / local seconds (medians): " + "; ".join(ratios))
    print(f"gs:// is fake-gcs-server on 127.0.0.1 (in-memory backend) on the same cores: a sanity ratio, not a "
          f"cloud figure; local files stay in the page cache. Load average (1, 5, 15 min) before: {load_before}; "
          f"after: {load_after}; median of {s['repeats']} rounds")
    print(common.settings_line(s))
    return {"settings": s, "summary": summary, "load_before": load_before, "load_after": load_after, **result}
