"""loop_overhead: step-time overhead of the loop itself (metrics, logging, iterator) vs. the bare jitted step.

Targets: the loop must add under 2% to `Trainer.train_step`, and `Trainer.train_step` must be
at least 95% as fast as a bare jitted step of the same model. Three rows, one model
(`throughput.model_config("llama", "float32")` at throughput's sizes, vocab_size = the prepared
corpus's vocabulary) and one batch shape (--batch_size packed rows of --seq_len, as pretraining
packs them):

1. bare jitted step: a hand-written `jax.jit` of model.apply -> weighted
   optax.softmax_cross_entropy_with_integer_labels -> jax.value_and_grad -> optax.adamw ->
   optax.apply_updates, params and opt_state donated, one device, no sharding. AdamW as the
   AdamW defaults (b1, b2, eps, weight decay on matrices) but at a constant learning
   rate (the peak), without the warmup-cosine schedule or gradient clipping.
2. `Trainer.train_step`: `common.make_trainer` and `trainer.train_step(state, batch, rng)`, as
   `throughput` runs it.
3. `training.loop.train`: the real loop in-process (a temporary model_dir, the LM task over the corpus,
   no eval, log_period --steps, train_steps (1 + --windows) x --steps, checkpoint only at the
   end); its speed is the median of the `tok/s` its reports print for the windows after the
   first (which holds the compile): the same `train/tokens_per_second` that `training.loop.train`
   returns for its last window.

Rows 1 and 2 start from the same parameters (the trainer's `init_state`, copied for row 1) and
train on one fixed batch of random tokens, made as `throughput` makes it (--packed_segments
segments per row, with the segment ids and positions packing adds), timed by
`common.timed_steps`: --warmup_steps steps (compile included), then --windows windows of
--steps steps, median seconds per step. tokens/s counts every row position (batch x seq_len),
as `training.loop.train` does. The corpus: --data_dir, else data/python_stdlib when prepared, else one
prepared now as `input_pipeline` prepares it.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import statistics
import sys
import tempfile
import time

from bench import common, input_pipeline, throughput

SIZES = ("emb_dim", "num_layers", "num_heads", "head_dim", "mlp_dim")
DEFAULT_DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                                "python_stdlib")
DEFAULTS = {**{key: throughput.DEFAULTS[key] for key in SIZES}, "seq_len": 256, "batch_size": 8,
            "packed_segments": throughput.DEFAULTS["packed_segments"], "warmup_steps": 2, "windows": 3, "steps": 10,
            "scan_layers": 1, "scan_unroll": 1, "data_dir": None}
QUICK = {**{key: throughput.QUICK[key] for key in SIZES}, "seq_len": throughput.QUICK["seq_len"],
         "warmup_steps": 1, "windows": 2, "steps": 3}
TASK = "bench_loop_overhead_lm"
TARGET_LOOP_OVERHEAD = 0.02  # the loop adds less than this fraction to Trainer.train_step
TARGET_TRAINER_VS_BARE = 0.95  # Trainer.train_step reaches at least this fraction of the bare step's speed


def add_arguments(parser) -> None:
    for key in (*SIZES, "seq_len", "batch_size", "packed_segments", "warmup_steps", "windows", "steps"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--scan_layers", type=int, choices=(0, 1), help="1: scanned layers (default); 0: unrolled")
    parser.add_argument("--scan_unroll", type=int, help="scanned layers per loop iteration (default 1)")
    parser.add_argument("--data_dir", help="a prepared directory to train on (default: data/python_stdlib when "
                                           "prepared, else one prepared now as input_pipeline prepares it)")


# ---------------------------------------------------------------------------- data


def corpus(data_dir: str) -> tuple[str, int]:
    """(name of the LM task registered over `data_dir`, the corpus's vocabulary size)."""
    from t5x_lite.data import task_access, task_factories

    task = task_factories.lm_task(name=TASK, data_dir=data_dir)
    return task, task_access.vocabulary_size(task_access.DataConfig(task))


def fixed_batch(cfg, s: dict) -> dict:
    """The batch of rows 1 and 2: random tokens in packed rows, as `throughput` trains on.

    The features are the ones the LM pipeline gives `training.loop.train` (decoder input and target
    tokens, loss weights, segment ids, positions); only the values differ.
    """
    return common.make_batch(cfg, batch=s["batch_size"], length=s["seq_len"], packed_segments=s["packed_segments"])


def model_config(s: dict):
    """`throughput`'s llama model, float32, at these sizes (s['vocab_size']: the corpus's)."""
    return throughput.model_config("llama", "float32", s)


# ---------------------------------------------------------------------------- rows 1 and 2


def bare_train_step(module, optimizer):
    """The step a user would write: jit(value_and_grad of weighted cross entropy -> AdamW), state donated."""
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(params, batch):
        logits = module.apply({"params": params}, decoder_input_tokens=batch["decoder_input_tokens"],
                              decoder_positions=batch["decoder_positions"],
                              decoder_segment_ids=batch["decoder_segment_ids"])
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["decoder_target_tokens"])
        weights = batch["decoder_loss_weights"].astype(jnp.float32)
        return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)

    def step(state, batch):
        params, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    return jax.jit(step, donate_argnums=(0,))


