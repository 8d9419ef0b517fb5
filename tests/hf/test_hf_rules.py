"""The interop pieces that need no PyTorch: safetensors files, the transforms, rule expansion, docs tables."""

import dataclasses
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from t5x_lite.hf import families, gemma, gpt2, llama, mistral, qwen2, rules, safetensors_files, t5
from t5x_lite.hf.errors import ConversionError
from t5x_lite.models import DecoderConfig, T5Config

ROOT = Path(__file__).resolve().parents[2]
GPT2_STYLE = DecoderConfig(position_embedding="learned", norm="layernorm", mlp_activations=("gelu",), use_bias=True,
                           tie_embeddings=True, num_kv_heads=4, head_dim=32)
GEMMA_STYLE = DecoderConfig(norm="rmsnorm_plus_one", mlp_activations=("gelu", "linear"), scale_embeddings=True,
                            tie_embeddings=True, num_kv_heads=1, head_dim=48)
QWEN2_STYLE = DecoderConfig(qkv_bias=True, tie_embeddings=True)


def _tensors(rng):
    return {"a.weight": rng.normal(size=(3, 5)).astype(np.float32),
            "b.bias": rng.normal(size=(7,)).astype(ml_dtypes.bfloat16),
            "c": rng.normal(size=(2, 2, 4)).astype(np.float16),
            "d": rng.normal(size=(40, 10)).astype(np.float32)}


def _write(folder, tensors, max_shard_bytes):
    specs = [safetensors_files.TensorSpec(k, v.shape, v.dtype) for k, v in tensors.items()]
    return safetensors_files.write(str(folder), specs, iter(tensors.items()), max_shard_bytes=max_shard_bytes)


def test_written_file_reads_back_exactly_with_the_safetensors_library(tmp_path):
    tensors = _tensors(np.random.default_rng(0))
    assert _write(tmp_path, tensors, max_shard_bytes=10**9) == ["model.safetensors"]
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(loaded) == sorted(tensors)
    for name, value in tensors.items():
        assert loaded[name].dtype == value.dtype and np.array_equal(loaded[name], value)


def test_shards_and_index_read_back_one_tensor_at_a_time(tmp_path):
    tensors = _tensors(np.random.default_rng(1))
    files = _write(tmp_path, tensors, max_shard_bytes=200)  # 'd' alone is 1600 bytes
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / safetensors_files.INDEX_FILE).read_text())
    assert sorted(index["weight_map"]) == sorted(tensors) and set(index["weight_map"].values()) == set(files)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in tensors.values())
    with safetensors_files.TensorFiles(str(tmp_path)) as read:
        assert read.names() == sorted(tensors)
        assert read.shape("d") == (40, 10) and read.dtype_name("b.bias") == "BF16"
        for name, value in tensors.items():
            assert np.array_equal(read.read(name), value)


def test_a_folder_without_safetensors_names_what_it_holds(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ConversionError, match=r"no model\.safetensors.*pytorch_model\.bin.*re-save it with save_pretrained"):
        safetensors_files.TensorFiles(str(tmp_path))


