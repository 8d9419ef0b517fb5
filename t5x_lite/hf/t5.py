"""T5 and T5 v1.1 (`T5ForConditionalGeneration`) <-> t5x_lite's encoder-decoder.

T5 v1.1 (gated GELU, untied unscaled logits) and T5 1.0 (ReLU, logits from the shared
embedding scaled by 1/sqrt(d_model)) both convert. Hugging Face keeps each stack's relative
position bias in its first block; t5x_lite keeps one table per stack.
"""

from __future__ import annotations

from typing import Any

from t5x_lite.hf.config_json import choice, require
from t5x_lite.hf.rules import IDENTITY, TRANSPOSE, Mapping, Stack, linear_from_heads, linear_to_heads, rule
from t5x_lite.models.encoder_decoder import T5Config

MODEL_TYPE = "t5"
ARCHITECTURE = "T5ForConditionalGeneration"
# feed_forward_proj -> mlp_activations. Hugging Face runs 'gated-gelu' with the tanh GELU (gelu_new),
# which is t5x_lite's 'gelu'; a plain 'gelu' is the exact one.
FEED_FORWARD = {"gated-gelu": ("gelu", "linear"), "relu": ("relu",), "gated-relu": ("relu", "linear"),
                "gated-silu": ("silu", "linear"), "gelu": ("gelu_exact",), "silu": ("silu",)}