def bare_optimizer():
    """optax.adamw with AdamW's defaults, at a constant learning rate (the peak)."""
    import optax

    from t5x_lite.training.optim import AdamW, weight_decay_mask

    o = AdamW()
    return optax.adamw(o.learning_rate.peak_learning_rate, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                       mask=weight_decay_mask)


def _timed(step, state, *args, s: dict, loss) -> dict:
    """common.timed_steps after a first step run here, whose loss (before any update) is kept."""
    state, metrics = step(state, *args)
    first_loss = float(loss(metrics))  # waits for the first step
    state, metrics, _, seconds = common.timed_steps(step, state, *args, warmup=s["warmup_steps"] - 1,
                                                    windows=s["windows"], steps=s["steps"])
    del state
    step_s = statistics.median(seconds)
    return {"step_s": step_s, "tokens_per_s": s["batch_size"] * s["seq_len"] / step_s, "first_loss": first_loss,
            "loss": float(loss(metrics)), "steps": s["warmup_steps"] + s["windows"] * s["steps"]}


def init_trainer(cfg, batch: dict):
    """(trainer, initial state) as `throughput` builds them: `common.make_trainer`, `init_state(PRNGKey(0))`."""
    import jax

    trainer = common.make_trainer(cfg)
    return trainer, trainer.init_state(jax.random.PRNGKey(0), batch)


def measure_bare(cfg, batch: dict, s: dict, params) -> dict:
    """Row 1: the bare jitted step on one device, on the fixed batch, from a copy of `params`
    (the trainer's initial parameters, so both rows start from the same model)."""
    import jax
    import numpy as np

    module = cfg.make_module()
    optimizer = bare_optimizer()
    # A private copy (the step donates it), all of the state committed to one device: a step
    # called with uncommitted inputs and then with its own (committed) outputs compiles twice.
    params = jax.tree.map(np.array, jax.device_get(params))
    state = jax.device_put((params, jax.jit(optimizer.init)(params)), jax.devices()[0])
    return _timed(bare_train_step(module, optimizer), state, jax.device_put(batch, jax.devices()[0]), s=s,
                  loss=lambda m: m)


def measure_trainer(batch: dict, s: dict, setup) -> dict:
    """Row 2: `Trainer.train_step` on the fixed batch, as `throughput` runs it (`setup`: from init_trainer)."""
    import jax

    trainer, state = setup
    global_batch = common.global_batch(trainer, batch)
    rng = jax.random.PRNGKey(1)
    return _timed(trainer.train_step, state, global_batch, rng, s=s,
                  loss=lambda m: m["loss_sum"] / m["weight_sum"])


# ---------------------------------------------------------------------------- row 3


