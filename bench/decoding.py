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
"""

from __future__ import annotations

import time

import jax
import numpy as np

from bench import common

DEFAULTS = {"models": "tiny,base", "batch_sizes": "1,8", "prompt_len": 16, "new_tokens": 128, "t5_batch_size": 8,
            "t5_inputs_len": 64, "t5_decode_len": 64, "beam_size": 4, "repeats": 2, "dtype": "float32"}
QUICK = {"models": "tiny", "batch_sizes": "1,2", "prompt_len": 4, "new_tokens": 8, "t5_batch_size": 2,
         "t5_inputs_len": 8, "t5_decode_len": 8, "beam_size": 2, "repeats": 1}


def add_arguments(parser) -> None:
    parser.add_argument("--models", help="comma-separated: tiny,base")
    parser.add_argument("--batch_sizes", help="comma-separated decoder-only batch sizes (default 1,8)")
    for key in ("prompt_len", "new_tokens", "t5_batch_size", "t5_inputs_len", "t5_decode_len", "beam_size",
                "repeats"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--dtype", help="compute dtype (default float32)")


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
        params = init_params(cfg)
        for batch in common.ints(s["batch_sizes"]):
            rates = {}
            for use_cache in (True, False):
                common.progress(f"decoding: {name} batch {batch} use_cache={use_cache}")
                call = lambda: decoding.generate_batch(  # noqa: E731
                    model=cfg, params=params, prompts=prompts(cfg, batch, s["prompt_len"]),
                    max_new_tokens=s["new_tokens"], rng=jax.random.PRNGKey(0), eos_id=cfg.vocab_size,
                    use_cache=use_cache)
                first, best, out = time_calls(call, s["repeats"])
                tokens = sum(len(row) for row in out)
                rates[use_cache] = tokens / best
                rows.append([name, f"{cfg.num_params():,}", batch, s["prompt_len"], s["new_tokens"],
                             "KV cache" if use_cache else "recompute", f"{first:.2f}", f"{best * 1e3:,.1f}",
                             f"{rates[use_cache]:,.0f}", "-"])
            rows[-2][-1] = f"{rates[True] / rates[False]:.1f}x"
    return rows


def t5_rows(s: dict) -> list[list]:
    from t5x_lite.inference import decoding

    cfg = t5_config(s["dtype"])
    params = init_params(cfg)
    inputs = prompts(cfg, s["t5_batch_size"], s["t5_inputs_len"], seed=1)
    common_args = dict(model=cfg, params=params, inputs=inputs, max_decode_length=s["t5_decode_len"],
                       eos_id=cfg.vocab_size)
    methods = {
        "greedy, KV cache": lambda: decoding.generate_seq2seq(rng=jax.random.PRNGKey(0), **common_args),
        "greedy, recompute": lambda: decoding.generate_seq2seq(rng=jax.random.PRNGKey(0), use_cache=False,
                                                               **common_args),
        f"beam search ({s['beam_size']} beams, KV cache)": lambda: decoding.beam_search(
            beam_size=s["beam_size"], **common_args),
    }
    rows = []
    for method, call in methods.items():
        common.progress(f"decoding: t5 {method}")
        first, best, out = time_calls(call, s["repeats"])
        tokens = sum(len(row) for row in out)
        rows.append([method, f"{cfg.num_params():,}", s["t5_batch_size"], s["t5_inputs_len"], s["t5_decode_len"],
                     f"{first:.2f}", f"{best * 1e3:,.1f}", f"{tokens / best:,.0f}"])
    return rows


def run(args, command: str) -> None:
    s = common.resolve(args, DEFAULTS, QUICK)
    start = time.perf_counter()
    decoder, t5 = decoder_rows(s), t5_rows(s)
    print(common.header(command))
    print()
    print(common.table(["model", "params", "batch", "prompt", "new tokens", "decoding", "first call s",
                        "call ms (best)", "tokens/s (best)", "cache speedup"], decoder))
    print()
    print(common.table(["T5 tiny", "params", "inputs", "input len", "output tokens", "first call s",
                        "call ms (best)", "tokens/s (best)"], t5))
    print()
    print("Greedy on random-init params; EOS outside the vocabulary, so every row decodes all its tokens. "
          "first call = compile + one call; tokens/s = output tokens of all rows / seconds of a whole call "
          "(prompt read included); beam search counts the best beam's tokens. "
          f"Took {time.perf_counter() - start:.0f} s.")
    print(common.settings_line(s))
