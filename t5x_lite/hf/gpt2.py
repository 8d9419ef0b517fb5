"""GPT-2 (`GPT2LMHeadModel`) <-> the decoder-only LM in GPT-2 style (learned positions,
LayerNorm, GELU MLP, biases, tied embeddings).

GPT-2's projections are `Conv1D`s, which keep weights as [in, out] like a Dense kernel, and its
attention has one fused q, k, v projection (`c_attn`) that t5x_lite keeps as three.
"""

from __future__ import annotations

from typing import Any

from t5x_lite.hf.config_json import choice, require
from t5x_lite.hf.errors import ConversionError
from t5x_lite.hf.rules import IDENTITY, Mapping, Rule, Stack, fused_qkv, rule, split_first
from t5x_lite.models.decoder_only import DecoderConfig

MODEL_TYPE = "gpt2"
ARCHITECTURE = "GPT2LMHeadModel"
# Hugging Face activation names -> t5x_lite's (layers.ACTIVATIONS); gelu_new is the tanh approximation.
ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact", "relu": "relu",
               "silu": "silu", "swish": "silu"}
TO_HF_ACTIVATION = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu"}


def dims(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with the defaults transformers fills in (n_inner, and head_dim = n_embd / n_head)."""
    out = dict(hf)
    require(out, ("n_embd", "n_head", "n_layer", "n_positions", "vocab_size"), ARCHITECTURE)
    if out["n_embd"] % out["n_head"]:
        raise ConversionError(f"config.json n_embd={out['n_embd']} is not a multiple of n_head={out['n_head']}.")
    if out.get("n_inner") is None:
        out["n_inner"] = 4 * out["n_embd"]
    out["head_dim"] = out["n_embd"] // out["n_head"]
    return out


def config_from_hf(hf: dict[str, Any], *, scan_layers: bool) -> DecoderConfig:
    d = dims(hf)
    activation = choice(d, "activation_function", "gelu_new", ACTIVATIONS)
    unsupported = {"scale_attn_weights": (True, "attention without the 1/sqrt(head_dim) scale"),
                   "scale_attn_by_inverse_layer_idx": (False, "attention scaled by 1/layer"),
                   "add_cross_attention": (False, "cross-attention layers"),
                   "tie_word_embeddings": (True, "an untied lm_head (t5x_lite's untied logits would have a bias)")}
    for field, (supported, what) in unsupported.items():
        if bool(d.get(field, supported)) != supported:
            raise ConversionError(f"config.json {field}={d[field]!r} ({what}) is not supported.")
    return DecoderConfig(
        vocab_size=d["vocab_size"], emb_dim=d["n_embd"], num_heads=d["n_head"], num_kv_heads=d["n_head"],
        head_dim=d["head_dim"], mlp_dim=d["n_inner"], num_layers=d["n_layer"], max_len=d["n_positions"],
        dropout_rate=0.0, dtype="float32", scan_layers=scan_layers, position_embedding="learned", norm="layernorm",
        norm_epsilon=float(d.get("layer_norm_epsilon", 1e-5)), mlp_activations=(activation,),
        use_bias=True, tie_embeddings=True)


def differences(cfg: DecoderConfig) -> list[str]:
    """The fields that keep `cfg` from being a GPT-2 (empty: it converts)."""
    wanted = {"position_embedding": "learned", "norm": "layernorm", "use_bias": True, "tie_embeddings": True,
              "sliding_window": None, "scale_embeddings": False}
    out = [f"{k}={getattr(cfg, k)!r} (GPT-2: {v!r})" for k, v in wanted.items() if getattr(cfg, k) != v]
    if len(cfg.mlp_activations) != 1 or cfg.mlp_activations[0] not in TO_HF_ACTIVATION:
        out.append(f"mlp_activations={cfg.mlp_activations!r} (GPT-2: one of {sorted(TO_HF_ACTIVATION)})")
    if cfg.num_kv_heads != cfg.num_heads:
        out.append(f"num_kv_heads={cfg.num_kv_heads} (GPT-2: num_heads={cfg.num_heads})")
    if cfg.num_heads * cfg.head_dim != cfg.emb_dim:
        out.append(f"num_heads*head_dim={cfg.num_heads * cfg.head_dim} (GPT-2: emb_dim={cfg.emb_dim})")
    return out


def config_to_hf(cfg: DecoderConfig) -> dict[str, Any]:
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
        "n_embd": cfg.emb_dim, "n_head": cfg.num_heads, "n_layer": cfg.num_layers, "n_positions": cfg.max_len,
        "n_inner": cfg.mlp_dim, "activation_function": TO_HF_ACTIVATION[cfg.mlp_activations[0]],
        "layer_norm_epsilon": 1e-5 if cfg.norm_epsilon is None else cfg.norm_epsilon,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True,
        "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
    }


def mapping(cfg: DecoderConfig, names: set[str] | None = None) -> Mapping:
    """`names`: the tensors a folder holds (reading). GPT2LMHeadModel saves them under 'transformer.';
    files of the original release have no prefix ('wte.weight', 'h.0.attn.c_attn.weight')."""
    prefix = "" if names and "wte.weight" in names and "transformer.wte.weight" not in names else "transformer."
    h, hd = cfg.num_heads, cfg.head_dim
    layer = prefix + "h.{i}."
    block = (
        rule("attn_norm/scale", layer + "ln_1.weight", ("n_embd",)),
        rule("attn_norm/bias", layer + "ln_1.bias", ("n_embd",)),
        Rule(("attention/query/kernel", "attention/key/kernel", "attention/value/kernel"),
             (layer + "attn.c_attn.weight",), (("n_embd", "3*n_embd"),), fused_qkv(h, hd)),
        Rule(("attention/query/bias", "attention/key/bias", "attention/value/bias"),
             (layer + "attn.c_attn.bias",), (("3*n_embd",),), fused_qkv(h, hd)),
        rule("attention/out/kernel", layer + "attn.c_proj.weight", ("n_embd", "n_embd"), split_first(h, hd)),
        rule("attention/out/bias", layer + "attn.c_proj.bias", ("n_embd",)),
        rule("mlp_norm/scale", layer + "ln_2.weight", ("n_embd",)),
        rule("mlp_norm/bias", layer + "ln_2.bias", ("n_embd",)),
        rule("mlp/wi/kernel", layer + "mlp.c_fc.weight", ("n_embd", "n_inner")),
        rule("mlp/wi/bias", layer + "mlp.c_fc.bias", ("n_inner",)),
        rule("mlp/wo/kernel", layer + "mlp.c_proj.weight", ("n_inner", "n_embd")),
        rule("mlp/wo/bias", layer + "mlp.c_proj.bias", ("n_embd",)),
    )
    top = (rule("token_embed/embedding", prefix + "wte.weight", ("vocab_size", "n_embd"), IDENTITY),
           rule("position_embed/embedding", prefix + "wpe.weight", ("n_positions", "n_embd")),
           rule("final_norm/scale", prefix + "ln_f.weight", ("n_embd",)),
           rule("final_norm/bias", prefix + "ln_f.bias", ("n_embd",)))
    # Old files keep the causal-mask buffers; lm_head is the tied copy of wte.
    ignored = (r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias", r"lm_head\.weight")
    return Mapping(top, (Stack("", cfg.num_layers, block),), ignored)

