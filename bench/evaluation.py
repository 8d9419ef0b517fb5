"""evaluation: eval throughput of strided perplexity and multiple-choice scoring.

`perplexity_eval.perplexity` over --documents random-token documents of --doc_len tokens, with
windows of the model's max_len and stride max_len (disjoint) and max_len / 2, --batch_size
windows per call; and `multiple_choice.score_multiple_choice` over --mc_examples examples of 4
endings (a --mc_context-token context and --mc_ending-token endings, from a word-level
tokenizer made here). Models as in `decoding`: `tiny` and `base`, random init, float32. The
first pass (compile included) is timed apart; then the best of --repeats passes. Scored tokens/s
counts each document token once; model tokens/s counts every token the model reads, so
overlapping windows read more than they score.

Each row is measured on each of --devices device counts (default 1 and 8 host CPU devices) on a
--mesh mesh (fsdp by default), with the same --batch_size rows per call split over the devices,
as in `decoding`. "same as 1 device": the perplexity loss within 1e-5 (relative) of the 1-device
run's, the multiple-choice acc and acc_norm identical.
"""

from __future__ import annotations

import time

import numpy as np

from bench import common
from bench.decoding import (
    add_device_arguments,
    decoder_config,
    devices_notes,
    init_params,
    mesh_label,
    placements,
    settings,
    setup,
    time_calls,
)

DEFAULTS = {"models": "tiny,base", "documents": 16, "doc_len": 2048, "batch_size": 8, "mc_examples": 64,
            "mc_context": 48, "mc_ending": 12, "repeats": 2, "dtype": "float32", "devices": "1,8", "mesh": "fsdp"}
QUICK = {"models": "tiny", "documents": 2, "doc_len": 300, "batch_size": 2, "mc_examples": 4, "repeats": 1,
         "devices": "1,2"}
LOSS_RTOL = 1e-5


def add_arguments(parser) -> None:
    parser.add_argument("--models", help="comma-separated: tiny,base")
    for key in ("documents", "doc_len", "batch_size", "mc_examples", "mc_context", "mc_ending", "repeats"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--dtype", help="compute dtype (default float32)")
    add_device_arguments(parser)


def same_loss(loss: float, reference: float | None) -> str:
    """The "same as 1 device" cell of a perplexity row: the loss within LOSS_RTOL of the 1-device loss."""
    if reference is None:
        return "-"
    rel = abs(loss - reference) / abs(reference)
    return f"{'yes' if rel <= LOSS_RTOL else 'NO'} (rel. diff {rel:.1e})"


def perplexity_rows(s: dict) -> list[list]:
    from t5x_lite.evaluation import perplexity as perplexity_eval

    rows = []
    rng = np.random.default_rng(0)
    for name in common.strs(s["models"]):
        cfg = decoder_config(name, s["dtype"])
        host_params = init_params(cfg)
        documents = rng.integers(2, cfg.vocab_size, size=(s["documents"], s["doc_len"])).tolist()
        for stride in (cfg.max_len, cfg.max_len // 2):
            reference = None
            for devices, placement in placements(s):
                params = placement.place_params(cfg, host_params)
                common.progress(f"evaluation: perplexity {name} stride {stride} on {placement.describe()}")
                first, best, out = time_calls(lambda: perplexity_eval.perplexity(  # noqa: B023
                    model=cfg, params=params, documents=documents, context_length=cfg.max_len, stride=stride,
                    batch_size=s["batch_size"], placement=placement), s["repeats"])
                if devices == 1:
                    reference = out["loss"]
                read = sum(min(cfg.max_len, s["doc_len"] - w.begin) for w in perplexity_eval.strided_windows(
                    s["doc_len"], context_length=cfg.max_len, stride=stride)) * s["documents"]
                rows.append([name, f"{cfg.num_params():,}", cfg.max_len, stride, out["windows"], devices,
                             mesh_label(devices, s["mesh"]), f"{first:.2f}", f"{best:.2f}",
                             f"{out['tokens'] / best:,.0f}", f"{read / best:,.0f}", f"{out['loss']:.6f}",
                             "-" if devices == 1 else same_loss(out["loss"], reference)])
    return rows


def multiple_choice_rows(s: dict) -> list[list]:
    from t5x_lite.evaluation import multiple_choice

    rows = []
    for name in common.strs(s["models"]):
        cfg = decoder_config(name, s["dtype"])
        host_params = init_params(cfg)
        words = [f"w{i}" for i in range(cfg.vocab_size - 2)]
        encode = lambda text: [2 + int(w[1:]) for w in text.split()]  # noqa: E731
        rng = np.random.default_rng(1)
        sentence = lambda n: " ".join(rng.choice(words, size=n))  # noqa: E731
        examples = [multiple_choice.MultipleChoiceExample(
            context=sentence(s["mc_context"]), endings=tuple(sentence(s["mc_ending"]) for _ in range(4)), label=0)
            for _ in range(s["mc_examples"])]
        reference = None
        for devices, placement in placements(s):
            params = placement.place_params(cfg, host_params)
            common.progress(f"evaluation: multiple choice {name} on {placement.describe()}")
            first, best, out = time_calls(lambda: multiple_choice.score_multiple_choice(  # noqa: B023
                model=cfg, params=params, examples=examples, encode=encode, batch_size=s["batch_size"],  # noqa: B023
                placement=placement), s["repeats"])  # noqa: B023
            scores = (out["acc"], out["acc_norm"])
            if devices == 1:
                reference = scores
            same = "-" if devices == 1 or reference is None else "yes" if scores == reference else "NO"
            rows.append([name, f"{cfg.num_params():,}", s["mc_examples"], devices, mesh_label(devices, s["mesh"]),
                         f"{first:.2f}", f"{best:.2f}", f"{s['mc_examples'] / best:,.1f}", f"{out['acc']:.3f}",
                         f"{out['acc_norm']:.3f}", same])
    return rows


def run(args, command: str) -> None:
    s = common.resolve(args, DEFAULTS, QUICK)
    setup(args, s)
    start = time.perf_counter()
    perplexity, mc = perplexity_rows(s), multiple_choice_rows(s)
    print(common.header(command))
    print()
    print(common.table(["model", "params", "context", "stride", "windows", "devices", "mesh", "first pass s",
                        "pass s (best)", "scored tokens/s", "model tokens/s", "loss", "same as 1 device"], perplexity))
    print()
    print(common.table(["model", "params", "examples (4 endings)", "devices", "mesh", "first pass s", "pass s (best)",
                        "examples/s", "acc", "acc_norm", "same as 1 device"], mc))
    print()
    same = (f"perplexity loss within {LOSS_RTOL:g} (relative) of the 1-device run's; multiple-choice acc and "
            "acc_norm identical")
    print(f"{s['documents']} documents of {s['doc_len']} random tokens; batch {s['batch_size']} rows per call; "
          f"random-init params. {devices_notes(s, same)} Took {time.perf_counter() - start:.0f} s.")
    print(common.settings_line(settings(s)))
