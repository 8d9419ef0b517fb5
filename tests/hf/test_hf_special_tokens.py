"""An export carries the run's special tokens: transformers' `generate` stops at the run's own EOS.

A run trained on a bare tokenizer.json (no config.json or tokenizer_config.json beside it: its EOS
is the well-known `</s>`, id 1) is exported with `to-hf`; LLaMA's defaults (eos 2) must not apply.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t5x_lite.checkpoints import checkpoint, restored_model  # noqa: E402
from t5x_lite.checkpoints.init_from import unflatten  # noqa: E402
from t5x_lite.data.vocab import hf_vocabulary  # noqa: E402
from t5x_lite.hf import convert  # noqa: E402
from t5x_lite.inference import sample  # noqa: E402
from t5x_lite.models import DecoderConfig  # noqa: E402

TEXTS = ["The cat sat on the mat.", "A dog ran in the park and the cat watched.", "Birds sing in the morning.",
         "She opened the door and walked outside.", "He poured the water into the glass."] * 4
PROMPT = "The cat"
EOS = 1  # "</s>", the tokenizer's second special token
NEW_TOKENS = 12
STOP_AT = 3  # the run's greedy output is made to end with EOS after this many tokens


def _bare_tokenizer_json(path) -> None:
    """A byte-level BPE tokenizer.json trained here, with "<pad>" (0) and "</s>" (1) and no file naming them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(path))


def _save(model_dir, config, params) -> None:
    writer = checkpoint.Checkpointer(str(model_dir), async_save=False)
    writer.save(3, state={"step": jnp.int32(3), "params": params}, iterator_state={},
                metadata={"family": config.family, "model": config.to_dict()})
    writer.close()


def _greedy(model_dir) -> tuple[list[int], list[int]]:
    """(the prompt's ids, t5x-lite's greedy output: `t5x-lite sample --temperature=0`'s tokens)."""
    restored = restored_model.restore(str(model_dir))
    (prompt,), (tokens,) = sample.sample_tokens(model=restored.config, params=restored.params,
                                                vocabulary=restored.vocabulary(), prompts=[PROMPT],
                                                max_new_tokens=NEW_TOKENS, temperature=0.0)
    return prompt, tokens


def test_an_exported_tokenizer_json_run_generates_until_its_own_eos_in_transformers(tmp_path):
    source = tmp_path / "tokenizer" / "tokenizer.json"
    source.parent.mkdir()
    _bare_tokenizer_json(source)
    vocabulary = hf_vocabulary.load_path(str(source))
    assert (vocabulary.eos_id, vocabulary.bos_id, vocabulary.decoder_start_id) == (EOS, None, EOS)

    config = DecoderConfig(vocab_size=320, emb_dim=64, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=96,
                           num_layers=2, max_len=64)
    rng = np.random.default_rng(0)
    params = {path: (1.0 * path.endswith("/scale") + rng.normal(scale=0.3, size=a.shape)).astype(np.float32)
              for path, a in convert.abstract_params(config).items()}
    run = tmp_path / "run"
    _save(run, config, unflatten(params))
    assert hf_vocabulary.write_model_dir_files(vocabulary, str(run)) == ["tokenizer.json"]  # as a run keeps it
    prompt, tokens = _greedy(run)
    assert len(tokens) == NEW_TOKENS and EOS not in tokens, tokens
    # Swap the output rows of EOS and the token greedy writes at STOP_AT: the run's greedy output is
    # the same up to there, then EOS.
    swap = tokens[STOP_AT]
    assert swap not in tokens[:STOP_AT] and swap != EOS
    kernel = params["logits/kernel"]
    kernel[:, [swap, EOS]] = kernel[:, [EOS, swap]]
    stopping = tmp_path / "stopping"
    _save(stopping, config, unflatten(params))
    hf_vocabulary.write_model_dir_files(vocabulary, str(stopping))
    prompt, tokens = _greedy(stopping)
    assert len(tokens) == STOP_AT, tokens  # the run's sampler stopped at its EOS

    out = tmp_path / "hf"
    convert.to_hf(str(stopping), str(out), log=lambda _: None)
    written = {name: json.loads((out / name).read_text())
               for name in ("config.json", "generation_config.json", "tokenizer_config.json")}
    assert {k: written["config.json"].get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")} == {
        "bos_token_id": EOS, "eos_token_id": EOS, "pad_token_id": None}  # the run has no padding token
    assert (written["generation_config.json"]["eos_token_id"], written["generation_config.json"]["pad_token_id"]) == (
        EOS, EOS)
    assert written["tokenizer_config.json"]["eos_token"] == "</s>"

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.bos_token_id) == ("</s>", EOS, EOS)
    assert tokenizer(PROMPT)["input_ids"] == prompt
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    with torch.no_grad():  # the prompt after the run's first token, as the run's sampler reads it
        generated = model.generate(torch.tensor([[tokenizer.bos_token_id, *prompt]]), max_new_tokens=NEW_TOKENS,
                                   do_sample=False)[0, len(prompt) + 1:].tolist()
    assert generated == [*tokens, EOS]  # stopped at the run's EOS, after the run's own greedy tokens


def test_an_original_config_keeps_the_ids_that_name_the_runs_tokens():
    from t5x_lite.hf import special_tokens

    ids = {"bos_token_id": 128000, "eos_token_id": 128001, "pad_token_id": None, "decoder_start_token_id": None}
    original = {"bos_token_id": 128000, "eos_token_id": [128001, 128009], "pad_token_id": 5, "rope_theta": 1.0}
    assert special_tokens.merged(original, ids) == {"bos_token_id": 128000, "eos_token_id": [128001, 128009],
                                                    "rope_theta": 1.0}
    # Another vocabulary's ids (a run on a vocabulary of `prepare` after init_from a GPT-2 conversion).
    gpt2 = {"bos_token_id": 50256, "eos_token_id": 50256}
    assert special_tokens.merged(gpt2, {"bos_token_id": None, "eos_token_id": 1, "pad_token_id": 0}) == {
        "eos_token_id": 1, "pad_token_id": 0}
    assert special_tokens.merged(gpt2, {"decoder_start_token_id": 0}) == {**gpt2, "decoder_start_token_id": 0}
