"""decoding: generation tokens/s with the KV cache vs full recompute, and T5 beam search.

Decoder-only (LLaMA style, random init): `decoding.generate_batch`, greedy, --new_tokens new
tokens after a --prompt_len-token prompt in every row, at each of --batch_sizes, KV-cached
and with use_cache=False (the whole buffer re-run for every token), for the models in
--models: `tiny` (gin/models/decoder_tiny.gin's sizes) and `base` (d=512, 4 layers, 8x64
heads, max_len 512). T5 (gin/models/t5_tiny.gin's sizes): `decoding.generate_seq2seq` greedy,
cached and not, and `decoding.beam_search` with --beam_size beams, --t5_batch_size inputs of
--t5_inputs_len tokens, --t5_decode_len output tokens. EOS is outside the vocabulary, so every
row decodes all its tokens. The first call (compile included) is timed apart; then the best
of --repeats calls. tokens/s counts new (output) tokens of all rows, prompt reading included.

Each row is measured on each of --devices device counts (default 1 and 8; host CPU devices are
made with XLA_FLAGS=--xla_force_host_platform_device_count before JAX starts its backend), with
the same global batch split by rows over a --mesh mesh (`fsdp`, the default: params sharded along
their embed axis, as for a model larger than one device; or `data`: params replicated), through
the functions' `placement=`. A batch smaller than the device count is padded with rows that are
computed but not counted. "same as 1 device" compares each row's outputs with the 1-device run's.
"""

from __future__ import annotations

import os
import re
import time

import jax
import numpy as np

from bench import common

DEFAULTS = {"models": "tiny,base", "batch_sizes": "1,8", "prompt_len": 16, "new_tokens": 128, "t5_batch_size": 8,
            "t5_inputs_len": 64, "t5_decode_len": 64, "beam_size": 4, "repeats": 2, "dtype": "float32",
            "devices": "1,8", "mesh": "fsdp"}
QUICK = {"models": "tiny", "batch_sizes": "1,2", "prompt_len": 4, "new_tokens": 8, "t5_batch_size": 2,
         "t5_inputs_len": 8, "t5_decode_len": 8, "beam_size": 2, "repeats": 1, "devices": "1,2"}
MESHES = ("fsdp", "data")
HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def add_arguments(parser) -> None:
    parser.add_argument("--models", help="comma-separated: tiny,base")
    parser.add_argument("--batch_sizes", help="comma-separated decoder-only batch sizes (default 1,8)")
    for key in ("prompt_len", "new_tokens", "t5_batch_size", "t5_inputs_len", "t5_decode_len", "beam_size",
                "repeats"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--dtype", help="compute dtype (default float32)")
    add_device_arguments(parser)


def add_device_arguments(parser) -> None:
    parser.add_argument("--devices", help="comma-separated device counts; every row is measured on each, with the "
                                          "same global batch (default 1,8; --quick 1,2)")
    parser.add_argument("--mesh", choices=MESHES, help="how the devices split the work: fsdp (default; params "
                                                       "sharded along their embed axis) or data (params replicated)")


# ---------------------------------------------------------------------------- devices


def backend_started() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def device_counts(s: dict, *, given: bool) -> tuple[list[int], str]:
    """The --devices counts to measure, and a note ("" when none). Before JAX starts its backend,
    XLA_FLAGS is set to make as many host CPU devices as the largest count (JAX reads it then, so
    `import jax` earlier is fine). Fails when JAX has fewer devices than asked for, except that the
    default counts shrink to the devices there are (`bench all`, whose earlier benchmarks started
    JAX on one device), with a note saying so."""
    counts = sorted(set(common.ints(s["devices"])))
    if not counts or counts[0] < 1:
        raise SystemExit(f"--devices={s['devices']}: give positive device counts, e.g. --devices=1,8.")
    need = counts[-1]
    if not backend_started():
        flags = os.environ.get("XLA_FLAGS", "")
        present = re.search(rf"{HOST_DEVICES_FLAG}=(\d+)", flags)
        if not present or int(present.group(1)) < need:
            flags = re.sub(rf"\s*{HOST_DEVICES_FLAG}=\d+", "", flags)
            os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICES_FLAG}={need}".strip()
    have = jax.device_count()
    if have >= need:
        return counts, ""
    platform = jax.default_backend()
    if platform == "cpu":
        why = (f"JAX's backend started on {have} CPU device{'s' if have > 1 else ''} before this benchmark could ask "
               f"for {need}")
        fix = (f"run this benchmark on its own (`python -m bench NAME ...` sets XLA_FLAGS={HOST_DEVICES_FLAG}={need} "
               "itself before JAX starts)")
    else:
        why = f"JAX has {have} {platform} device{'s' if have > 1 else ''}"
        fix = f"set JAX_PLATFORMS=cpu for {need} host CPU devices"
    if given:
        raise SystemExit(f"--devices={s['devices']} needs {need} devices, but {why}: {fix}, or pass "
                         f"--devices={','.join(str(n) for n in counts if n <= have) or 1}.")
    kept = [n for n in counts if n <= have] or [1]
    return kept, f"Measured on {','.join(map(str, kept))} device(s) instead of --devices={s['devices']}: {why}."


