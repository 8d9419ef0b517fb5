"""`t5x-lite eval` and `t5x-lite infer` over a model directory with two checkpoints of a tiny decoder."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite.checkpoints import restored_model
from t5x_lite.checkpoints.checkpoint import CheckpointMismatchError
from t5x_lite.checkpoints.lookup import CheckpointNotFoundError
from t5x_lite.errors import ConfigValueError, TaskDataError
from t5x_lite.evaluation import eval_loop
from t5x_lite.evaluation import perplexity as perplexity_eval
from t5x_lite.evaluation.eval_loop import steps_to_evaluate
from t5x_lite.inference import decoding, infer_loop, predict
from t5x_lite.inference.infer_loop import chunk_ranges, shard_chunks
from t5x_lite.models import DecoderConfig, T5Config
from tests.cli_helpers import VOCAB, run_cli, run_cli_in_process, start_cli
from tests.evaluation.model_dirs import save_model_dir

STEPS = (2, 4)


def _model_config():

    return DecoderConfig(vocab_size=VOCAB, emb_dim=32, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64,
                         num_layers=2, max_len=64)


def _save_model_dir(path: Path, cfg, data_dir: Path, steps=STEPS) -> Path:
    """MODEL_DIR with a checkpoint of random params at each step and the data's vocabulary."""
    tokens = jnp.zeros((1, 8), jnp.int32)
    args = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
    return save_model_dir(path, cfg, {step: cfg.make_module().init(jax.random.PRNGKey(step), *args)["params"]
                                      for step in steps}, data_dir)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, data_dir):
    """A tiny decoder's MODEL_DIR with checkpoints at steps 2 and 4 (different random params)."""
    return _save_model_dir(tmp_path_factory.mktemp("eval") / "run", _model_config(), data_dir)


def _restored(model_dir: Path, step: int):

    return restored_model.restore(str(model_dir), step=step)


def test_steps_to_evaluate():

    assert steps_to_evaluate([2, 4, 6], set(), step=None, every_checkpoint=False) == [6]
    assert steps_to_evaluate([2, 4, 6], {6}, step=None, every_checkpoint=False) == []
    assert steps_to_evaluate([2, 4, 6], {4}, step=None, every_checkpoint=True) == [2, 6]
    assert steps_to_evaluate([2, 4, 6], {4}, step=4, every_checkpoint=True) == [4]
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint at step 5"):
        steps_to_evaluate([2, 4, 6], set(), step=5, every_checkpoint=False)


def test_every_chunk_belongs_to_exactly_one_shard():

    for num_prompts, chunk_size in [(1, 4), (10, 3), (12, 4), (7, 7), (100, 9)]:
        ranges = chunk_ranges(num_prompts, chunk_size)
        assert [i for b, e in ranges for i in range(b, e)] == list(range(num_prompts))
        for num_shards in (1, 2, 3, 5):
            owned = sorted(c for s in range(num_shards) for c in shard_chunks(len(ranges), shard_index=s,
                                                                              num_shards=num_shards))
            assert owned == list(range(len(ranges)))
    with pytest.raises(ConfigValueError, match="shard_index=2"):
        shard_chunks(4, shard_index=2, num_shards=2)