def test_an_index_naming_a_missing_shard_is_an_error(tmp_path):
    save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    (tmp_path / safetensors_files.INDEX_FILE).write_text(json.dumps(
        {"weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ConversionError, match="model-00002-of-00002.safetensors, which is not in"):
        safetensors_files.TensorFiles(str(tmp_path))


@pytest.mark.parametrize("transform, hf_shapes", [
    (rules.TRANSPOSE, [(6, 4)]),
    (rules.linear_to_heads(3, 2), [(6, 4)]),
    (rules.linear_from_heads(3, 2), [(4, 6)]),
    (rules.split_first(3, 2), [(6, 4)]),
    (rules.fused_qkv(3, 2), [(4, 18)]),
    (rules.fused_qkv(3, 2), [(18,)]),
])
def test_each_transform_is_undone_exactly_by_its_inverse(transform, hf_shapes):
    rng = np.random.default_rng(2)
    hf = [rng.normal(size=s).astype(np.float32) for s in hf_shapes]
    back = transform.to_hf(*transform.to_ours(*hf))
    assert len(back) == len(hf) and all(np.array_equal(a, b) for a, b in zip(hf, back))


def test_linear_kernels_compute_what_torch_linear_computes():
    """torch's Linear is x @ W.T; the converted kernel must give the same projection."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    w_in = rng.normal(size=(6, 4)).astype(np.float32)  # [heads*head_dim, embed]
    [kernel] = rules.linear_to_heads(3, 2).to_ours(w_in)
    np.testing.assert_allclose(np.einsum("be,ehd->bhd", x, kernel).reshape(2, 6), x @ w_in.T, rtol=1e-6)
    w_out = rng.normal(size=(4, 6)).astype(np.float32)  # [embed, heads*head_dim]
    heads = rng.normal(size=(2, 3, 2)).astype(np.float32)
    [kernel] = rules.linear_from_heads(3, 2).to_ours(w_out)
    np.testing.assert_allclose(np.einsum("bhd,hde->be", heads, kernel), heads.reshape(2, 6) @ w_out.T, rtol=1e-6)


def test_expand_names_scanned_and_unrolled_parameters():
    cfg = DecoderConfig(num_layers=2)
    dims = llama.dims(llama.config_to_hf(cfg))
    scanned = rules.expand(llama.mapping(cfg), scanned=True, dims=dims)
    unrolled = rules.expand(llama.mapping(cfg), scanned=False, dims=dims)
    query = [s for s in scanned if s.ours == ("layers/attention/query/kernel",)]
    assert [(s.layer, s.hf) for s in query] == [(0, ("model.layers.0.self_attn.q_proj.weight",)),
                                                 (1, ("model.layers.1.self_attn.q_proj.weight",))]
    assert query[0].hf_shapes == ((cfg.num_heads * cfg.head_dim, cfg.emb_dim),)
    assert {s.ours for s in unrolled if "q_proj" in s.hf[0]} == {
        ("layers_unrolled/layers_0/attention/query/kernel",), ("layers_unrolled/layers_1/attention/query/kernel",)}
    assert all(s.layer is None for s in unrolled)


def test_shape_expressions_name_their_fields():
    assert rules.eval_dim("3*n_embd", {"n_embd": 8}) == 24
    assert rules.describe_shape(("n_embd", "3*n_embd"), {"n_embd": 8}) == "(n_embd=8, 3*n_embd=24)"
    with pytest.raises(ConversionError, match="config.json has no 'n_inner'"):
        rules.eval_dim("n_inner", {})


def test_model_configs_pick_their_family_or_name_the_fields_that_do_not_fit():
    assert families.for_model(DecoderConfig()) is llama
    assert families.for_model(GPT2_STYLE) is gpt2
    assert families.for_model(T5Config()) is t5
    with pytest.raises(ConversionError, match=r"(?s)not a LlamaForCausalLM: norm='layernorm'.*not a GPT2LMHeadModel: "
                                              r"position_embedding='rope'"):
        families.for_model(DecoderConfig(norm="layernorm"))


def test_llama_shaped_models_go_to_the_family_their_options_fit():
    assert families.for_model(DecoderConfig(sliding_window=64)) is mistral
    assert families.for_model(QWEN2_STYLE) is qwen2
    assert families.for_model(dataclasses.replace(QWEN2_STYLE, sliding_window=64, tie_embeddings=False)) is qwen2
    assert families.for_model(GEMMA_STYLE) is gemma
    # The family a model was converted from wins when it fits: a Mistral without a window stays one.
    assert families.for_model(DecoderConfig(), prefer="mistral") is mistral
    assert families.for_model(DecoderConfig(), prefer="gemma") is llama
    with pytest.raises(ConversionError, match=r"(?s)not a MistralForCausalLM: norm='rmsnorm_plus_one'.*"
                                              r"not a GemmaForCausalLM: sliding_window=64 \(Gemma: None\)"):
        families.for_model(dataclasses.replace(GEMMA_STYLE, sliding_window=64))
    with pytest.raises(ConversionError, match=r"not a GPT2LMHeadModel: sliding_window=64 \(GPT-2: None\)"):
        families.for_model(dataclasses.replace(GPT2_STYLE, sliding_window=64))


@pytest.mark.parametrize("family,config", [
    (llama, DecoderConfig(tie_embeddings=True)), (mistral, DecoderConfig(sliding_window=64)),
    (mistral, DecoderConfig()), (qwen2, QWEN2_STYLE), (qwen2, dataclasses.replace(QWEN2_STYLE, sliding_window=64)),
    (gemma, GEMMA_STYLE), (gemma, dataclasses.replace(GEMMA_STYLE, tie_embeddings=False)),
], ids=lambda x: getattr(x, "MODEL_TYPE", ""))
def test_config_json_written_by_to_hf_reads_back_as_the_same_model(family, config):
    config = dataclasses.replace(config, norm_epsilon=1e-5, rope_max_wavelength=500.0)
    written = json.loads(json.dumps(family.config_to_hf(config)))
    assert families.for_hf_config(written) is family
    assert family.config_from_hf(written, scan_layers=True) == config


@pytest.mark.parametrize("config", [
    {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]},
    {"model_type": "mistral", "architectures": ["MistralForSequenceClassification"]},
    {"model_type": "llama", "architectures": ["LlamaForSequenceClassification"]},
])
def test_unsupported_architectures_are_named(config):
    with pytest.raises(ConversionError, match="not supported"):
        families.for_hf_config(config)


def test_docs_show_the_generated_mapping_tables():
    """docs/interop.md's tables are rules.markdown_table's output, so they cannot drift from the code."""
    text = (ROOT / "docs" / "interop.md").read_text()
    for mapping in (llama.mapping(DecoderConfig()), gpt2.mapping(GPT2_STYLE), t5.mapping(T5Config()),
                    qwen2.mapping(QWEN2_STYLE)):
        assert rules.markdown_table(mapping) in text
