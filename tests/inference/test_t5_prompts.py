"""A T5's prompts are encoded as the task that trains it encodes its inputs: EOS last.

The same examples through infer's two routes, a task's split and a jsonl file of prompts, and
through `t5x-lite sample`, give the same outputs; read without EOS they would not.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from t5x_lite.checkpoints import restored_model
from t5x_lite.inference import infer_loop, predict, prompts, sample
from t5x_lite.models import DecoderConfig, T5Config
from tests.cli_helpers import VOCAB
from tests.evaluation.model_dirs import save_model_dir

INPUTS = [f"x = {i} * y + {12 - i}" for i in range(12)]
GREEDY = predict.DecodingConfig(max_decode_length=6)


@pytest.fixture(scope="module")
def t5_run(tmp_path_factory, data_dir):
    """(MODEL_DIR of a tiny T5, the name of a text-to-text task over INPUTS with the run's vocabulary)."""
    from t5x_lite.data.tasks.text_to_text import text_to_text_task

    base = tmp_path_factory.mktemp("t5_prompts")
    cfg = T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=2,
                   num_decoder_layers=2)
    tokens = jnp.zeros((1, 8), jnp.int32)
    params = cfg.make_module().init(jax.random.PRNGKey(1), tokens, tokens)["params"]
    model_dir = save_model_dir(base / "run", cfg, {2: params}, data_dir)
    pairs = base / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"inputs": text, "targets": "y"}) + "\n" for text in INPUTS))
    name = text_to_text_task(name="t5_prompt_pairs", splits={"validation": str(pairs)},
                             vocabulary=str(data_dir / "spm.model"))
    return model_dir, name


def _outputs(path) -> list[str]:
    return [json.loads(line)["output"] for line in path.read_text().splitlines()]


def test_a_prompts_file_gives_the_task_routes_outputs(t5_run, tmp_path, capsys):
    model_dir, name = t5_run
    infer_loop.infer(model_dir=str(model_dir), output=str(tmp_path / "task.jsonl"), mixture_or_task_name=name,
                     decoding=GREEDY, batch_size=4)
    assert "note:" not in capsys.readouterr().out  # the task's inputs end as a prompt's do
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in INPUTS))
    infer_loop.infer(model_dir=str(model_dir), output=str(tmp_path / "file.jsonl"), prompts_file=str(prompts_file),
                     decoding=GREEDY, batch_size=4)
    from_task, from_file = _outputs(tmp_path / "task.jsonl"), _outputs(tmp_path / "file.jsonl")
    assert from_file == from_task
    manifest = json.loads((tmp_path / "file.jsonl.parts" / "manifest.json").read_text())
    assert manifest["prompt_encoding"] == "text then EOS"

    # Without the EOS the same model writes other outputs for some of these prompts.
    restored = restored_model.restore(str(model_dir))
    vocabulary = restored.vocabulary()
    bare = predict.predict(model=restored.config, params=restored.params, decoding_config=GREEDY, batch_size=4,
                           prompts=[vocabulary.encode(text) for text in INPUTS], eos_id=vocabulary.eos_id)
    assert [vocabulary.decode(tokens) for tokens in bare] != from_task

    # `t5x-lite sample` reads a T5's prompt the same way, and prints its output.
    capsys.readouterr()
    assert sample.main([f"--model_dir={model_dir}", *(f"--prompt={text}" for text in INPUTS[:4]),
                        "--temperature=0", f"--max_new_tokens={GREEDY.max_decode_length}"]) == 0
    printed = capsys.readouterr().out
    assert printed == "[step 2]" + "".join(f"\n--- {text!r}\n{out}" for text, out in zip(INPUTS, from_task[:4])) + "\n"


def test_only_an_encoder_decoders_prompt_ends_with_eos(data_dir):
    from t5x_lite.data.vocab.sentencepiece_vocabulary import SentencePieceVocabulary

    vocabulary = SentencePieceVocabulary(str(data_dir / "spm.model"))
    t5 = T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64)
    decoder = DecoderConfig(vocab_size=VOCAB, emb_dim=32, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64,
                            num_layers=2, max_len=64)
    ids = vocabulary.encode("x = 1 * y")
    assert prompts.encode_prompt(t5, vocabulary, "x = 1 * y") == [*ids, vocabulary.eos_id]
    assert prompts.encode_prompt(decoder, vocabulary, "x = 1 * y") == ids  # a continued prompt: unchanged
    assert sample.encode_prompts(vocabulary, ["x = 1 * y "], decoder) == [ids]  # trailing space left to the model
    assert prompts.task_encoding_note(t5, "pairs", True) is None
    note = prompts.task_encoding_note(decoder, "pairs", True)
    assert "'pairs'" in note and "add_eos=True" in note and "infer.prompts_file" in note
