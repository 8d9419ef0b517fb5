"""Qwen2 (`Qwen2ForCausalLM`) <-> the decoder-only LM in LLaMA style with biases on q, k and v.

Qwen2's query, key and value projections have biases and its output projection and MLP do not
(`DecoderConfig.qkv_bias`); embeddings are tied or not. Its sliding window converts when every
layer uses it or none does: `use_sliding_window` with `max_window_layers` (or `layer_types`)
picks the layers, and t5x_lite has one window for all of them. Sizes, RoPE and tensors are
llama_like.py's.
"""

from __future__ import annotations

from typing import Any

from t5x_lite.hf import llama, llama_like
from t5x_lite.hf.errors import ConversionError
from t5x_lite.models.decoder_only import DecoderConfig

MODEL_TYPE = "qwen2"
ARCHITECTURE = "Qwen2ForCausalLM"
# A LLaMA's fields with biases on q, k and v; any sliding window converts.
STYLE = {**{k: v for k, v in llama.STYLE.items() if k != "sliding_window"}, "qkv_bias": True}
REFUSED = {"hidden_act": llama.REFUSED["hidden_act"]}
SLIDING, FULL = "sliding_attention", "full_attention"


def dims(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with the defaults transformers fills in (head_dim, num_key_value_heads)."""
    return llama_like.dims({"hidden_act": "silu", **hf}, ARCHITECTURE)


def sliding_window(hf: dict[str, Any]) -> int | None:
    """The window every layer uses, as transformers reads it: `sliding_window` when
    `use_sliding_window`, on the layers `layer_types` names, else on layers from `max_window_layers` on."""
    layers = hf["num_hidden_layers"]
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window", False) else None
    types = hf.get("layer_types") or [SLIDING if window is not None and i >= hf.get("max_window_layers", 28) else FULL
                                      for i in range(layers)]
    windows = {window if kind == SLIDING else None for kind in types}
    if len(windows) > 1:
        raise ConversionError(
            f"config.json use_sliding_window={hf.get('use_sliding_window')!r} with max_window_layers="
            f"{hf.get('max_window_layers')!r} of num_hidden_layers={layers} (layer_types: {types.count(SLIDING)} "
            f"sliding, {types.count(FULL)} full) mixes sliding-window and full attention layers, which is not "
            "supported: t5x_lite has one window for every layer (max_window_layers=0: all use it; "
            "use_sliding_window=false: none does).")
    (window,) = windows
    if window is not None and not (isinstance(window, int) and not isinstance(window, bool) and window >= 1):
        raise ConversionError(f"config.json sliding_window={window!r} must be a positive integer.")
    return window


def config_from_hf(hf: dict[str, Any], *, scan_layers: bool) -> DecoderConfig:
    d = dims(hf)
    llama_like.refuse(d, REFUSED)
    return llama_like.decoder_config(d, STYLE, scan_layers=scan_layers, max_len_default=32768, tie_default=False,
                                     sliding_window=sliding_window(d))


def differences(cfg: DecoderConfig) -> list[str]:
    """The fields that keep `cfg` from being a Qwen2 (empty: it converts)."""
    return llama_like.differences(cfg, STYLE, "Qwen2")


def config_to_hf(cfg: DecoderConfig) -> dict[str, Any]:
    window = cfg.sliding_window
    out = {**llama_like.hf_config(cfg, model_type=MODEL_TYPE, architecture=ARCHITECTURE), "hidden_act": "silu",
           "use_sliding_window": window is not None, "sliding_window": window,
           "layer_types": [FULL if window is None else SLIDING] * cfg.num_layers}
    if window is not None:
        out["max_window_layers"] = 0  # every layer from the first on
    return out


mapping = llama_like.mapping