def _write_hellaswag(path: Path, n: int = 6) -> Path:
    lines = [{"ind": i, "activity_label": "Coding", "ctx_a": f"def f{i}(x):", "ctx_b": "return x",
              "ctx": "", "split": "val", "split_type": "indomain", "label": i % 4, "source_id": "t",
              "endings": ["+ 1", "* 2", "- 3", "[title] x"]} for i in range(n)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_eval_cli_every_checkpoint_then_skips_what_is_done(model_dir, data_dir, tmp_path):

    hellaswag = _write_hellaswag(tmp_path / "hellaswag.jsonl")
    out = tmp_path / "results"
    flags = ["--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{model_dir}'", f"--gin.evaluate.output_dir='{out}'",
             "--gin.evaluate.every_checkpoint=True",
             "--gin.evaluate.perplexity=@PerplexityEval()", "--gin.PerplexityEval.mixture_or_task_name=@lm_task()",
             "--gin.lm_task.name='eval_lm'", f"--gin.lm_task.data_dir='{data_dir}'",
             "--gin.PerplexityEval.context_length=32", "--gin.PerplexityEval.stride=16",
             "--gin.PerplexityEval.max_documents=3",
             "--gin.evaluate.multiple_choice=[@hellaswag/MultipleChoiceEval()]",
             f"--gin.hellaswag/MultipleChoiceEval.path='{hellaswag}'"]
    result = run_cli("eval", *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = {step: json.loads((out / f"step_{step}.json").read_text()) for step in STEPS}
    assert "step 2: hellaswag acc" in result.stdout and "step 4: eval_lm validation perplexity" in result.stdout
    assert saved[2]["perplexity"]["loss"] != saved[4]["perplexity"]["loss"]  # two different checkpoints
    assert saved[4]["hellaswag"]["examples"] == 6
    assert list((out / "tb" / "perplexity").glob("events.out.tfevents.*"))

    # The same numbers computed directly from the checkpoint, with the documents as seqio's task gives them.
    from t5x_lite.data.tasks.lm import lm_task

    restored = _restored(model_dir, 4)
    task = lm_task(name="eval_lm_direct", data_dir=str(data_dir))
    docs = [ex["targets"].tolist() for ex in task.get_dataset(sequence_length={"targets": 65536}, split="validation",
                                                              shuffle=False, num_epochs=1).take(3).as_numpy_iterator()]
    direct = perplexity_eval.perplexity(model=restored.config, params=restored.params, documents=docs, context_length=32,
                                   stride=16, batch_size=3)
    assert saved[4]["perplexity"]["loss"] == pytest.approx(direct["loss"], rel=1e-6)
    assert saved[4]["perplexity"]["tokens"] == direct["tokens"]

    # Run again: every checkpoint is done, so nothing is evaluated; a named step is evaluated again.
    again = eval_loop.evaluate(model_dir=str(model_dir), every_checkpoint=True, output_dir=str(out),
                               multiple_choice=[eval_loop.MultipleChoiceEval(path=str(hellaswag))])
    assert again == {}
    named = eval_loop.evaluate(model_dir=str(model_dir), step=2, output_dir=str(out),
                               multiple_choice=[eval_loop.MultipleChoiceEval(path=str(hellaswag))])
    assert named[2]["hellaswag"] == saved[2]["hellaswag"]


def test_seqio_evaluation_scores_the_models_own_predictions(model_dir, data_dir, tmp_path):
    """Targets set to the model's greedy output for half the examples: accuracy must be exactly 50%."""
    from t5x_lite.data.tasks.text_to_text import text_to_text_task

    restored = _restored(model_dir, 4)
    vocabulary = restored.vocabulary()
    inputs = [f"def f{i}(x): return x + {i}" for i in range(8)]
    decoding = predict.DecodingConfig(max_decode_length=6)
    prompts = [list(vocabulary.encode(text)) + [vocabulary.eos_id] for text in inputs]
    predicted = predict.predict(model=restored.config, params=restored.params, prompts=prompts,
                                decoding_config=decoding, eos_id=vocabulary.eos_id)
    texts = [vocabulary.decode(tokens) for tokens in predicted]
    assert len(set(texts)) > 1, texts  # random params still give varied outputs
    targets = [text if i % 2 == 0 else text + " different" for i, text in enumerate(texts)]
    path = _write_pairs(tmp_path / "pairs.jsonl", zip(inputs, targets))
    name = text_to_text_task(name="pairs", splits={"validation": str(path)}, vocabulary=str(restored.vocabulary_file),
                             metrics=("accuracy", "log_likelihood"))

    out = tmp_path / "results"
    results = eval_loop.evaluate(model_dir=str(model_dir), output_dir=str(out), seqio_evals=[
        eval_loop.SeqioEval(mixture_or_task_name=name, batch_size=3, decoding=decoding)])
    metrics = results[4]["seqio"][name]
    assert metrics["accuracy"] == pytest.approx(50.0)
    pairs = [(p, list(vocabulary.encode(t)) + [vocabulary.eos_id]) for p, t in zip(prompts, targets)]
    scores = predict.score(model=restored.config, params=restored.params, pairs=pairs, batch_size=8)
    assert metrics["log_likelihood"] == pytest.approx(np.mean(scores), rel=1e-5)
    # seqio's loggers: one metrics line per step and the step's predictions.
    assert json.loads((out / "seqio" / f"{name}-metrics.jsonl").read_text().splitlines()[-1])["step"] == 4
    logged = [json.loads(line) for line in (out / "seqio" / f"{name}-000004.jsonl").read_text().splitlines()]
    assert [line["prediction"] for line in logged] == texts


def _write_pairs(path: Path, pairs) -> Path:
    path.write_text("".join(json.dumps({"inputs": a, "targets": b}) + "\n" for a, b in pairs))
    return path


def test_t5_beam_search_through_seqio_eval_and_infer_over_a_task(data_dir, tmp_path):
    """The encoder-decoder path: seqio predictions are beam search's, infer reads a task's inputs."""
    from t5x_lite.data.tasks.text_to_text import text_to_text_task

    cfg = T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=2,
                   num_decoder_layers=2)
    model_dir = _save_model_dir(tmp_path / "t5", cfg, data_dir, steps=(3,))
    inputs = [f"x = {i} * y" for i in range(5)]
    path = _write_pairs(tmp_path / "pairs.jsonl", [(text, "y") for text in inputs])
    name = text_to_text_task(name="t5_pairs", splits={"validation": str(path)}, vocabulary=str(data_dir / "spm.model"),
                             metrics=("bleu", "rouge"))
    beam = predict.DecodingConfig(method="beam", beam_size=3, max_decode_length=5)
    results = eval_loop.evaluate(model_dir=str(model_dir), output_dir=str(tmp_path / "results"), seqio_evals=[
        eval_loop.SeqioEval(mixture_or_task_name=name, batch_size=2, decoding=beam)])
    assert set(results[3]["seqio"][name]) >= {"bleu", "rouge1", "rouge2", "rougeLsum"}

    restored = _restored(model_dir, 3)
    vocabulary = restored.vocabulary()
    encoded = [list(vocabulary.encode(text)) + [vocabulary.eos_id] for text in inputs]
    expected = [vocabulary.decode(tokens) for tokens in decoding.beam_search(
        model=cfg, params=restored.params, inputs=encoded, max_decode_length=5, beam_size=3, alpha=0.6,
        eos_id=vocabulary.eos_id)]
    logged = [json.loads(line) for line in (tmp_path / "results" / "seqio" / f"{name}-000003.jsonl").read_text().splitlines()]
    assert [line["prediction"] for line in logged] == expected

    output = tmp_path / "out.jsonl"
    infer_loop.infer(model_dir=str(model_dir), output=str(output), mixture_or_task_name=name, decoding=beam,
                     chunk_size=2, batch_size=2)
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(5))
    assert [line["inputs"] for line in lines] == inputs and {line["targets"] for line in lines} == {"y"}
    assert [line["output"] for line in lines] == expected


