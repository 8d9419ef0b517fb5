"""Command line: `python -m bench NAME [--quick] [options]`; `python -m bench NAME --help` lists options."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from bench import (
    checkpoint,
    common,
    compile_time,
    decoding,
    e2e,
    evaluation,
    gpu_decoders,
    input_pipeline,
    large_models,
    loop_overhead,
    matmul_peak,
    matmul_shapes,
    prepare_formats,
    remat_memory,
    step_ab,
    step_profile,
    storage,
    throughput,
    torch_reference,
)
from t5x_lite import host_memory

BENCHMARKS = {"matmul_peak": matmul_peak, "compile_time": compile_time, "remat_memory": remat_memory,
              "throughput": throughput, "loop_overhead": loop_overhead, "gpu_decoders": gpu_decoders,
              "input_pipeline": input_pipeline, "checkpoint": checkpoint, "decoding": decoding,
              "evaluation": evaluation, "torch_reference": torch_reference, "large_models": large_models,
              "step_profile": step_profile, "step_ab": step_ab, "matmul_shapes": matmul_shapes, "e2e": e2e,
              "prepare_formats": prepare_formats, "storage": storage}
CPU_BENCHMARKS = ("matmul_peak", "compile_time", "remat_memory", "throughput", "torch_reference", "matmul_shapes",
                  "loop_overhead", "input_pipeline", "checkpoint", "decoding", "evaluation")
NEEDS_TORCH = ("torch_reference", "matmul_shapes")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m bench", description=__import__("bench").__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="name", required=True, metavar="NAME")
    for name, module in [*BENCHMARKS.items(), ("all", None)]:
        doc = module.__doc__ if module else f"run {', '.join(CPU_BENCHMARKS)} in sequence"
        p = sub.add_parser(name, help=doc.split("\n")[0], description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--quick", action="store_true", help="tiny sizes and few steps: checks the script only")
        if module:
            module.add_arguments(p)
    return top


def run_all(args, all_argv) -> None:
    """Each CPU benchmark with its defaults (or --quick); throughput and torch_reference reuse the
    measured peak; torch_reference and matmul_shapes are skipped, with a line saying so, where PyTorch is
    not installed."""
    quick = ["--quick"] if args.quick else []
    peaks = {}
    for name in CPU_BENCHMARKS:
        extra = []
        if name == "throughput":
            extra = [f"--peak_flops={peaks['float32']:.6g}", f"--peak_flops_bf16={peaks['bfloat16']:.6g}"]
        if name in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
            print(f"{name} skipped: PyTorch is not installed (`make install-torch`).\n\n", flush=True)
            continue
        if name == "torch_reference":
            extra = [f"--peak_flops={peaks['float32']:.6g}"]
        argv = [name, *quick, *extra]
        sub_args = parser().parse_args(argv)
        sub_args.peak_source = "measured by the matmul_peak run above"
        command = f"{common.python_command(argv)}  (part of: {common.python_command(all_argv)})"
        result = BENCHMARKS[name].run(sub_args, command)
        if name == "matmul_peak":
            peaks = result
        print("\n", flush=True)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.name == "all":
        run_all(args, argv)
    else:
        BENCHMARKS[args.name].run(args, common.python_command(argv))


if __name__ == "__main__":
    host_memory.run_program(main)  # as the t5x-lite program runs (T5X_LITE_MALLOC=system: glibc's defaults)
