"""e2e: the whole CLI as a user runs it, on any backend: prepare, train, kill -9, resume, eval, sample, infer.

Every step is a `t5x-lite` command in its own process (`python -m t5x_lite.cli`), as a user
would type it:

1. `prepare`: the Python standard library's json and urllib packages (--quick; else the whole
   library) into a vocabulary and sharded TFRecords with their index.
2. `train` to --steps steps, a checkpoint every --checkpoint_period steps: once uninterrupted
   (run A), and once killed with SIGKILL (kill -9) at the first report after its first committed
   checkpoint and run again with the same command, which resumes from that checkpoint (run B).
   The final parameters of A and B must be bitwise equal; the report says so, and the command
   exits non-zero when they are not.
3. `eval` (strided perplexity of the validation split), `sample` (one prompt) and `infer` (a jsonl
   of prompts, greedy) on run A's checkpoint.

Measured: the seconds from `train`'s launch to its "step 0" line (start-up: imports, config,
data, model, compile of the first check); the loop's tokens/s (the median of run A's reports
after the first, which holds the compile) against the same jitted train step called alone on one
batch of the same shape in this process (`Trainer.train_step`, compiled ahead; median of windows
after warm-up); the loop's blocked seconds per checkpoint (what its "loop blocked" lines print);
eval tokens/s (the tokens `eval`'s strided perplexity scores over its seconds, 16 validation
documents, after a warm-up pass) and decode tokens/s (new tokens over seconds of one greedy
`decoding.generate_batch`, after a warm-up call), both in this process on run A's checkpoint;
and each command's wall seconds.

The model is runs/quickstart.gin's tiny decoder unless --model names a gin/models file (e.g.
gpt2_125m, for a GPU); its vocabulary size is set to the prepared one's. Runs in a temporary
directory (--dir) that is removed afterwards.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench import common

DEFAULTS = {"model": None, "steps": 60, "checkpoint_period": 20, "batch_size": 16, "seq_len": 256,
            "vocab_size": 4096, "decode_tokens": 64, "windows": 3, "window_steps": 5, "dir": None}
QUICK = {"steps": 12, "checkpoint_period": 4, "batch_size": 4, "seq_len": 64, "vocab_size": 512,
         "decode_tokens": 16, "windows": 2, "window_steps": 2}
PROMPTS = ("def ", "import ", "class Parser", "return ")


def add_arguments(parser) -> None:
    parser.add_argument("--model", help="a gin/models file's name (default: runs/quickstart.gin's tiny decoder)")
    for key in ("steps", "checkpoint_period", "batch_size", "seq_len", "vocab_size", "decode_tokens", "windows",
                "window_steps"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]} (--quick: {QUICK.get(key, '-')})")
    parser.add_argument("--dir", help="where the temporary directory goes (default $TMPDIR or /tmp)")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "t5x_lite.cli", *args]


def run_command(argv: list[str], *, kill_after: re.Pattern | None = None) -> dict:
    """Runs `argv`, its stdout read line by line with the time each line came; with `kill_after`,
    sends SIGKILL at the first line matching it. Returns lines, times, seconds, return code."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines, times, killed = [], [], False
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        times.append(time.perf_counter() - start)
        if kill_after is not None and not killed and kill_after.search(line):
            process.send_signal(signal.SIGKILL)
            killed = True
    code = process.wait()
    return {"lines": lines, "times": times, "seconds": time.perf_counter() - start, "code": code, "killed": killed}


def require(result: dict, what: str) -> None:
    if result["code"] != 0 and not result["killed"]:
        tail = "\n".join(result["lines"][-30:])
        raise SystemExit(f"e2e: {what} failed (exit {result['code']}):\n{tail}")


def first_time(result: dict, pattern: str) -> float | None:
    return next((t for line, t in zip(result["lines"], result["times"]) if re.search(pattern, line)), None)


def loop_tokens_per_second(result: dict) -> float:
    """The median tok/s of a run's reports after the first (which holds the compile)."""
    rates = [float(m.group(1)) for line in result["lines"] if (m := re.search(r"tok/s=([\d.e+]+)", line))]
    return statistics.median(rates[1:] or rates)


def blocked_seconds(result: dict) -> list[float]:
    return [float(m.group(1)) for line in result["lines"] if (m := re.search(r"loop blocked ([\d.]+) s", line))]


def final_params_equal(a, b) -> tuple[bool, int]:
    """Whether two restored checkpoints hold bitwise-equal parameters; and the first's step."""
    import jax
    import numpy as np

    leaves_a, leaves_b = jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)
    same = a.step == b.step and len(leaves_a) == len(leaves_b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves_a, leaves_b))
    return same, a.step


