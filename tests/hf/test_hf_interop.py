"""Hugging Face interop against transformers itself (CPU PyTorch, models built here, nothing downloaded).

Each family is converted both ways, scanned and unrolled: logits of t5x_lite and of the
transformers model agree on the same tokens, and HF -> t5x_lite -> HF reproduces every tensor
bit for bit. Bad folders fail with one error naming the tensor or field, and write nothing.
"""

import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t5x_lite.checkpoints import checkpoint, restored_model
from t5x_lite.checkpoints.init_from import flatten, unflatten
from t5x_lite.evaluation.eval_loop import MultipleChoiceEval, score_multiple_choice_set
from t5x_lite.hf import command, convert  # noqa: E402
from t5x_lite.hf.convert import abstract_params
from t5x_lite.hf.errors import ConversionError  # noqa: E402
from t5x_lite.inference import scoring
from t5x_lite.models import DecoderConfig, T5Config  # noqa: E402
from tests.cli_helpers import VOCAB, losses, run_cli  # noqa: E402
from tests.hf.hf_helpers import (  # noqa: E402
    SMALL_VOCAB,
    all_tensors,
    assert_logits_agree,
    assert_same_tensors,
    hf_logits,
    our_logits,
    perturbed,
)
from tests.hf.hf_helpers import load_hf as _load_hf  # noqa: E402


def _hf_config(kind: str, vocab_size: int = SMALL_VOCAB):
    if kind == "llama":
        return transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=96,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500.0)
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                       bos_token_id=1, eos_token_id=1)
    # Different encoder and decoder depths, and a short max_distance so the bucketing's log range is used.
    common = dict(vocab_size=vocab_size, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=3,
                  num_heads=4, relative_attention_max_distance=24)
    if kind == "t5_v1_1":
        return transformers.T5Config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, **common)
    return transformers.T5Config(feed_forward_proj="relu", tie_word_embeddings=True, **common)  # T5 1.0


KINDS = ("llama", "gpt2", "t5_v1_1", "t5_1_0")
HF_CLASSES = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "t5_v1_1": "T5ForConditionalGeneration",
              "t5_1_0": "T5ForConditionalGeneration"}


def build_hf_model(kind: str, vocab_size: int = SMALL_VOCAB, noise: float = 0.05):
    """A random transformers model; every parameter perturbed, so norm scales and biases are not 1 or 0."""
    torch.manual_seed(0)
    model = getattr(transformers, HF_CLASSES[kind])(_hf_config(kind, vocab_size)).eval()
    if kind == "t5_v1_1":  # T5 v1.1 has its own output projection
        model.lm_head.weight = torch.nn.Parameter(torch.randn(vocab_size, 64) * 0.05)
    return perturbed(model, noise)


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf")
    folders = {}
    for kind in KINDS:
        build_hf_model(kind).save_pretrained(base / kind)
        folders[kind] = base / kind
    return folders


def _tokens(kind: str):
    rng = np.random.default_rng(0)
    inputs = rng.integers(1, SMALL_VOCAB, size=(2, 40))
    targets = rng.integers(1, SMALL_VOCAB, size=(2, 24))
    targets[:, 0] = 0  # the decoder starts from pad
    return inputs, (targets if kind.startswith("t5") else None)


@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
@pytest.mark.parametrize("kind", KINDS)
def test_from_hf_gives_the_same_logits_and_converts_back_bit_for_bit(kind, scan, hf_folders, tmp_path):
    folder = hf_folders[kind]
    out = tmp_path / "t5x_lite"
    convert.from_hf(str(folder), str(out), scan_layers=scan, log=lambda _: None)
    restored = restored_model.restore(str(out))
    assert restored.config.scan_layers is scan and restored.step == 0
    assert ("layers_unrolled" in str(jax.tree_util.tree_structure(restored.params))) is not scan

    inputs, targets = _tokens(kind)
    original = _load_hf(folder)
    assert_logits_agree(our_logits(restored.config, restored.params, inputs, targets),
                        hf_logits(original, inputs, targets))

    back = tmp_path / "hf_again"
    convert.to_hf(str(out), str(back), log=lambda _: None)
    assert_same_tensors(all_tensors(folder), all_tensors(back))
    # The tokenizer/generation files came back with the weights; transformers loads the folder.
    assert (back / "generation_config.json").exists()
    np.testing.assert_array_equal(hf_logits(_load_hf(back), inputs, targets), hf_logits(original, inputs, targets))