def placement_for(devices: int, mesh: str):
    """A Placement over the first `devices` devices: params sharded along `embed` (fsdp) or replicated (data)."""
    from t5x_lite.parallel import partitioning, placement

    axes = placement.FSDP_AXES if mesh == "fsdp" else placement.DATA_PARALLEL_AXES
    return placement.Placement(mesh=partitioning.make_mesh(axes=axes, devices=jax.devices()[:devices]))


def placements(s: dict) -> list[tuple[int, object]]:
    """(device count, Placement) for each of s["device_counts"]."""
    return [(n, placement_for(n, s["mesh"])) for n in s["device_counts"]]


def mesh_label(devices: int, mesh: str) -> str:
    return "one device" if devices == 1 else f"{mesh} {devices}"


def same_tokens(out: list, reference: list | None) -> str:
    """The "same as 1 device" cell for token outputs: identical, or how many rows differ."""
    if reference is None:
        return "-"
    differ = sum(a != b for a, b in zip(out, reference)) + abs(len(out) - len(reference))
    return "yes" if not differ else f"NO ({differ} of {len(reference)} rows differ)"


def setup(args, s: dict) -> None:
    """Resolves the device counts into s["device_counts"] (and a note into s["devices_note"])."""
    if s["mesh"] not in MESHES:
        raise SystemExit(f"--mesh={s['mesh']}: choose from {', '.join(MESHES)}.")
    s["device_counts"], s["devices_note"] = device_counts(s, given=getattr(args, "devices", None) is not None)


# ---------------------------------------------------------------------------- models


def decoder_config(name: str, dtype: str):
    from t5x_lite.models.decoder_only import DecoderConfig

    if name == "tiny":  # gin/models/decoder_tiny.gin
        return DecoderConfig(vocab_size=4096, emb_dim=128, num_heads=4, num_kv_heads=2, head_dim=32, mlp_dim=384,
                             num_layers=4, max_len=256, dtype=dtype)
    if name == "base":
        return DecoderConfig(vocab_size=8192, emb_dim=512, num_heads=8, num_kv_heads=8, head_dim=64, mlp_dim=1408,
                             num_layers=4, max_len=512, dtype=dtype)
    raise ValueError(f"Unknown model {name!r}; choose from tiny, base.")


def t5_config(dtype: str):
    from t5x_lite.models.encoder_decoder import T5Config

    # gin/models/t5_tiny.gin
    return T5Config(vocab_size=4224, emb_dim=128, num_heads=4, head_dim=32, mlp_dim=256, num_encoder_layers=2,
                    num_decoder_layers=2, dtype=dtype)


def init_params(cfg):
    tokens = np.ones((1, 8), np.int32)
    args = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
    return jax.jit(cfg.make_module().init)(jax.random.PRNGKey(0), *args)["params"]


