"""Gemma (`GemmaForCausalLM`, Gemma 1) <-> the decoder-only LM with Gemma's options.

Gemma is LLaMA-shaped (the tensors of llama_like.py) with a gated GELU MLP (tanh
approximation: t5x_lite's ('gelu', 'linear')), RMSNorm scaled by (1 + scale) with the scale
stored as Hugging Face stores it (`norm='rmsnorm_plus_one'`), token embeddings multiplied by
sqrt(hidden_size) (`scale_embeddings`), and by default a tied `lm_head`. Gemma 2's additions
(logit soft-capping, a query scale of its own, sliding windows) are refused by field.
"""

from __future__ import annotations

from typing import Any

from t5x_lite.hf import llama, llama_like
from t5x_lite.models.decoder_only import DecoderConfig

MODEL_TYPE = "gemma"
ARCHITECTURE = "GemmaForCausalLM"
TANH_GELU = "gelu_pytorch_tanh"
STYLE = {**llama.STYLE, "norm": "rmsnorm_plus_one", "mlp_activations": ("gelu", "linear"), "scale_embeddings": True}
# Gemma's releases write hidden_act='gelu' and mean the tanh approximation (transformers reads it so).
REFUSED = {
    "hidden_act": (("gelu", TANH_GELU), "a Gemma MLP is a gated GELU with the tanh approximation"),
    "hidden_activation": ((None, TANH_GELU), "a Gemma MLP is a gated GELU with the tanh approximation"),
    "attention_bias": ((None, False), "biases in every attention projection"),
    "use_bidirectional_attention": ((None, False), "attention that is not causal"),
    "final_logit_softcapping": ((None,), "Gemma 2's soft-capped logits"),
    "attn_logit_softcapping": ((None,), "Gemma 2's soft-capped attention scores"),
    "sliding_window": ((None,), "Gemma 2's sliding-window layers"),
}


def dims(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with the defaults transformers fills in (head_dim, num_key_value_heads)."""
    return llama_like.dims({"hidden_act": TANH_GELU, **hf}, ARCHITECTURE)


def config_from_hf(hf: dict[str, Any], *, scan_layers: bool) -> DecoderConfig:
    d = dims(hf)
    llama_like.refuse(d, REFUSED)
    scalar = d.get("query_pre_attn_scalar")
    if scalar is not None and scalar != d["head_dim"]:
        llama_like.refuse(d, {"query_pre_attn_scalar": ((None, d["head_dim"]), "Gemma 2's query scale")})
    return llama_like.decoder_config(d, STYLE, scan_layers=scan_layers, max_len_default=8192, tie_default=True)


def differences(cfg: DecoderConfig) -> list[str]:
    """The fields that keep `cfg` from being a Gemma (empty: it converts)."""
    return llama_like.differences(cfg, STYLE, "Gemma")


def config_to_hf(cfg: DecoderConfig) -> dict[str, Any]:
    return {**llama_like.hf_config(cfg, model_type=MODEL_TYPE, architecture=ARCHITECTURE), "hidden_act": TANH_GELU,
            "hidden_activation": TANH_GELU, "attention_bias": False}


mapping = llama_like.mapping