def dims(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with the defaults transformers fills in (num_decoder_layers = num_layers)."""
    out = dict(hf)
    require(out, ("d_model", "d_kv", "d_ff", "num_heads", "num_layers", "vocab_size"), ARCHITECTURE)
    if out.get("num_decoder_layers") is None:
        out["num_decoder_layers"] = out["num_layers"]
    out.setdefault("relative_attention_num_buckets", 32)
    out.setdefault("relative_attention_max_distance", 128)
    return out


def scales_logits(hf: dict[str, Any]) -> bool:
    """T5 1.0 scales the decoder output by 1/sqrt(d_model) and ties lm_head to the embedding.

    transformers >= 5 writes `scale_decoder_outputs`; older configs say it with `tie_word_embeddings`.
    """
    return bool(hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True)))


def config_from_hf(hf: dict[str, Any], *, scan_layers: bool) -> T5Config:
    d = dims(hf)
    activations = choice(d, "feed_forward_proj", "relu", FEED_FORWARD)
    return T5Config(
        vocab_size=d["vocab_size"], emb_dim=d["d_model"], num_heads=d["num_heads"], head_dim=d["d_kv"],
        mlp_dim=d["d_ff"], num_encoder_layers=d["num_layers"], num_decoder_layers=d["num_decoder_layers"],
        dropout_rate=0.0, dtype="float32", scan_layers=scan_layers, mlp_activations=activations,
        tie_embeddings=scales_logits(d), relative_attention_num_buckets=d["relative_attention_num_buckets"],
        relative_attention_max_distance=d["relative_attention_max_distance"],
        norm_epsilon=float(d.get("layer_norm_epsilon", 1e-6)))


def differences(cfg: T5Config) -> list[str]:
    """The fields that keep `cfg` from converting (empty: it converts)."""
    if tuple(cfg.mlp_activations) not in FEED_FORWARD.values():
        return [f"mlp_activations={cfg.mlp_activations!r} (Hugging Face T5: one of "
                f"{sorted(FEED_FORWARD.values())})"]
    return []


def config_to_hf(cfg: T5Config) -> dict[str, Any]:
    proj = next(k for k, v in FEED_FORWARD.items() if v == tuple(cfg.mlp_activations))
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
        "d_model": cfg.emb_dim, "d_kv": cfg.head_dim, "d_ff": cfg.mlp_dim, "num_heads": cfg.num_heads,
        "num_layers": cfg.num_encoder_layers, "num_decoder_layers": cfg.num_decoder_layers,
        "feed_forward_proj": proj, "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
        "relative_attention_max_distance": cfg.relative_attention_max_distance,
        "layer_norm_epsilon": 1e-6 if cfg.norm_epsilon is None else cfg.norm_epsilon,
        "tie_word_embeddings": cfg.tie_embeddings, "is_encoder_decoder": True, "dropout_rate": 0.0,
        "decoder_start_token_id": 0,
    }


def _attention(prefix: str, h: int, hd: int) -> tuple:
    heads_in = linear_to_heads(h, hd)
    return (rule(f"{prefix[0]}/query/kernel", prefix[1] + "q.weight", ("num_heads*d_kv", "d_model"), heads_in),
            rule(f"{prefix[0]}/key/kernel", prefix[1] + "k.weight", ("num_heads*d_kv", "d_model"), heads_in),
            rule(f"{prefix[0]}/value/kernel", prefix[1] + "v.weight", ("num_heads*d_kv", "d_model"), heads_in),
            rule(f"{prefix[0]}/out/kernel", prefix[1] + "o.weight", ("d_model", "num_heads*d_kv"),
                 linear_from_heads(h, hd)))


def _mlp(layer: str, gated: bool) -> tuple:
    names = ("wi_0", "wi_1") if gated else ("wi",)
    return tuple(rule(f"mlp/{n}/kernel", f"{layer}DenseReluDense.{n}.weight", ("d_ff", "d_model"), TRANSPOSE)
                 for n in names) + (rule("mlp/wo/kernel", f"{layer}DenseReluDense.wo.weight", ("d_model", "d_ff"),
                                         TRANSPOSE),)


def mapping(cfg: T5Config, names: set[str] | None = None) -> Mapping:
    """`names`: the tensors a folder holds (reading), which picks the embedding's and logits' sources."""
    h, hd = cfg.num_heads, cfg.head_dim
    gated = len(cfg.mlp_activations) == 2
    enc, dec = "encoder.block.{i}.layer.", "decoder.block.{i}.layer."
    encoder = ((rule("attn_norm/scale", enc + "0.layer_norm.weight", ("d_model",)),)
               + _attention(("attention", enc + "0.SelfAttention."), h, hd)
               + (rule("mlp_norm/scale", enc + "1.layer_norm.weight", ("d_model",)),) + _mlp(enc + "1.", gated))
    decoder = ((rule("attn_norm/scale", dec + "0.layer_norm.weight", ("d_model",)),)
               + _attention(("attention", dec + "0.SelfAttention."), h, hd)
               + (rule("cross_attn_norm/scale", dec + "1.layer_norm.weight", ("d_model",)),)
               + _attention(("cross_attention", dec + "1.EncDecAttention."), h, hd)
               + (rule("mlp_norm/scale", dec + "2.layer_norm.weight", ("d_model",)),) + _mlp(dec + "2.", gated))
    embedding = "shared.weight"
    if names is not None and embedding not in names:
        embedding = next((n for n in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight") if n in names),
                         embedding)
    bias_shape = ("relative_attention_num_buckets", "num_heads")
    top = [rule("token_embed/embedding", embedding, ("vocab_size", "d_model"), IDENTITY),
           rule("encoder/relpos_bias/rel_embedding", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                bias_shape, TRANSPOSE),
           rule("encoder/final_norm/scale", "encoder.final_layer_norm.weight", ("d_model",)),
           rule("decoder/relpos_bias/rel_embedding", "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                bias_shape, TRANSPOSE),
           rule("decoder/final_norm/scale", "decoder.final_layer_norm.weight", ("d_model",))]
    # The embedding's tied copies, and a cross-attention bias Hugging Face itself never uses.
    ignored = (r"(encoder|decoder)\.embed_tokens\.weight",
               r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight")
    if cfg.tie_embeddings:
        ignored += (r"lm_head\.weight",)
    else:
        # Unscaled logits with lm_head tied to the embedding (a model created by transformers >= 5
        # with tie_word_embeddings=False) read the embedding as the logits kernel.
        source = "lm_head.weight" if names is None or "lm_head.weight" in names else embedding
        top.append(rule("decoder/logits/kernel", source, ("vocab_size", "d_model"), TRANSPOSE))
    return Mapping(tuple(top), (Stack("encoder", cfg.num_encoder_layers, encoder),
                                Stack("decoder", cfg.num_decoder_layers, decoder)), ignored)
