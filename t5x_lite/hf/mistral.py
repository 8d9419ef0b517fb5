"""Mistral (`MistralForCausalLM`) <-> the decoder-only LM in LLaMA style with a sliding attention window.

A Mistral is a LLaMA whose attention may see only the last `sliding_window` positions
(`DecoderConfig.sliding_window`; config.json's null: every earlier position). Sizes, RoPE and
tensors are llama_like.py's.
"""

from __future__ import annotations

from typing import Any

from t5x_lite.hf import llama, llama_like
from t5x_lite.hf.errors import ConversionError
from t5x_lite.models.decoder_only import DecoderConfig

MODEL_TYPE = "mistral"
ARCHITECTURE = "MistralForCausalLM"
# A LLaMA's fields, except that any sliding window converts.
STYLE = {k: v for k, v in llama.STYLE.items() if k != "sliding_window"}
REFUSED = llama.REFUSED


def dims(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with the defaults transformers fills in (head_dim, num_key_value_heads)."""
    return llama_like.dims({"hidden_act": "silu", **hf}, ARCHITECTURE)


def sliding_window(hf: dict[str, Any]) -> int | None:
    """config.json's sliding_window (absent: transformers' default 4096; null: none)."""
    window = hf.get("sliding_window", 4096)
    if window is not None and not (isinstance(window, int) and not isinstance(window, bool) and window >= 1):
        raise ConversionError(f"config.json sliding_window={window!r} must be a positive integer or null.")
    return window


def config_from_hf(hf: dict[str, Any], *, scan_layers: bool) -> DecoderConfig:
    d = dims(hf)
    llama_like.refuse(d, REFUSED)
    return llama_like.decoder_config(d, STYLE, scan_layers=scan_layers, max_len_default=4096 * 32, tie_default=False,
                                     sliding_window=sliding_window(d))


def differences(cfg: DecoderConfig) -> list[str]:
    """The fields that keep `cfg` from being a Mistral (empty: it converts)."""
    return llama_like.differences(cfg, STYLE, "Mistral")


def config_to_hf(cfg: DecoderConfig) -> dict[str, Any]:
    return {**llama_like.hf_config(cfg, model_type=MODEL_TYPE, architecture=ARCHITECTURE), "hidden_act": "silu",
            "sliding_window": cfg.sliding_window}


mapping = llama_like.mapping
