"""Mistral, Qwen2 and Gemma against transformers (CPU PyTorch, models built here, nothing downloaded).

Each family's tiny random model converts from Hugging Face, scanned and unrolled, with the logits
transformers computes, and back with every tensor bit for bit. The sequences are longer than
the sliding windows, and Mistral's cached greedy decoding runs past its window. A converted
model of each family fine-tunes through the CLI and resumes. Unsupported options are refused
by field.
"""

import json
import shutil

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t5x_lite.checkpoints import restored_model  # noqa: E402
from t5x_lite.checkpoints.init_from import flatten  # noqa: E402
from t5x_lite.hf import convert, families  # noqa: E402
from t5x_lite.hf.errors import ConversionError  # noqa: E402
from t5x_lite.inference import decoding  # noqa: E402
from t5x_lite.models import generation  # noqa: E402
from tests.cli_helpers import VOCAB, losses, run_cli  # noqa: E402
from tests.hf.hf_helpers import (  # noqa: E402
    all_tensors,
    assert_logits_agree,
    assert_same_tensors,
    hf_logits,
    load_hf,
    our_logits,
    perturbed,
)

WINDOW = 8
MAX_LEN = 64
# Width 64, 2 layers; the prepared test data's vocabulary, so that the same models fine-tune through the CLI.
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=MAX_LEN, rms_norm_eps=1e-5, rope_theta=500.0)
HF_MODELS = {
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=WINDOW)),
    "qwen2_tied": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON, tie_word_embeddings=True)),
    # Every layer windowed (max_window_layers=0), the logits untied.
    "qwen2_untied": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **COMMON, tie_word_embeddings=False, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0)),
    # One key/value head of 24: heads * head_dim (96) is not hidden_size (64).
    "gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(
        **{**COMMON, "num_key_value_heads": 1}, head_dim=24, hidden_act="gelu_pytorch_tanh")),
}
# What each conversion must come out as.
EXPECTED = {
    "mistral": dict(sliding_window=WINDOW, qkv_bias=False, tie_embeddings=False, norm="rmsnorm"),
    "qwen2_tied": dict(sliding_window=None, qkv_bias=True, tie_embeddings=True, norm="rmsnorm"),
    "qwen2_untied": dict(sliding_window=WINDOW, qkv_bias=True, tie_embeddings=False, norm="rmsnorm"),
    "gemma": dict(sliding_window=None, qkv_bias=False, tie_embeddings=True, norm="rmsnorm_plus_one",
                  scale_embeddings=True, mlp_activations=("gelu", "linear"), num_kv_heads=1, head_dim=24),
}


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf_families")
    for kind, build in HF_MODELS.items():
        torch.manual_seed(0)
        perturbed(build()).save_pretrained(base / kind)
    return {kind: base / kind for kind in HF_MODELS}


@pytest.fixture(scope="module")
def converted(hf_folders, tmp_path_factory):
    """converted(kind): the folder converted once (scanned) into a t5x_lite model directory; read only."""
    base, done = tmp_path_factory.mktemp("converted"), {}

    def convert_once(kind):
        if kind not in done:
            convert.from_hf(str(hf_folders[kind]), str(base / kind), log=lambda _: None)
            done[kind] = base / kind
        return done[kind]

    return convert_once


def _tokens(seed, shape):
    return np.random.default_rng(seed).integers(1, VOCAB, size=shape)


@pytest.mark.parametrize("kind", list(HF_MODELS))
def test_from_hf_gives_transformers_logits_and_to_hf_gives_back_every_tensor(kind, hf_folders, converted, tmp_path):
    folder = hf_folders[kind]
    original = load_hf(folder)
    inputs = _tokens(0, (2, 40))  # five windows long
    expected = hf_logits(original, inputs)
    for scan in (True, False):
        out = converted(kind) if scan else tmp_path / "unrolled"
        if not scan:
            convert.from_hf(str(folder), str(out), scan_layers=False, log=lambda _: None)
        restored = restored_model.restore(str(out))
        assert restored.config.scan_layers is scan
        assert {k: getattr(restored.config, k) for k in EXPECTED[kind]} == EXPECTED[kind]
        assert_logits_agree(our_logits(restored.config, restored.params, inputs), expected)

        back = tmp_path / f"back_{scan}"
        convert.to_hf(str(out), str(back), log=lambda _: None)
        assert_same_tensors(all_tensors(folder), all_tensors(back))
        config = json.loads((back / "config.json").read_text())
        assert config["model_type"] == json.loads((folder / "config.json").read_text())["model_type"]
        np.testing.assert_array_equal(hf_logits(load_hf(back), inputs), expected)


def test_mistral_cached_decoding_past_the_window_equals_recomputing_and_transformers(hf_folders, converted):
    """Greedy decoding on the KV cache, prompts of two lengths left-padded together, BOS + prompt +
    new tokens four windows long: the same tokens as recomputing the whole forward pass per token,
    and each one transformers' own argmax over the whole sequence."""
    restored = restored_model.restore(str(converted("mistral")))
    prompts = [_tokens(1, 5).tolist(), _tokens(2, 11).tolist()]
    args = dict(model=restored.config, params=restored.params, prompts=prompts, max_new_tokens=20,
                rng=jax.random.PRNGKey(0), temperature=0.0, eos_id=-1)  # no EOS: every row runs 20 tokens
    cached = decoding.generate_batch(**args, use_cache=True)
    assert [len(tokens) for tokens in cached] == [20, 20]
    assert decoding.generate_batch(**args, use_cache=False) == cached
    hf = load_hf(hf_folders["mistral"])
    for prompt, tokens in zip(prompts, cached):
        sequence = [generation.PAD_ID, *prompt, *tokens]  # the model reads BOS (id 0) first
        logits = hf_logits(hf, [sequence])[0, len(prompt):len(sequence) - 1]
        logits[:, generation.PAD_ID] = -np.inf  # never generated
        assert logits.argmax(-1).tolist() == tokens


