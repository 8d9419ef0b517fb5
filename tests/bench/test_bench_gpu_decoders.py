"""bench/gpu_decoders.py's PyTorch column: which peer trains each shipped model, and the peer itself
at tiny sizes on CPU (bench/torch_reference.py peer_measure; PyTorch optional)."""

from __future__ import annotations

import dataclasses

import pytest

from bench import gpu_decoders, torch_reference
from t5x_lite.models import DecoderConfig

TINY = dict(gpu_decoders.TINY, max_len=64, dtype="bfloat16")
GPT2 = DecoderConfig(**TINY, position_embedding="learned", norm="layernorm", mlp_activations=("gelu",),
                     use_bias=True, tie_embeddings=True)
LLAMA = DecoderConfig(**TINY)
SETTINGS = {"batch_size": 2, "seq_len": 32, "warmup_steps": 1, "steps": 2, "windows": 2, "device": "cpu",
            "compile": False, "learning_rate": 1e-3, "weight_decay": 0.01, "seed": 0}


@pytest.mark.parametrize("name,style", [("gpt2_125m", "gpt2"), ("gpt2_350m", "gpt2"), ("decoder_125m", "llama"),
                                        ("decoder_1_3b", "llama"), ("qwen2_0_5b", None), ("mistral_7b", None),
                                        ("gemma_2b", None)])
def test_each_shipped_model_has_its_peer(name, style):
    cfg = gpu_decoders.gin_model(name)
    assert torch_reference.peer_style(cfg.to_dict()) == style
    # The CPU stand-ins keep their peer (GPT-2's MLP of 4 x emb_dim).
    assert torch_reference.peer_style(dataclasses.replace(cfg, **gpu_decoders.TINY).to_dict()) == style


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_the_peer_trains_the_same_model(cfg):
    pytest.importorskip("torch")
    if cfg is LLAMA:
        pytest.importorskip("transformers")
    r = torch_reference.peer_measure(cfg.metadata()["model"], SETTINGS)
    assert r["style"] == torch_reference.peer_style(cfg.to_dict())
    # Like for like: every parameter of the t5x_lite model, the tied GPT-2 table once.
    assert r["params"] == cfg.num_params()
    assert r["matmul_params"] == torch_reference.library_matmul_params(cfg)
    assert r["tokens_per_s"] == pytest.approx(SETTINGS["batch_size"] * SETTINGS["seq_len"] / r["step_s"])
    assert r["loss"] < r["first_loss"], r
    assert not r["compiled"] and not r["fused_adamw"] and r["device"] == "cpu"


def test_no_peer_is_an_error_not_a_number():
    pytest.importorskip("torch")
    with pytest.raises(SystemExit, match="no PyTorch peer"):
        torch_reference.peer_measure(dataclasses.replace(LLAMA, qkv_bias=True).metadata()["model"], SETTINGS)
    assert gpu_decoders.torch_column({"torch": "off"}) == "--torch off"