def _t5x_lite_config(kind: str, scan: bool):
    if kind == "llama":
        return DecoderConfig(vocab_size=SMALL_VOCAB, emb_dim=64, num_heads=4, num_kv_heads=2, head_dim=16,
                             mlp_dim=96, num_layers=2, max_len=64, scan_layers=scan, norm_epsilon=1e-5)
    if kind == "gpt2":
        return DecoderConfig(vocab_size=SMALL_VOCAB, emb_dim=64, num_heads=4, num_kv_heads=4, head_dim=16,
                             mlp_dim=128, num_layers=2, max_len=64, scan_layers=scan, position_embedding="learned",
                             norm="layernorm", mlp_activations=("gelu",), use_bias=True, tie_embeddings=True)
    t5_1_0 = kind == "t5_1_0"
    return T5Config(vocab_size=SMALL_VOCAB, emb_dim=64, num_heads=4, head_dim=16, mlp_dim=96,
                    num_encoder_layers=2, num_decoder_layers=3, scan_layers=scan,
                    mlp_activations=("relu",) if t5_1_0 else ("gelu", "linear"), tie_embeddings=t5_1_0,
                    relative_attention_max_distance=24)


def _sharded(params, mesh):
    """Each array split over the 8 devices along its first axis of a size divisible by 8."""
    def place(x):
        axis = next((i for i, n in enumerate(x.shape) if n % 8 == 0), None)
        spec = [None] * x.ndim
        if axis is not None:
            spec[axis] = "data"
        return jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))
    return jax.tree.map(place, params)


def _random_params(config, rng) -> dict:
    """Random parameters of `config`'s shapes without running (or compiling) its initialiser:
    norm scales near 1, everything else small."""

    return unflatten({path: (1.0 * path.endswith("/scale") + rng.normal(scale=0.1, size=a.shape)).astype(np.float32)
                      for path, a in abstract_params(config).items()})


# T5 1.0 differs from v1.1 only in the MLP and the tied, scaled logits, which the round trip above covers.
@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
@pytest.mark.parametrize("kind", ("llama", "gpt2", "t5_v1_1"))
def test_to_hf_of_a_sharded_train_checkpoint_gives_the_same_logits(kind, scan, tmp_path):
    config = _t5x_lite_config(kind, scan)
    inputs, targets = _tokens(kind)
    params = _random_params(config, np.random.default_rng(2))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    sharded = _sharded(params, mesh)
    # A whole train state (the optimizer's moments too) of which only the params are read.
    state = {"step": jnp.int32(7), "params": sharded, "opt_state": {"mu": sharded, "nu": sharded},
             "dropout_rng": jax.random.key_data(jax.random.key(0))}
    writer = checkpoint.Checkpointer(str(tmp_path / "run"), async_save=False)
    writer.save(7, state=state, iterator_state={}, metadata={"family": config.family, "model": config.to_dict()})
    writer.close()

    out = tmp_path / "hf"
    # A small shard limit: the weights are split over several files and an index.
    files = convert.to_hf(str(tmp_path / "run" / "checkpoints" / "7"), str(out), max_shard_bytes=200_000,
                          log=lambda _: None)
    assert len(files) > 1 and (out / "model.safetensors.index.json").exists()
    assert_logits_agree(our_logits(config, params, inputs, targets),
                        hf_logits(_load_hf(out), inputs, targets))


def test_to_hf_in_bfloat16_rounds_each_tensor_once(hf_folders, tmp_path):
    convert.from_hf(str(hf_folders["llama"]), str(tmp_path / "ours"), log=lambda _: None)
    convert.to_hf(str(tmp_path / "ours"), str(tmp_path / "bf16"), dtype="bfloat16", log=lambda _: None)
    before, after = all_tensors(hf_folders["llama"]), all_tensors(tmp_path / "bf16")
    for name, value in before.items():
        assert str(after[name].dtype) == "bfloat16"
        np.testing.assert_array_equal(after[name], value.astype(after[name].dtype))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert model.dtype == torch.bfloat16


# -- bad input -----------------------------------------------------------------------------------


def _copy(folder, tmp_path):
    target = tmp_path / "bad"
    shutil.copytree(folder, target)
    return target


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _rewrite_tensors(folder, edit):
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _fails(folder, tmp_path, match):
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match=match):
        convert.from_hf(str(folder), str(out), log=lambda _: None)
    assert not out.exists()  # nothing written


def test_a_size_that_disagrees_with_the_tensors_names_the_tensor_and_the_field(hf_folders, tmp_path):
    folder = _copy(hf_folders["llama"], tmp_path)
    _edit_config(folder, intermediate_size=80)
    _fails(folder, tmp_path, r"tensor model\.layers\.0\.mlp\.gate_proj\.weight has shape \[96, 64\], but config\.json "
                             r"gives \(intermediate_size=80, hidden_size=64\)")