class _Tee:
    """Stands in for stdout during `training.loop.train`: its lines go to stderr, kept with the time of each."""

    def __init__(self):
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        if text.strip():
            self.lines.append((time.perf_counter(), text))
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def measure_loop(cfg, task: str, s: dict, model_dir: str) -> dict:
    """Row 3: `training.loop.train` for (1 + --windows) x --steps steps, reporting every --steps; the median
    tokens/s of the windows after the first."""
    from t5x_lite.data import task_access
    from t5x_lite.training import loop as training_loop

    n = s["steps"]
    train_data = task_access.DataConfig(task, split="train", sequence_length=s["seq_len"], batch_size=s["batch_size"],
                                 shuffle=True, pack=True, seed=0)
    log = _Tee()
    with contextlib.redirect_stdout(log):  # the loop's log lines are progress here; stdout is the report
        result = training_loop.train(model_dir=model_dir, model=cfg, train_data=train_data, eval_data=None,
                             train_steps=(1 + s["windows"]) * n, log_period=n, eval_period=0, checkpoint_period=0,
                             progress_bar=False)
    reports = {}  # step -> (time of its log line, tokens/s it printed)
    first_loss = None
    for when, line in log.lines:
        if m := re.search(r"step (\d+): loss=.*tok/s=([-+.\deE]+)", line):
            reports[int(m.group(1))] = (when, float(m.group(2)))
        elif m := re.search(r"step 0: initial loss ([-+.\deE]+)", line):
            first_loss = float(m.group(1))
    windows = [reports[k][1] for k in sorted(reports)]
    tokens_per_s = statistics.median(windows[1:]) if len(windows) > 1 else result["train/tokens_per_second"]
    out = {"tokens_per_s": tokens_per_s, "step_s": s["batch_size"] * s["seq_len"] / tokens_per_s,
           "loss": result["train/loss"], "first_loss": first_loss, "steps": result["step"],
           "last_window_tokens_per_s": result["train/tokens_per_second"],
           "window_tokens_per_s": windows, "wall_tokens_per_s": None}
    last = (1 + s["windows"]) * n
    if n in reports and last in reports:
        # From the step-N log line to the last one: every window after the first, reports included.
        seconds = reports[last][0] - reports[n][0]
        out["wall_tokens_per_s"] = s["windows"] * n * s["batch_size"] * s["seq_len"] / seconds
    return out


# ---------------------------------------------------------------------------- run