def prompts(cfg, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(2, cfg.vocab_size, size=(batch, length)).tolist()


def time_calls(fn, repeats: int) -> tuple[float, float, list]:
    """(seconds of the first call, compile included; best seconds of `repeats` more; the last output)."""
    out, first = common.timed(fn)
    best = float("inf")
    for _ in range(repeats):
        out, seconds = common.timed(fn)
        best = min(best, seconds)
    return first, best, out


def decoder_rows(s: dict) -> list[list]:
    from t5x_lite.inference import decoding

    rows = []
    for name in common.strs(s["models"]):
        cfg = decoder_config(name, s["dtype"])
        host_params = init_params(cfg)
        for batch in common.ints(s["batch_sizes"]):
            reference = {}
            for devices, placement in placements(s):
                params = placement.place_params(cfg, host_params)
                rates = {}
                for use_cache in (True, False):
                    common.progress(f"decoding: {name} batch {batch} use_cache={use_cache} on {placement.describe()}")
                    call = lambda: decoding.generate_batch(  # noqa: E731
                        model=cfg, params=params, prompts=prompts(cfg, batch, s["prompt_len"]),  # noqa: B023
                        max_new_tokens=s["new_tokens"], rng=jax.random.PRNGKey(0), eos_id=cfg.vocab_size,
                        use_cache=use_cache, placement=placement)  # noqa: B023
                    first, best, out = time_calls(call, s["repeats"])
                    if devices == 1:
                        reference[use_cache] = out
                    tokens = sum(len(row) for row in out)
                    rates[use_cache] = tokens / best
                    rows.append([name, f"{cfg.num_params():,}", batch, s["prompt_len"], s["new_tokens"],
                                 "KV cache" if use_cache else "recompute", devices,
                                 mesh_label(devices, s["mesh"]), f"{first:.2f}", f"{best * 1e3:,.1f}",
                                 f"{rates[use_cache]:,.0f}", "-",
                                 "-" if devices == 1 else same_tokens(out, reference.get(use_cache))])
                rows[-2][-2] = f"{rates[True] / rates[False]:.1f}x"
    return rows


def t5_rows(s: dict) -> list[list]:
    from t5x_lite.inference import decoding

    cfg = t5_config(s["dtype"])
    host_params = init_params(cfg)
    inputs = prompts(cfg, s["t5_batch_size"], s["t5_inputs_len"], seed=1)
    methods = {
        "greedy, KV cache": lambda args: decoding.generate_seq2seq(rng=jax.random.PRNGKey(0), **args),
        "greedy, recompute": lambda args: decoding.generate_seq2seq(rng=jax.random.PRNGKey(0), use_cache=False,
                                                                    **args),
        f"beam search ({s['beam_size']} beams, KV cache)": lambda args: decoding.beam_search(
            beam_size=s["beam_size"], **args),
    }
    rows, reference = [], {}
    for method, call in methods.items():
        for devices, placement in placements(s):
            args = {"model": cfg, "params": placement.place_params(cfg, host_params), "inputs": inputs,
                    "max_decode_length": s["t5_decode_len"], "eos_id": cfg.vocab_size, "placement": placement}
            common.progress(f"decoding: t5 {method} on {placement.describe()}")
            first, best, out = time_calls(lambda: call(args), s["repeats"])  # noqa: B023
            if devices == 1:
                reference[method] = out
            tokens = sum(len(row) for row in out)
            rows.append([method, f"{cfg.num_params():,}", s["t5_batch_size"], s["t5_inputs_len"],
                         s["t5_decode_len"], devices, mesh_label(devices, s["mesh"]), f"{first:.2f}",
                         f"{best * 1e3:,.1f}", f"{tokens / best:,.0f}",
                         "-" if devices == 1 else same_tokens(out, reference.get(method))])
    return rows


def run(args, command: str) -> None:
    s = common.resolve(args, DEFAULTS, QUICK)
    setup(args, s)
    start = time.perf_counter()
    decoder, t5 = decoder_rows(s), t5_rows(s)
    print(common.header(command))
    print()
    print(common.table(["model", "params", "batch", "prompt", "new tokens", "decoding", "devices", "mesh",
                        "first call s", "call ms (best)", "tokens/s (best)", "cache speedup", "same as 1 device"],
                       decoder))
    print()
    print(common.table(["T5 tiny", "params", "inputs", "input len", "output tokens", "devices", "mesh",
                        "first call s", "call ms (best)", "tokens/s (best)", "same as 1 device"], t5))
    print()
    print("Greedy on random-init params; EOS outside the vocabulary, so every row decodes all its tokens. "
          "first call = compile + one call; tokens/s = output tokens of all rows / seconds of a whole call "
          "(prompt read included); beam search counts the best beam's tokens. "
          + devices_notes(s) + f" Took {time.perf_counter() - start:.0f} s.")
    print(common.settings_line(settings(s)))


def devices_notes(s: dict, same: str = "the outputs (tokens) equal the 1-device run's") -> str:
    """The report's sentences on devices: the mesh, padding, the comparison, and any shrunk --devices."""
    return (f"Each row on {', '.join(map(str, s['device_counts']))} {jax.devices()[0].platform} device(s) "
            f"(--mesh={s['mesh']}: " + ("params sharded along their embed axis" if s["mesh"] == "fsdp" else
                                        "params replicated") + ", batch rows split over the devices; the same "
            "global batch, padded to a multiple of the devices with rows computed but not counted); same as 1 "
            f"device: {same}. " + s["devices_note"]).strip()


def settings(s: dict) -> dict:
    return {k: v for k, v in s.items() if k not in ("device_counts", "devices_note")}