def jitted_step_tokens_per_second(restored, s: dict) -> float:
    """Tokens/s of the run's own jitted train step called alone on one batch of its shape."""
    import jax

    config = restored.config
    trainer = common.make_trainer(config)
    batch = common.make_batch(config, batch=s["batch_size"], length=s["seq_len"])
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    step = common.compile_train_step(trainer, batch).compiled
    placed = common.global_batch(trainer, batch)
    rng = jax.random.PRNGKey(1)
    _, _, _, per_step = common.timed_steps(step, state, placed, rng, warmup=2, windows=s["windows"],
                                           steps=s["window_steps"])
    return s["batch_size"] * s["seq_len"] / statistics.median(per_step)


def eval_tokens_per_second(restored, data_dir: str, s: dict) -> tuple[float, int]:
    """Scored tokens/s of `eval`'s strided perplexity over the first 16 validation documents (after a
    warm-up pass, which compiles), and the tokens scored."""
    from t5x_lite.data import task_access, task_factories
    from t5x_lite.data.vocab import tokenizer_files
    from t5x_lite.evaluation import perplexity as perplexity_eval

    name = task_factories.lm_task(name="e2e_lm", data_dir=data_dir)
    documents = task_access.split_documents(name, "validation", max_tokens=65536, limit=16)
    bos_id = tokenizer_files.decoder_start_id(restored.vocabulary())

    def score() -> dict:
        return perplexity_eval.perplexity(model=restored.config, params=restored.params, documents=documents,
                                          context_length=s["seq_len"], stride=s["seq_len"] // 2, batch_size=16,
                                          placement=restored.placement, bos_id=bos_id)

    score()
    start = time.perf_counter()
    tokens = score()["tokens"]
    return tokens / (time.perf_counter() - start), int(tokens)


def decode_tokens_per_second(restored, s: dict) -> float:
    """New tokens/s of one greedy batch of the prompts (after a warm-up call of the same shapes)."""
    import jax

    from t5x_lite.data.vocab import tokenizer_files
    from t5x_lite.inference import decoding

    vocabulary = restored.vocabulary()
    prompts = [list(vocabulary.encode(p)) for p in PROMPTS]

    def generate():
        tokens = decoding.generate_batch(model=restored.config, params=restored.params, prompts=prompts,
                                         max_new_tokens=s["decode_tokens"], rng=jax.random.PRNGKey(0),
                                         temperature=0.0, placement=restored.placement,
                                         bos_id=tokenizer_files.decoder_start_id(vocabulary),
                                         zero_is_token=tokenizer_files.zero_is_token(vocabulary))
        return sum(len(t) for t in tokens)

    generate()
    start = time.perf_counter()
    new_tokens = generate()
    return new_tokens / (time.perf_counter() - start)


def run(args, command: str) -> dict:
    s = common.resolve(args, DEFAULTS, QUICK)
    with tempfile.TemporaryDirectory(prefix="t5x_lite_e2e_", dir=s["dir"]) as tmp:
        return _run(s, command, tmp, quick=args.quick)