def _copy_with_config(folder, tmp_path, **changes):
    target = tmp_path / "edited"
    shutil.copytree(folder, target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("kind,changes,match", [
    ("qwen2_untied", dict(max_window_layers=1, layer_types=["full_attention", "sliding_attention"]),
     r"use_sliding_window=True with max_window_layers=1 of num_hidden_layers=2 \(layer_types: 1 sliding, 1 full\) "
     r"mixes sliding-window and full attention layers"),
    ("qwen2_tied", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0}),
     r"rope_parameters\.rope_type='yarn' \(scaled RoPE\) is not supported"),
    ("gemma", dict(final_logit_softcapping=30.0), r"final_logit_softcapping=30\.0 \(Gemma 2's soft-capped logits\)"),
    ("gemma", dict(hidden_activation="gelu"), r"hidden_activation='gelu' \(a Gemma MLP is a gated GELU with the tanh"),
    ("gemma", dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"]),
     r"model_type='gemma2'.*supported: llama \(LlamaForCausalLM\), mistral \(MistralForCausalLM\), qwen2 "
     r"\(Qwen2ForCausalLM\), gemma \(GemmaForCausalLM\)"),
    ("mistral", dict(attention_bias=True), r"attention_bias=True \(biases in every attention projection\)"),
])
def test_unsupported_options_are_refused_by_field_and_nothing_is_written(kind, changes, match, hf_folders, tmp_path):
    folder = _copy_with_config(hf_folders[kind], tmp_path, **changes)
    with pytest.raises(ConversionError, match=match):
        convert.from_hf(str(folder), str(tmp_path / "out"), log=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_a_family_with_every_window_or_none_picks_its_window_from_the_config():
    """Qwen2: layers from max_window_layers on use the window when use_sliding_window is set."""
    qwen2 = families.FAMILIES["qwen2"]
    base = {**COMMON, "model_type": "qwen2", "sliding_window": 16}
    assert qwen2.config_from_hf({**base, "use_sliding_window": True, "max_window_layers": 0},
                                scan_layers=True).sliding_window == 16
    assert qwen2.config_from_hf({**base, "use_sliding_window": True, "max_window_layers": 2},
                                scan_layers=True).sliding_window is None
    assert qwen2.config_from_hf({**base, "use_sliding_window": False, "max_window_layers": 0},
                                scan_layers=True).sliding_window is None
    mistral = families.FAMILIES["mistral"]
    assert mistral.config_from_hf({**COMMON, "sliding_window": None}, scan_layers=True).sliding_window is None


# Published parameter counts of the released models whose shapes gin/models/ holds.
PUBLISHED = {"mistral_7b": 7_241_732_096, "qwen2_0_5b": 494_032_768, "gemma_2b": 2_506_172_416}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_realistic_sizes_have_the_published_parameter_counts_and_estimate_accepts_them(name, capsys):
    from t5x_lite.config import resolve
    from t5x_lite.estimate import command as estimate
    from t5x_lite.estimate import run_from_gin

    model = run_from_gin.model_from_gin(resolve.load_run(gin_files=[f"models/{name}.gin"], entry="train"))
    assert model.num_params() == PUBLISHED[name]
    assert families.for_model(model).MODEL_TYPE == name.split("_")[0]
    args = [f"--gin_file=models/{name}.gin", "--gin_file=runs/pretrain.gin", "--gin.SEQUENCE_LENGTH=8192",
            "--gin.TRAIN_STEPS=1000", "--num_devices=8", "--accelerator=h100-sxm", "--json"]
    assert estimate.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["parameters"]["total"] == PUBLISHED[name]
    # Attention FLOPs over min(sequence, window) positions: Mistral's window of 4096 halves them.
    attended = min(8192, model.sliding_window or 8192)
    assert result["flops"]["per_token_attention"] == 12 * model.num_layers * model.num_heads * model.head_dim * attended


# -- fine-tuning through the CLI --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mistral", "qwen2_tied", "gemma"])
def test_a_converted_model_fine_tunes_through_the_cli(kind, converted, data_dir, tmp_path):
    """`t5x-lite train` with init_from = the conversion: 2 steps from the converted weights (every
    parameter array taken; no evaluation, to keep the run short). Mistral's run is restarted
    with one more step, which resumes its own checkpoint (the restart does not depend on the family)."""
    source = converted(kind)

    def fine_tune(steps: int) -> str:
        result = run_cli("train", "--gin_file=runs/quickstart.gin", f"--gin_file={source / 'model.gin'}",
                         f"--gin.DATA_DIR='{data_dir}'", f"--gin.MODEL_DIR='{tmp_path / 'tune'}'",
                         f"--gin.TRAIN_STEPS={steps}", f"--gin.SEQUENCE_LENGTH={MAX_LEN}", "--gin.BATCH_SIZE=8",
                         "--gin.train.log_period=1", "--gin.train.eval_data=None", "--gin.train.sample_prompt=None",
                         "--gin.train.init_from=@InitFrom()", f"--gin.InitFrom.checkpoint='{source}'")
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout + result.stderr

    first = fine_tune(2)
    count = len(flatten(restored_model.restore(str(source)).params))
    assert f"Initialised {count} of {count} parameter arrays from {source} step 0" in first
    assert len(losses(first)) == 2 and all(np.isfinite(losses(first)))
    assert (tmp_path / "tune" / "checkpoints" / "2").is_dir()
    if kind == "mistral":
        again = fine_tune(3)
        assert "Resuming from the checkpoint at step 2" in again
        assert len(losses(again)) == 1 and np.isfinite(losses(again)[0])
