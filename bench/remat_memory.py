"""remat_memory: memory of the compiled train step under every remat policy.

Each policy in `stack.REMAT_POLICIES` is compiled (nothing runs) and XLA's buffer assignment
is read from `compiled.memory_analysis()`: temp (activations kept for the backward pass and
scratch), arguments (state + batch), outputs, aliased (donated state reused for the new
state) and XLA's peak. A policy that fails to compile shows its error class instead.
"""

from __future__ import annotations

from bench import common
from t5x_lite.training import trainer as trainer_lib

DEFAULTS = {"num_layers": 12, "emb_dim": 512, "num_heads": 8, "head_dim": 64, "mlp_dim": 1536,
            "vocab_size": 8192, "seq_len": 512, "batch_size": 8, "dtype": "float32", "scan_layers": True,
            "policies": None}
QUICK = {"num_layers": 2, "emb_dim": 128, "num_heads": 4, "head_dim": 32, "mlp_dim": 384, "vocab_size": 1024,
         "seq_len": 128, "batch_size": 4}


def add_arguments(parser) -> None:
    for key in ("num_layers", "emb_dim", "num_heads", "head_dim", "mlp_dim", "vocab_size", "seq_len", "batch_size"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--dtype", help="compute dtype (default float32)")
    parser.add_argument("--scan_layers", type=lambda s: s.lower() in ("1", "true", "yes"),
                        help="true (default) or false")
    parser.add_argument("--policies", help="comma-separated subset of stack.REMAT_POLICIES (default: all)")


def run(args, command: str) -> None:
    from t5x_lite.models import stack
    from t5x_lite.models.decoder_only import DecoderConfig

    settings = common.resolve(args, DEFAULTS, QUICK)
    policies = common.strs(settings["policies"]) if settings["policies"] else list(stack.REMAT_POLICIES)
    settings["policies"] = ",".join(policies)
    rows, errors, temp_none = [], [], None
    for policy in policies:
        common.progress(f"remat_memory: {policy}")
        cfg = DecoderConfig(vocab_size=settings["vocab_size"], emb_dim=settings["emb_dim"],
                            num_heads=settings["num_heads"], num_kv_heads=settings["num_heads"],
                            head_dim=settings["head_dim"], mlp_dim=settings["mlp_dim"],
                            num_layers=settings["num_layers"], max_len=settings["seq_len"], dtype=settings["dtype"],
                            scan_layers=settings["scan_layers"], remat_policy=policy)
        batch = common.make_batch(cfg, batch=settings["batch_size"], length=settings["seq_len"])
        try:
            step = common.compile_train_step(common.make_trainer(cfg), batch)
            mem = trainer_lib.compiled_memory_bytes(step.compiled.memory_analysis())
        except Exception as e:  # noqa: BLE001 - reported in the table
            errors.append(f"{policy}: {common.short_error(e, 300)}")
            rows.append([policy, common.error_name(e), *["-"] * 7])
            continue
        temp_none = mem["temp"] if policy == "none" else temp_none
        ratio = f"{mem['temp'] / temp_none:.2f}x" if temp_none else "-"
        mib = {k: f"{v / common.MIB:,.1f}" for k, v in mem.items()}
        rows.append([policy, mib["temp"], ratio, mib["arguments"], mib["outputs"], mib["aliased"], mib["total"],
                     mib["host_temp"], f"{step.lower_seconds + step.compile_seconds:.1f}"])
    print(common.header(command))
    print()
    print(common.table(["remat policy", "temp MiB", "temp vs none", "arguments MiB", "outputs MiB", "aliased MiB",
                        "total MiB", "host temp MiB", "lower+compile s"], rows))
    print()
    print(f"decoder-only LLaMA style, {cfg.num_params():,} parameters, AdamW. From compiled.memory_analysis() of "
          "the jitted Trainer train step (nothing was run): arguments = params + 2 Adam moments + batch; "
          "aliased = donated state reused for the new state; total = arguments + outputs - aliased + temp.")
    for line in errors:
        print(f"- {line}")
    print(common.settings_line(settings))