def _run(s: dict, command: str, tmp: str, *, quick: bool) -> dict:
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    data = os.path.join(tmp, "data")
    inputs = [os.path.join(stdlib, "json"), os.path.join(stdlib, "urllib")] if quick else ["python_stdlib"]
    common.progress("e2e: prepare")
    prepared = run_command(cli("prepare", *(f"--input={i}" for i in inputs), f"--out={data}",
                               f"--vocab_size={s['vocab_size']}", "--num_shards=2",
                               *(["--validation_fraction=0.27"] if quick else [])))  # 10 files: 1 in validation
    require(prepared, "prepare")
    vocab_size = json.load(open(os.path.join(data, "metadata.json")))["vocab_size"]

    model_files = [f"--gin_file=models/{s['model']}.gin"] if s["model"] else []
    train_flags = ["--gin_file=runs/quickstart.gin", *model_files, f"--gin.DATA_DIR='{data}'",
                   f"--gin.DecoderConfig.vocab_size={vocab_size}", f"--gin.TRAIN_STEPS={s['steps']}",
                   f"--gin.BATCH_SIZE={s['batch_size']}", f"--gin.SEQUENCE_LENGTH={s['seq_len']}",
                   f"--gin.train.checkpoint_period={s['checkpoint_period']}",
                   f"--gin.train.log_period={s['checkpoint_period'] // 2 or 1}",
                   f"--gin.train.eval_period={s['steps']}", "--gin.train.eval_batches=4",
                   "--gin.train.sample_prompt=None", "--gin.train.peak_flops_per_device=None"]
    dir_a, dir_b = os.path.join(tmp, "run_a"), os.path.join(tmp, "run_b")
    common.progress("e2e: train (uninterrupted)")
    run_a = run_command(cli("train", *train_flags, f"--gin.MODEL_DIR='{dir_a}'"))
    require(run_a, "train (uninterrupted)")
    common.progress("e2e: train, kill -9 after the first checkpoint, resume")
    first_saved = rf"step {s['checkpoint_period']}: checkpoint saved"
    killed = run_command(cli("train", *train_flags, f"--gin.MODEL_DIR='{dir_b}'"),
                         kill_after=re.compile(first_saved))
    resumed = run_command(cli("train", *train_flags, f"--gin.MODEL_DIR='{dir_b}'"))
    require(resumed, "train (resumed)")
    resumed_from = next((m.group(1) for line in resumed["lines"] if (m := re.search(r"[Rr]esum\w* .*?step (\d+)", line))),
                        None)
    from t5x_lite.checkpoints import restored_model

    restored_a = restored_model.restore(dir_a)  # run A's final checkpoint, read once for every figure below
    equal, final_step = final_params_equal(restored_a, restored_model.restore(dir_b))

    common.progress("e2e: eval, sample, infer")
    evaluated = run_command(cli("eval", "--gin_file=runs/quickstart_eval.gin", f"--gin.DATA_DIR='{data}'",
                                f"--gin.MODEL_DIR='{dir_a}'", "--gin.PerplexityEval.max_documents=16",
                                f"--gin.PerplexityEval.context_length={s['seq_len']}",
                                f"--gin.PerplexityEval.stride={s['seq_len'] // 2}"))
    require(evaluated, "eval")
    sampled = run_command(cli("sample", f"--model_dir={dir_a}", "--prompt=def ",
                              f"--max_new_tokens={s['decode_tokens']}"))
    require(sampled, "sample")
    prompts = os.path.join(tmp, "prompts.jsonl")
    with open(prompts, "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    output = os.path.join(tmp, "infer.jsonl")
    inferred = run_command(cli("infer", "--gin_file=runs/infer.gin", f"--gin.CHECKPOINT_PATH='{dir_a}'",
                               f"--gin.PROMPTS='{prompts}'", f"--gin.OUTPUT='{output}'",
                               f"--gin.DecodingConfig.max_decode_length={s['decode_tokens']}"))
    require(inferred, "infer")
    with open(output) as f:
        outputs = [json.loads(line) for line in f]

    common.progress("e2e: the jitted step alone, decoding")
    step_rate = jitted_step_tokens_per_second(restored_a, s)
    loop_rate = loop_tokens_per_second(run_a)
    eval_rate, eval_tokens = eval_tokens_per_second(restored_a, data, s)
    decode_rate = decode_tokens_per_second(restored_a, s)
    blocked = blocked_seconds(run_a)
    rows = [
        ["prepare", f"{prepared['seconds']:.1f}", ""],
        ["train, start-up to step 0", f"{first_time(run_a, r'^step 0:') or float('nan'):.1f}",
         "from launch to the 'step 0' line"],
        ["train (A), uninterrupted", f"{run_a['seconds']:.1f}", f"{s['steps']} steps"],
        ["train (B), killed with SIGKILL", f"{killed['seconds']:.1f}",
         f"killed after '{first_saved}'" if killed["killed"] else "NOT killed (it ended first)"],
        ["train (B), resumed", f"{resumed['seconds']:.1f}", f"resumed from step {resumed_from}"],
        ["eval", f"{evaluated['seconds']:.1f}", "strided perplexity of 16 validation documents"],
        ["sample", f"{sampled['seconds']:.1f}", ""],
        ["infer", f"{inferred['seconds']:.1f}", f"{len(outputs)} prompts answered"],
    ]
    figures = [
        ["loop tokens/s (run A, median report after the first)", f"{loop_rate:,.0f}"],
        ["the jitted train step alone, tokens/s", f"{step_rate:,.0f}"],
        ["loop / step", f"{loop_rate / step_rate:.1%}"],
        ["loop blocked per checkpoint, s (median)", f"{statistics.median(blocked):.3f}" if blocked else "-"],
        [f"eval tokens/s (strided perplexity, {eval_tokens:,} tokens)", f"{eval_rate:,.0f}"],
        [f"decode tokens/s (greedy, {len(PROMPTS)} prompts)", f"{decode_rate:,.0f}"],
        ["final params of A and B bitwise equal", f"{equal} (step {final_step})"],
    ]
    print(common.header(command))
    print(common.table(["command", "seconds", "note"], rows))
    print()
    print(common.table(["figure", "value"], figures))
    print()
    print(common.settings_line(s))
    if not (equal and killed["killed"] and len(outputs) == len(PROMPTS)):
        raise SystemExit("e2e: FAILED: " + ("the resumed run's parameters differ from the uninterrupted run's"
                                            if not equal else "the kill or infer step did not happen as planned"))
    return {"equal": equal, "loop_tokens_per_second": loop_rate, "step_tokens_per_second": step_rate,
            "decode_tokens_per_second": decode_rate, "startup_seconds": first_time(run_a, r"^step 0:")}