def _write_prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt": f"def f{i}(x):"}) + "\n" for i in range(n)))
    return path


INFER = dict(chunk_size=2, batch_size=2)


def _infer(model_dir: Path, prompts: Path, output: Path, **kwargs):
    return infer_loop.infer(model_dir=str(model_dir), output=str(output), prompts_file=str(prompts),
                            decoding=predict.DecodingConfig(max_decode_length=8), **INFER, **kwargs)


def test_infer_shards_join_into_the_single_run_output(model_dir, tmp_path):
    prompts = _write_prompts(tmp_path / "prompts.jsonl", 7)
    _infer(model_dir, prompts, tmp_path / "single.jsonl", shard_index=0, num_shards=1)
    single = (tmp_path / "single.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in single] == list(range(7))
    assert all("output" in json.loads(line) for line in single)

    sharded = tmp_path / "sharded.jsonl"
    first = _infer(model_dir, prompts, sharded, shard_index=1, num_shards=2)
    assert first == {"written": 2, "skipped": 0} and not sharded.exists()  # chunks 1 and 3 of 0..3
    _infer(model_dir, prompts, sharded, shard_index=0, num_shards=2)
    assert sharded.read_text().splitlines() == single


def test_infer_rejects_changed_settings_long_prompts_and_a_mismatched_model(model_dir, tmp_path):
    import dataclasses

    prompts = _write_prompts(tmp_path / "prompts.jsonl", 3)
    output = tmp_path / "out.jsonl"
    _infer(model_dir, prompts, output, shard_index=0, num_shards=2)
    before = sorted(p.name for p in (tmp_path / "out.jsonl.parts").iterdir())

    with pytest.raises(ConfigValueError, match="chunk_size: before 2, now 1"):
        infer_loop.infer(model_dir=str(model_dir), output=str(output), prompts_file=str(prompts), chunk_size=1,
                         batch_size=2, decoding=predict.DecodingConfig(max_decode_length=8))
    assert sorted(p.name for p in (tmp_path / "out.jsonl.parts").iterdir()) == before

    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "x = 1\n"}) + "\n" + json.dumps({"prompt": "y = 2 " * 200}) + "\n")
    with pytest.raises(ConfigValueError, match=r"prompt 1 has \d+ tokens.*max_len=64"):
        _infer(model_dir, long, tmp_path / "long_out.jsonl")
    assert not (tmp_path / "long_out.jsonl.parts").exists()

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TaskDataError, match="has no prompts"):
        _infer(model_dir, empty, tmp_path / "empty_out.jsonl")

    other = dataclasses.replace(_model_config(), emb_dim=48)
    with pytest.raises(CheckpointMismatchError, match="emb_dim: checkpoint 32 vs config 48"):
        _infer(model_dir, prompts, tmp_path / "other.jsonl", model=other)