def resolve_data_dir(data_dir: str | None, tmp: str, quick: bool) -> tuple[str, str]:
    """(the prepared directory to train on, where it came from)."""
    if data_dir:
        return data_dir, "--data_dir"
    if os.path.exists(os.path.join(DEFAULT_DATA_DIR, "metadata.json")):
        return DEFAULT_DATA_DIR, "the repository's prepared corpus"
    out = os.path.join(tmp, "data")
    common.progress("loop_overhead: no prepared data/python_stdlib; preparing a corpus as input_pipeline does")
    input_pipeline.prepare_corpus(out, quick)
    return out, ("python stdlib json+urllib" if quick else "python stdlib") + ", prepared in a temporary directory"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def run(args, command: str) -> dict:
    s = common.resolve(args, DEFAULTS, QUICK)
    if s["warmup_steps"] < 1 or s["steps"] < 1 or s["windows"] < 1:
        raise SystemExit("--warmup_steps, --steps and --windows must each be at least 1.")
    if s["packed_segments"] < 1:
        raise SystemExit("--packed_segments must be at least 1: training.loop.train reads packed rows (segment ids and "
                         "positions), and rows 1 and 2 take the same features.")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir, data_source = resolve_data_dir(s["data_dir"], tmp, args.quick)
        s["data_dir"] = os.path.relpath(data_dir) if not os.path.relpath(data_dir).startswith("..") else data_dir
        task, s["vocab_size"] = corpus(data_dir)
        cfg = model_config(s)
        batch = fixed_batch(cfg, s)
        common.progress(f"loop_overhead: 1/3 bare jitted step ({cfg.num_params():,} params, vocab "
                        f"{s['vocab_size']})")
        setup = init_trainer(cfg, batch)
        bare = measure_bare(cfg, batch, s, params=setup[1].params)
        common.progress("loop_overhead: 2/3 Trainer.train_step")
        step = measure_trainer(batch, s, setup)
        del setup  # its state was donated to the steps
        common.progress(f"loop_overhead: 3/3 training.loop.train, {(1 + s['windows']) * s['steps']} steps")
        loop = measure_loop(cfg, task, s, os.path.join(tmp, "model_dir"))

    trainer_vs_bare = step["tokens_per_s"] / bare["tokens_per_s"]
    overhead = 1 - loop["tokens_per_s"] / step["tokens_per_s"]
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    fmt_loss = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731

    def row(name, r, vs_bare, vs_step, trainer_col, overhead_col, target):
        return [name, f"{r['step_s'] * 1e3:,.1f}", f"{r['tokens_per_s']:,.0f}", vs_bare, vs_step, trainer_col,
                overhead_col, fmt_loss(r["first_loss"]), fmt_loss(r["loss"]), target]

    rows = [
        row("1. bare jitted step", bare, "1.000x", f"{bare['tokens_per_s'] / step['tokens_per_s']:.3f}x", "-", "-",
            "-"),
        row("2. Trainer.train_step", step, f"{trainer_vs_bare:.3f}x", "1.000x", _pct(trainer_vs_bare), "-",
            f">= {TARGET_TRAINER_VS_BARE:.0%}: {met(trainer_vs_bare >= TARGET_TRAINER_VS_BARE)}"),
        row("3. training.loop.train", loop, f"{loop['tokens_per_s'] / bare['tokens_per_s']:.3f}x",
            f"{loop['tokens_per_s'] / step['tokens_per_s']:.3f}x", "-", _pct(overhead),
            f"< {TARGET_LOOP_OVERHEAD:.0%}: {met(overhead < TARGET_LOOP_OVERHEAD)}"),
    ]
    print(common.header(command))
    print()
    print(common.table(["row", "step ms (median)", "tokens/s", "vs bare", "vs Trainer.train_step",
                        "trainer vs bare", "loop overhead", "first loss", "last loss", "target"], rows))
    print()
    tokens = s["batch_size"] * s["seq_len"]
    n = s["steps"]
    windows = ", ".join(f"{t:,.0f}" for t in loop["window_tokens_per_s"])
    wall = loop["wall_tokens_per_s"]
    wall_text = (f" Wall clock from the step-{n} log line to the step-{loop['steps']} one (every window after the "
                 f"first, with all of their reports): {wall:,.0f} tokens/s, {_pct(1 - wall / step['tokens_per_s'])} "
                 "below Trainer.train_step." if wall else "")
    notes = [
        f"Model: throughput.model_config('llama', 'float32') at the sizes below, {cfg.num_params():,} params, vocab "
        f"{s['vocab_size']} (the corpus's); {s['batch_size']} packed rows of {s['seq_len']} = {tokens} tokens per "
        f"step, every position counted; corpus {s['data_dir']} ({data_source}). Loss of a uniform guess: "
        f"ln({s['vocab_size']}) = {math.log(s['vocab_size']):.3f}.",
        f"Rows 1 and 2: one fixed batch of random tokens, {s['packed_segments']} packed segments per row, as "
        "throughput makes it (the pipeline's features; its loss weights are float32 here, int32 from the "
        "pipeline), already on the device; first loss = the first step's (before any update), last loss = the "
        f"last step's; median of {s['windows']} windows of {n} steps after {s['warmup_steps']} warm-up step(s), "
        "each window ending in one block_until_ready.",
        "Row 1: jax.jit(model.apply -> weighted optax.softmax_cross_entropy_with_integer_labels -> "
        "jax.value_and_grad -> optax.adamw -> optax.apply_updates), params and opt_state donated, default device, "
        "no mesh, from a copy of row 2's initial parameters. AdamW b1, b2, eps and weight decay (matrices only) "
        "as AdamW's defaults, but a constant learning rate (the peak): no warmup-cosine schedule, no "
        "gradient clipping. Deterministic apply (the dropout rate is 0).",
        f"Row 2: common.make_trainer + Trainer.train_step, as throughput runs it: mesh over {_devices()}, the "
        "library's cross entropy, clipping, warmup-cosine schedule (warm-up from 0, so its loss falls slowly "
        "here), grad norm, non-finite guard, metrics dict; the state donated.",
        f"Row 3: training.loop.train in-process, {loop['steps']} steps, log_period {n}, no eval, a checkpoint only at the end "
        "(outside every window). Its figure is the median over the windows after the first of the tok/s its "
        "reports print (train/tokens_per_second, which training.loop.train also returns for its last window): per "
        "step the next batch from the seqio pipeline, the host-to-device transfer, the step's dispatch, "
        "the metrics list, and the report's device_get; the report's TensorBoard write and log line run after "
        "that window's clock stops. First loss = the loop's step-0 check (eval_step on its first batch); last "
        "loss = the mean of the last window, over fresh batches; its schedule is built for "
        f"{loop['steps']} steps. Tokens/s of each window: {windows} (the first holds the compile).{wall_text}",
    ]
    print("\n".join(f"- {note}" for note in notes))
    print(common.settings_line(s))
    return {"bare": bare, "train_step": step, "loop": loop, "loop_overhead": overhead,
            "trainer_vs_bare": trainer_vs_bare, "settings": s}


def _devices() -> str:
    import jax

    return f"{jax.device_count()} {jax.devices()[0].platform} device(s)"