def test_a_missing_tensor_is_named(hf_folders, tmp_path):
    folder = _copy(hf_folders["t5_v1_1"], tmp_path)
    _rewrite_tensors(folder, lambda t: t.pop("decoder.block.2.layer.1.EncDecAttention.k.weight"))
    _fails(folder, tmp_path, r"missing tensor decoder\.block\.2\.layer\.1\.EncDecAttention\.k\.weight")


def test_a_tensor_the_architecture_does_not_have_is_not_dropped_silently(hf_folders, tmp_path):
    folder = _copy(hf_folders["llama"], tmp_path)
    _rewrite_tensors(folder, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)}))
    _fails(folder, tmp_path, r"unexpected tensor model\.layers\.0\.self_attn\.q_proj\.bias")


def test_scaled_rope_is_refused_by_field(hf_folders, tmp_path):
    folder = _copy(hf_folders["llama"], tmp_path)
    _edit_config(folder, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0})
    _fails(folder, tmp_path, r"rope_parameters\.rope_type='linear'")


def test_the_command_reports_an_unsupported_architecture_with_exit_status_2(hf_folders, tmp_path, capsys):
    folder = _copy(hf_folders["llama"], tmp_path)
    _edit_config(folder, model_type="falcon", architectures=["FalconForCausalLM"])
    with pytest.raises(SystemExit) as exit_info:
        command.main(["from-hf", f"--model_dir={folder}", f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "model_type='falcon'" in err and "supported: llama (LlamaForCausalLM)" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_existing_outputs_are_never_overwritten(hf_folders, tmp_path):
    ours = tmp_path / "ours"
    convert.from_hf(str(hf_folders["gpt2"]), str(ours), log=lambda _: None)
    with pytest.raises(ConversionError, match=r"already holds checkpoints \(steps \[0\]\)"):
        convert.from_hf(str(hf_folders["llama"]), str(ours), log=lambda _: None)
    assert restored_model.restore(str(ours)).config.position_embedding == "learned"  # still the GPT-2
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match="already exists and is not empty"):
        convert.to_hf(str(ours), str(taken), log=lambda _: None)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    assert not list(tmp_path.glob("taken.partial*"))


def test_a_model_without_a_hugging_face_counterpart_names_its_fields(tmp_path):
    config = DecoderConfig(vocab_size=SMALL_VOCAB, emb_dim=32, num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64,
                           num_layers=1, max_len=16, norm="layernorm")
    params = _random_params(config, np.random.default_rng(0))
    writer = checkpoint.Checkpointer(str(tmp_path / "run"), async_save=False)
    writer.save(0, state={"step": jnp.int32(0), "params": params}, iterator_state={},
                metadata={"family": config.family, "model": config.to_dict()})
    writer.close()
    with pytest.raises(ConversionError, match=r"not a LlamaForCausalLM: norm='layernorm'"):
        convert.to_hf(str(tmp_path / "run"), str(tmp_path / "hf"), log=lambda _: None)
    assert not (tmp_path / "hf").exists()


# -- a converted model in the trainer ------------------------------------------------------------


@pytest.mark.slow
def test_a_trained_run_through_hugging_face_fine_tunes_from_where_it_ended(data_dir, trained_run, tmp_path, capsys):
    """The CLI's trained tiny run -> to-hf (transformers computes its logits) -> `convert from-hf`
    (unrolled) -> `t5x-lite train` with init_from: the fine-tune starts where the run ended, its
    loss falls, and a restart resumes its own checkpoint, saying init_from is not used."""
    source, source_stdout = trained_run
    hf = tmp_path / "hf"
    convert.to_hf(str(source), str(hf), log=lambda _: None)
    restored = restored_model.restore(str(source))
    inputs = np.random.default_rng(0).integers(1, VOCAB, size=(2, 32))
    assert_logits_agree(our_logits(restored.config, restored.params, inputs, None),
                        hf_logits(_load_hf(hf), inputs, None))
    # The run has no hf/ files; its token ids come from the vocabulary it was trained with.
    config = json.loads((hf / "config.json").read_text())
    assert (config["pad_token_id"], config["eos_token_id"]) == (0, 1) and "bos_token_id" not in config

    converted = tmp_path / "converted"
    assert command.main(["from-hf", f"--model_dir={hf}", f"--out={converted}", "--scan_layers=false"]) == 0
    assert f"Model gin file: {converted / 'model.gin'}" in capsys.readouterr().out

    def fine_tune(steps: int):
        result = run_cli("train", "--gin_file=runs/quickstart.gin", f"--gin_file={converted / 'model.gin'}",
                         f"--gin.DATA_DIR='{data_dir}'", f"--gin.MODEL_DIR='{tmp_path / 'tune'}'",
                         f"--gin.TRAIN_STEPS={steps}", "--gin.SEQUENCE_LENGTH=64", "--gin.BATCH_SIZE=8",
                         "--gin.train.log_period=1", "--gin.train.eval_batches=1", "--gin.train.sample_prompt=None",
                         "--gin.WarmupCosine.warmup_steps=1", "--gin.train.init_from=@InitFrom()",
                         f"--gin.InitFrom.checkpoint='{converted}'")
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout + result.stderr

    first = fine_tune(8)
    count = len(flatten(restored_model.restore(str(converted)).params))  # unrolled: one array per layer
    assert "starting from train.init_from" in first
    assert f"Initialised {count} of {count} parameter arrays from {converted} step 0" in first
    # Started from the trained weights (they survived the trip through Hugging Face's layout): the
    # fine-tune's first batch is the source run's first (same data, seed and batch), where the source
    # began at its initial loss; the fine-tune starts far below it, and its loss keeps falling.
    source_losses, tuned = losses(source_stdout), losses(first)
    initial = float(re.search(r"step 0: initial loss ([0-9.]+)", source_stdout).group(1))
    assert source_losses[-1] < source_losses[0] - 0.5
    assert tuned[0] < initial - 1.0 and len(tuned) == 8, (initial, tuned)
    assert tuned[-1] < tuned[0], tuned
    again = fine_tune(8)  # nothing left to train: only the restart's choice is checked
    assert "Resuming from the checkpoint at step 8" in again
    assert "train.init_from" in again and "is not used" in again


# -- a converted GPT-2 with its own tokenizer ------------------------------------------------------

TEXTS = ["The cat sat on the mat.", "A dog ran in the park and the cat watched.", "Birds sing in the morning.",
         "She opened the door and walked outside.", "He poured the water into the glass."] * 4


def _byte_level_bpe(vocab_size: int):
    """A GPT-2 style byte-level BPE tokenizer trained here (nothing downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def test_a_converted_gpt2_scores_multiple_choice_with_its_own_tokenizer(tmp_path):
    """The HellaSwag scorer on a GPT-2 conversion: text through the folder's tokenizer.json, the
    endings' log-likelihoods equal to transformers' own."""

    tokenizer = _byte_level_bpe(300)
    eos = tokenizer.token_to_id("<|endoftext|>")
    model = build_hf_model("gpt2", vocab_size=300)
    model.config.bos_token_id = model.config.eos_token_id = eos
    model.save_pretrained(tmp_path / "gpt2")
    tokenizer.save(str(tmp_path / "gpt2" / "tokenizer.json"))
    convert.from_hf(str(tmp_path / "gpt2"), str(tmp_path / "ours"), log=lambda _: None)
    restored = restored_model.restore(str(tmp_path / "ours"))
    vocabulary = restored.vocabulary()
    assert vocabulary.eos_id == eos
    assert vocabulary.encode(TEXTS[1]) == tokenizer.encode(TEXTS[1]).ids
    assert vocabulary.decode(vocabulary.encode(TEXTS[1]) + [eos, 5]) == TEXTS[1]

    examples = [{"context": "The cat", "endings": ["sat on the mat.", "ran in the park.", "sings.", "glass"],
                 "label": 0},
                {"context": "He poured the", "endings": ["door.", "water into the glass.", "morning", "cat"],
                 "label": 1},
                {"context": "Birds", "endings": ["watched.", "opened the door.", "sing in the morning.", "mat"],
                 "label": 2}]
    path = tmp_path / "hellaswag.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in examples))
    ours = score_multiple_choice_set(MultipleChoiceEval(str(path)), model=restored.config, params=restored.params,
                                     encode=vocabulary.encode)

    requests = [(vocabulary.encode(e["context"]), vocabulary.encode(" " + ending))
                for e in examples for ending in e["endings"]]
    our_ll = [ll for ll, _, _ in scoring.continuation_logprobs(model=restored.config, params=restored.params,
                                                                   requests=requests, batch_size=4)]
    hf_ll = []
    for context, continuation in requests:  # the scorer conditions on [BOS] + context, as lm-eval does
        ids = torch.tensor([[scoring.BOS_ID, *context, *continuation]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
        targets = ids[0, 1:]
        hf_ll.append(float(logprobs[torch.arange(len(targets)), targets][len(context):].sum()))
    np.testing.assert_allclose(our_ll, hf_ll, rtol=1e-4, atol=1e-4)
    picks = np.asarray(hf_ll).reshape(len(examples), 4).argmax(axis=1)
    assert ours["acc"] == np.mean(picks == [e["label"] for e in examples])