def test_infer_cli_killed_then_resumed_writes_every_line_once(model_dir, tmp_path):
    prompts = _write_prompts(tmp_path / "prompts.jsonl", 12)
    output = tmp_path / "out.jsonl"
    flags = ["--gin_file=runs/infer.gin", f"--gin.MODEL_DIR='{model_dir}'", f"--gin.PROMPTS='{prompts}'",
             f"--gin.OUTPUT='{output}'", "--gin.infer.chunk_size=2", "--gin.infer.batch_size=2",
             "--gin.DecodingConfig.max_decode_length=8", "--gin.DecodingConfig.method='sample'",
             "--gin.DecodingConfig.temperature=0.9"]
    process = start_cli("infer", *flags)
    for line in process.stdout:
        if line.startswith("chunk 2/6"):
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not output.exists()
    finished_before = len(list((tmp_path / "out.jsonl.parts").glob("chunk-*.jsonl")))
    assert 2 <= finished_before < 6

    resumed = run_cli("infer", *flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"wrote 12 outputs to {output}" in resumed.stdout
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["id"] for line in lines] == list(range(12))

    # Sampling is seeded per batch, so the interrupted run equals one that never stopped.

    infer_loop.infer(model_dir=str(model_dir), output=str(tmp_path / "whole.jsonl"), prompts_file=str(prompts),
                     decoding=predict.DecodingConfig(max_decode_length=8, method="sample", temperature=0.9), **INFER)
    assert output.read_text() == (tmp_path / "whole.jsonl").read_text()

    too_long = tmp_path / "long.jsonl"
    too_long.write_text(json.dumps({"prompt": "y = 2 " * 200}) + "\n")
    bad = run_cli_in_process("infer", *flags[:2], f"--gin.PROMPTS='{too_long}'",  # refused up front
                             f"--gin.OUTPUT='{tmp_path / 'bad.jsonl'}'")
    assert bad.returncode == 2 and "prompt 0 has" in bad.stderr, bad.stderr[-2000:]
