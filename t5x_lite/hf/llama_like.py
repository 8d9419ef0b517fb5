"""What LLaMA, Mistral, Qwen2 and Gemma share: config.json's sizes and RoPE, one tensor layout
(`model.layers.N.self_attn.q_proj.weight`, ...), and checks that name the fields a family refuses.

Each family module states its style (the `DecoderConfig` fields that make a model that family)
and its own config.json fields; the sizes, the RoPE base, the epsilon, the tied or untied
`lm_head` and the name mapping (with q, k and v biases when the style has them) are here.
Both sides use the same rotary layout (the two halves of each head rotated together, Hugging
Face's `rotate_half`), so q and k kernels need no permutation, only a transpose and a reshape.
"""

from __future__ import annotations

from typing import Any

from t5x_lite.hf.config_json import require
from t5x_lite.hf.errors import ConversionError
from t5x_lite.hf.rules import IDENTITY, TRANSPOSE, Mapping, Stack, linear_from_heads, linear_to_heads, rule, split_heads
from t5x_lite.models.decoder_only import DecoderConfig

SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")


def rope_theta(hf: dict[str, Any]) -> float:
    """RoPE's base; only the plain (unscaled) RoPE is converted."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        field = "rope_parameters" if "rope_parameters" in hf else "rope_scaling"
        raise ConversionError(f"config.json {field}.rope_type={kind!r} (scaled RoPE) is not supported; "
                              "only the default RoPE converts.")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def dims(hf: dict[str, Any], architecture: str) -> dict[str, Any]:
    """config.json with the defaults transformers fills in (head_dim, num_key_value_heads)."""
    out = dict(hf)
    require(out, SIZES, architecture)
    if out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = out["num_attention_heads"]
    if out.get("head_dim") is None:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    return out


def refuse(hf: dict[str, Any], fields: dict[str, tuple[tuple[Any, ...], str]]) -> None:
    """`fields`: {name: (values that convert, what another value means)}; a field set to another
    value (absent counts as None) raises a ConversionError naming it."""
    for field, (allowed, what) in fields.items():
        value = hf.get(field)
        if value not in allowed:
            shown = " or ".join(repr(a) for a in allowed if a is not None) or "null"
            shown += " (or absent)" if None in allowed else ""
            raise ConversionError(f"config.json {field}={value!r} ({what}) is not supported; only {shown} converts.")


def decoder_config(d: dict[str, Any], style: dict[str, Any], *, scan_layers: bool, max_len_default: int,
                   tie_default: bool, **fields: Any) -> DecoderConfig:
    """A DecoderConfig of config.json's sizes (`d` from `dims`) in `style` (a family's STYLE: the
    fields that make a model that family), with a family's other `fields` (Mistral's window)."""
    return DecoderConfig(
        vocab_size=d["vocab_size"], emb_dim=d["hidden_size"], num_heads=d["num_attention_heads"],
        num_kv_heads=d["num_key_value_heads"], head_dim=d["head_dim"], mlp_dim=d["intermediate_size"],
        num_layers=d["num_hidden_layers"], max_len=d.get("max_position_embeddings") or max_len_default,
        dropout_rate=0.0, dtype="float32", scan_layers=scan_layers, rope_max_wavelength=rope_theta(d),
        norm_epsilon=float(d.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(d.get("tie_word_embeddings", tie_default)), **style, **fields)


def differences(cfg: DecoderConfig, style: dict[str, Any], family: str) -> list[str]:
    """The fields where `cfg` differs from `style`, as 'field=value (family: value)' (empty: it converts)."""
    return [f"{k}={getattr(cfg, k)!r} ({family}: {v!r})" for k, v in style.items() if getattr(cfg, k) != v]


def hf_config(cfg: DecoderConfig, *, model_type: str, architecture: str) -> dict[str, Any]:
    """The config.json fields the LLaMA-shaped families share."""
    return {
        "architectures": [architecture], "model_type": model_type, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.emb_dim, "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_len, "rms_norm_eps": 1e-6 if cfg.norm_epsilon is None else cfg.norm_epsilon,
        "rope_theta": cfg.rope_max_wavelength,
        "rope_parameters": {"rope_theta": cfg.rope_max_wavelength, "rope_type": "default"},
        "tie_word_embeddings": cfg.tie_embeddings,
    }


def mapping(cfg: DecoderConfig, names: set[str] | None = None) -> Mapping:
    """The rules (these files name their tensors one way, so `names` is not needed)."""
    del names
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layer = "model.layers.{i}."
    q_shape, kv_shape = "num_attention_heads*head_dim", "num_key_value_heads*head_dim"
    block = [
        rule("attn_norm/scale", layer + "input_layernorm.weight", ("hidden_size",)),
        rule("attention/query/kernel", layer + "self_attn.q_proj.weight", (q_shape, "hidden_size"),
             linear_to_heads(h, hd)),
        rule("attention/key/kernel", layer + "self_attn.k_proj.weight", (kv_shape, "hidden_size"),
             linear_to_heads(kv, hd)),
        rule("attention/value/kernel", layer + "self_attn.v_proj.weight", (kv_shape, "hidden_size"),
             linear_to_heads(kv, hd)),
    ]
    if cfg.qkv_bias:
        block += [rule("attention/query/bias", layer + "self_attn.q_proj.bias", (q_shape,), split_heads(h, hd)),
                  rule("attention/key/bias", layer + "self_attn.k_proj.bias", (kv_shape,), split_heads(kv, hd)),
                  rule("attention/value/bias", layer + "self_attn.v_proj.bias", (kv_shape,), split_heads(kv, hd))]
    block += [
        rule("attention/out/kernel", layer + "self_attn.o_proj.weight", ("hidden_size", q_shape),
             linear_from_heads(h, hd)),
        rule("mlp_norm/scale", layer + "post_attention_layernorm.weight", ("hidden_size",)),
        rule("mlp/wi_0/kernel", layer + "mlp.gate_proj.weight", ("intermediate_size", "hidden_size"), TRANSPOSE),
        rule("mlp/wi_1/kernel", layer + "mlp.up_proj.weight", ("intermediate_size", "hidden_size"), TRANSPOSE),
        rule("mlp/wo/kernel", layer + "mlp.down_proj.weight", ("hidden_size", "intermediate_size"), TRANSPOSE),
    ]
    top = [rule("token_embed/embedding", "model.embed_tokens.weight", ("vocab_size", "hidden_size"), IDENTITY),
           rule("final_norm/scale", "model.norm.weight", ("hidden_size",))]
    ignored = (r"model\.rotary_emb\..*", r"model\.layers\.\d+\.self_attn\.rotary_emb\..*")
    if cfg.tie_embeddings:
        ignored += (r"lm_head\.weight",)  # a tied copy, when a file holds one
    else:
        top.append(rule("logits/kernel", "lm_head.weight", ("vocab_size", "hidden_size"), TRANSPOSE))
    return Mapping(tuple(top), (Stack("", cfg.num_layers, tuple(block)),), ignored)
