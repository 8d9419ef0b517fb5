"""LLaMA (`LlamaForCausalLM`) <-> the decoder-only LM in LLaMA style (RoPE, RMSNorm, SwiGLU, GQA).

The sizes, RoPE and the tensor layout are llama_like.py's, which Mistral, Qwen2 and Gemma share.
"""

from __future__ import annotations

from typing import Any

from t5x_lite.hf import llama_like
from t5x_lite.models.decoder_only import DecoderConfig

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"
ACTIVATIONS = ("silu", "linear")
# The DecoderConfig fields that make a model a LLaMA.
STYLE = {"position_embedding": "rope", "norm": "rmsnorm", "mlp_activations": ACTIVATIONS, "use_bias": False,
         "qkv_bias": False, "scale_embeddings": False, "sliding_window": None}
# config.json fields that must have these values (a SwiGLU MLP, no biases).
REFUSED = {"hidden_act": (("silu", "swish"), "a LLaMA MLP is SwiGLU"),
           "attention_bias": ((None, False), "biases in every attention projection"),
           "mlp_bias": ((None, False), "biases in the MLP")}


def dims(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with the defaults transformers fills in (head_dim, num_key_value_heads)."""
    return llama_like.dims({"hidden_act": "silu", **hf}, ARCHITECTURE)


def config_from_hf(hf: dict[str, Any], *, scan_layers: bool) -> DecoderConfig:
    d = dims(hf)
    llama_like.refuse(d, REFUSED)
    return llama_like.decoder_config(d, STYLE, scan_layers=scan_layers, max_len_default=2048, tie_default=False)


def differences(cfg: DecoderConfig) -> list[str]:
    """The fields that keep `cfg` from being a LLaMA (empty: it converts)."""
    return llama_like.differences(cfg, STYLE, "LLaMA")


def config_to_hf(cfg: DecoderConfig) -> dict[str, Any]:
    return {**llama_like.hf_config(cfg, model_type=MODEL_TYPE, architecture=ARCHITECTURE), "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False}


mapping = llama_like.mapping
