"""LLaMA (`LlamaForCausalLM`) <-> the decoder-only LM in LLaMA style (RoPE, RMSNorm, SwiGLU, GQA).

Both use the same rotary layout (the two halves of each head rotated together, Hugging Face's
`rotate_half`), so q and k kernels need no permutation, only a transpose and a reshape.
"""

from __future__ import annotations

from typing import Any

from t5x_lite.hf.config_json import require
from t5x_lite.hf.errors import ConversionError
from t5x_lite.hf.rules import IDENTITY, TRANSPOSE, Mapping, Stack, linear_from_heads, linear_to_heads, rule
from t5x_lite.models.decoder_only import DecoderConfig

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"
ACTIVATIONS = ("silu", "linear")


def _rope_theta(hf: dict[str, Any]) -> float:
    """RoPE's base; only the plain (unscaled) RoPE is converted."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        field = "rope_parameters" if "rope_parameters" in hf else "rope_scaling"
        raise ConversionError(f"config.json {field}.rope_type={kind!r} (scaled RoPE) is not supported; "
                              "only the default RoPE converts.")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def dims(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with the defaults transformers fills in (head_dim, num_key_value_heads)."""
    out = dict(hf)
    require(out, ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"),
            ARCHITECTURE)
    out.setdefault("num_key_value_heads", out["num_attention_heads"])
    if out.get("head_dim") is None:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    return out


def config_from_hf(hf: dict[str, Any], *, scan_layers: bool) -> DecoderConfig:
    d = dims(hf)
    if d.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ConversionError(f"config.json hidden_act={d['hidden_act']!r} is not supported; a LLaMA MLP is SwiGLU "
                              "(hidden_act='silu').")
    for field in ("attention_bias", "mlp_bias"):
        if d.get(field):
            raise ConversionError(f"config.json {field}=true is not supported: t5x_lite's LLaMA style has no biases.")
    return DecoderConfig(
        vocab_size=d["vocab_size"], emb_dim=d["hidden_size"], num_heads=d["num_attention_heads"],
        num_kv_heads=d["num_key_value_heads"], head_dim=d["head_dim"], mlp_dim=d["intermediate_size"],
        num_layers=d["num_hidden_layers"], max_len=d.get("max_position_embeddings", 2048), dropout_rate=0.0,
        dtype="float32", scan_layers=scan_layers, rope_max_wavelength=_rope_theta(d), position_embedding="rope",
        norm="rmsnorm", norm_epsilon=float(d.get("rms_norm_eps", 1e-6)), mlp_activations=ACTIVATIONS,
        use_bias=False, tie_embeddings=bool(d.get("tie_word_embeddings", False)))


def differences(cfg: DecoderConfig) -> list[str]:
    """The fields that keep `cfg` from being a LLaMA (empty: it converts)."""
    wanted = {"position_embedding": "rope", "norm": "rmsnorm", "mlp_activations": ACTIVATIONS, "use_bias": False}
    return [f"{k}={getattr(cfg, k)!r} (LLaMA: {v!r})" for k, v in wanted.items() if getattr(cfg, k) != v]


def config_to_hf(cfg: DecoderConfig) -> dict[str, Any]:
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.emb_dim, "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": 1e-6 if cfg.norm_epsilon is None else cfg.norm_epsilon,
        "rope_theta": cfg.rope_max_wavelength,
        "rope_parameters": {"rope_theta": cfg.rope_max_wavelength, "rope_type": "default"},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": cfg.tie_embeddings,
    }


def mapping(cfg: DecoderConfig, names: set[str] | None = None) -> Mapping:
    """The rules (LLaMA files name their tensors one way, so `names` is not needed)."""
    del names
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layer = "model.layers.{i}."
    block = (
        rule("attn_norm/scale", layer + "input_layernorm.weight", ("hidden_size",)),
        rule("attention/query/kernel", layer + "self_attn.q_proj.weight",
             ("num_attention_heads*head_dim", "hidden_size"), linear_to_heads(h, hd)),
        rule("attention/key/kernel", layer + "self_attn.k_proj.weight",
             ("num_key_value_heads*head_dim", "hidden_size"), linear_to_heads(kv, hd)),
        rule("attention/value/kernel", layer + "self_attn.v_proj.weight",
             ("num_key_value_heads*head_dim", "hidden_size"), linear_to_heads(kv, hd)),
        rule("attention/out/kernel", layer + "self_attn.o_proj.weight",
             ("hidden_size", "num_attention_heads*head_dim"), linear_from_heads(h, hd)),
        rule("mlp_norm/scale", layer + "post_attention_layernorm.weight", ("hidden_size",)),
        rule("mlp/wi_0/kernel", layer + "mlp.gate_proj.weight", ("intermediate_size", "hidden_size"), TRANSPOSE),
        rule("mlp/wi_1/kernel", layer + "mlp.up_proj.weight", ("intermediate_size", "hidden_size"), TRANSPOSE),
        rule("mlp/wo/kernel", layer + "mlp.down_proj.weight", ("hidden_size", "intermediate_size"), TRANSPOSE),
    )
    top = [rule("token_embed/embedding", "model.embed_tokens.weight", ("vocab_size", "hidden_size"), IDENTITY),
           rule("final_norm/scale", "model.norm.weight", ("hidden_size",))]
    ignored = (r"model\.rotary_emb\..*", r"model\.layers\.\d+\.self_attn\.rotary_emb\..*")
    if cfg.tie_embeddings:
        ignored += (r"lm_head\.weight",)  # a tied copy, when a file holds one
    else:
        top.append(rule("logits/kernel", "lm_head.weight", ("vocab_size", "hidden_size"), TRANSPOSE))
    return Mapping(tuple(top), (Stack("", cfg.num_layers, block),), ignored)
