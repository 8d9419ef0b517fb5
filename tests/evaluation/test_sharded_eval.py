"""Evaluation and inference on a mesh: FSDP-sharded params give the single-device results, and
seqio metrics work on a trained model whose predictions stop at EOS (ragged outputs).

The 8 host devices come from tests/conftest.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x_lite.checkpoints import restored_model
from t5x_lite.checkpoints.restored_model import RestoredModel
from t5x_lite.evaluation import eval_loop, multiple_choice, seqio_metrics
from t5x_lite.evaluation import perplexity as perplexity_eval
from t5x_lite.inference import decoding, predict
from t5x_lite.models import T5Config
from t5x_lite.models import losses as losses_lib
from t5x_lite.parallel.placement import FSDP_AXES, Placement
from tests.cli_helpers import VOCAB
from tests.evaluation.model_dirs import random_decoder_dir, save_model_dir

# Targets of different lengths: a trained model's predictions stop at EOS after 1 to 4 words.
PAIRS = [("red apple", "fruit"), ("blue sky", "weather is fine"), ("green tree", "a plant that grows"),
         ("old house", "home"), ("fast car", "it drives"), ("cold ice", "frozen water is cold"),
         ("hot tea", "drink"), ("tall man", "a person")]


def _encode(vocabulary, text: str) -> list[int]:
    return list(vocabulary.encode(text)) + [vocabulary.eos_id]


def _train_t5(cfg: T5Config, pairs: list[tuple[list[int], list[int]]], steps: int) -> dict:
    """Teacher-forced cross-entropy with Adam until the model reproduces every target."""
    inputs, targets = cfg.score_call(pairs, bos_id=None).rows  # padded as the model scores them
    decoder_inputs = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]
    module = cfg.make_module()
    params = module.init(jax.random.PRNGKey(0), encoder_input_tokens=inputs, decoder_input_tokens=decoder_inputs)
    params = params["params"]
    optimizer = optax.adam(1e-2)

    def loss_fn(params):
        logits = module.apply({"params": params}, encoder_input_tokens=inputs, decoder_input_tokens=decoder_inputs)
        nll, _ = losses_lib.cross_entropy_with_logits(logits, jnp.asarray(targets))
        weights = targets > 0
        return jnp.sum(nll * weights) / jnp.sum(weights)

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = optimizer.init(params)
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state)
    assert float(loss) < 0.01, float(loss)
    return jax.device_get(params)


@pytest.fixture(scope="module")
def trained_t5(tmp_path_factory, data_dir):
    """(MODEL_DIR, config, the pairs as text) of a tiny T5 trained until it reproduces PAIRS."""
    import seqio

    vocabulary = seqio.SentencePieceVocabulary(str(data_dir / "spm.model"))
    cfg = T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=2,
                   num_decoder_layers=2)
    params = _train_t5(cfg, [(_encode(vocabulary, a), _encode(vocabulary, b)) for a, b in PAIRS], steps=300)
    return save_model_dir(tmp_path_factory.mktemp("t5") / "run", cfg, {300: params}, data_dir), cfg


def _write_pairs(path: Path) -> Path:
    path.write_text("".join(json.dumps({"inputs": a, "targets": b}) + "\n" for a, b in PAIRS))
    return path


def _mean_prediction_score(targets, predictions, aux_values):
    """A predict_with_aux metric: the mean of the scores that come with the predictions."""
    del targets, predictions
    return {"mean_score": float(np.mean(aux_values["scores"]))}


def _register_readme_task(name: str, path: Path, spm: str) -> str:
    """A task written the seqio README way: TextLineDataSource, a TSV parse, tokenize, append_eos,
    and metric_fns (t5's accuracy, and a predict_with_aux metric)."""
    import seqio
    import t5.evaluation.metrics
    import tensorflow as tf

    if name in seqio.TaskRegistry.names():
        return name
    path.write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS))
    vocabulary = seqio.SentencePieceVocabulary(spm)

    def parse_tsv(dataset):
        def split(line):
            fields = tf.strings.split(line, "\t")
            return {"inputs": fields[0], "targets": fields[1]}
        return dataset.map(split)

    features = {"inputs": seqio.Feature(vocabulary, add_eos=True), "targets": seqio.Feature(vocabulary, add_eos=True)}
    seqio.TaskRegistry.add(
        name, source=seqio.TextLineDataSource(split_to_filepattern={"validation": str(path)}),
        preprocessors=[parse_tsv, seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features=features, metric_fns=[t5.evaluation.metrics.accuracy, _mean_prediction_score])
    return name


def test_seqio_metrics_on_a_trained_model_whose_predictions_stop_at_eos(trained_t5, data_dir, tmp_path):
    """Ragged predictions (each stops at its EOS) crashed seqio's Evaluator ('inhomogeneous shape');
    now accuracy is what seqio's own metric gives on the same predictions, for a task registered
    the seqio README way and for the project's text_to_text_task."""
    import t5.evaluation.metrics

    model_dir, cfg = trained_t5
    from t5x_lite.data.tasks.text_to_text import text_to_text_task
    ours = text_to_text_task(name="ragged_pairs", splits={"validation": str(_write_pairs(tmp_path / "p.jsonl"))},
                             vocabulary=str(data_dir / "spm.model"), metrics=("accuracy",))
    out = tmp_path / "results"
    greedy = predict.DecodingConfig(max_decode_length=32)
    results = eval_loop.evaluate(model_dir=str(model_dir), output_dir=str(out), seqio_evals=[
        eval_loop.SeqioEval(mixture_or_task_name=ours, batch_size=3, decoding=greedy)])
    logged = [json.loads(line) for line in (out / "seqio" / f"{ours}-000300.jsonl").read_text().splitlines()]
    predictions = [line["prediction"] for line in logged]
    assert predictions == [b for _, b in PAIRS]  # trained: every output stops at its EOS
    assert len({len(p.split()) for p in predictions}) > 1
    expected = t5.evaluation.metrics.accuracy([b for _, b in PAIRS], predictions)
    assert results[300]["seqio"][ours]["accuracy"] == pytest.approx(expected["accuracy"]) == pytest.approx(100.0)

    readme = _register_readme_task("readme_pairs", tmp_path / "pairs.tsv", str(data_dir / "spm.model"))
    results = eval_loop.evaluate(model_dir=str(model_dir), output_dir=str(tmp_path / "readme"), seqio_evals=[
        eval_loop.SeqioEval(mixture_or_task_name=readme, batch_size=3, decoding=greedy)])
    metrics = results[300]["seqio"][readme]
    assert metrics["accuracy"] == pytest.approx(100.0)
    # The aux scores are the model's log-likelihood of each prediction given its inputs.
    restored = restored_model.restore(str(model_dir))
    vocabulary = restored.vocabulary()
    pairs = [(_encode(vocabulary, a), list(vocabulary.encode(b))) for a, b in PAIRS]
    scores = predict.score(model=cfg, params=restored.params, pairs=pairs, batch_size=8)
    assert metrics["mean_score"] == pytest.approx(np.mean(scores), rel=1e-5)
    assert -5.0 < metrics["mean_score"] < 0.0


def test_pad_predictions_pads_ragged_outputs_with_eos():
    assert seqio_metrics.pad_predictions([[5, 6], [], [7]], eos_id=1) == [[5, 6, 1], [1, 1, 1], [7, 1, 1]]
    assert seqio_metrics.pad_predictions([], eos_id=1) == []


# -- FSDP over 8 devices gives the single-device results -------------------------------------------

def _single_device(restored: RestoredModel) -> RestoredModel:
    """The same checkpoint on this process's first device alone."""
    placement = Placement.single_device()
    params = placement.place_params(restored.config, jax.device_get(restored.params))
    return RestoredModel(config=restored.config, params=params, step=restored.step, model_dir=restored.model_dir,
                         placement=placement)


def _assert_no_device_holds_a_whole_kernel(params) -> None:
    """Every kernel and embedding table is split 8 ways (the small relative-position table is not)."""
    checked = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        if jax.tree_util.keystr(path).endswith(("['kernel']", "['embedding']")):
            checked += 1
            assert len(leaf.sharding.device_set) == 8, (path, leaf.sharding)
            for shard in leaf.addressable_shards:
                assert shard.data.size * 8 == leaf.size, (jax.tree_util.keystr(path), leaf.shape, shard.data.shape)
    assert checked >= 5


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory, data_dir):
    return random_decoder_dir(tmp_path_factory.mktemp("decoder") / "run", data_dir)


def test_fsdp_decoder_scores_and_decodes_as_on_one_device(decoder_dir):
    """Perplexity within 1e-5 (relative) of one device's, multiple-choice accuracy and greedy tokens equal."""
    sharded = restored_model.restore(str(decoder_dir), mesh_axes=FSDP_AXES)
    _assert_no_device_holds_a_whole_kernel(sharded.params)
    assert sharded.placement.batch_shards == 8
    single = _single_device(sharded)
    cfg, vocabulary = sharded.config, sharded.vocabulary()
    rng = np.random.default_rng(0)
    documents = [rng.integers(2, VOCAB, size=n).tolist() for n in (150, 40, 97)]
    examples = [multiple_choice.MultipleChoiceExample(context=f"def f{i}(x):", endings=["return x", "pass", "x = 1"],
                                                      label=i % 3) for i in range(5)]
    prompts = [list(vocabulary.encode(text)) for text in ("import os", "def f(x):", "class A", "x = 1", "")]
    results = {}
    for name, restored in (("fsdp", sharded), ("single", single)):
        run = functools.partial(dict, model=cfg, params=restored.params, placement=restored.placement)
        results[name] = (
            perplexity_eval.perplexity(**run(), documents=documents, context_length=64, stride=32, batch_size=8),
            multiple_choice.score_multiple_choice(**run(), examples=examples, batch_size=8,
                                                  encode=lambda t: list(vocabulary.encode(t))),
            predict.predict(**run(), prompts=prompts, eos_id=vocabulary.eos_id, batch_size=8,
                            decoding_config=predict.DecodingConfig(max_decode_length=12)))
    (ppl, mc, greedy), (ppl1, mc1, greedy1) = results["fsdp"], results["single"]
    assert ppl["tokens"] == ppl1["tokens"] == sum(map(len, documents))
    assert ppl["loss"] == pytest.approx(ppl1["loss"], rel=1e-5)
    assert mc == mc1
    assert greedy == greedy1 and any(greedy)
    # Every one of the 8 devices scored rows: the batches were split, not replicated.
    assert sharded.placement.rows_computed == single.placement.rows_computed > 0


def test_fsdp_t5_greedy_beam_and_seqio_metrics_as_on_one_device(trained_t5, data_dir, tmp_path):
    model_dir, cfg = trained_t5
    sharded = restored_model.restore(str(model_dir), mesh_axes=FSDP_AXES)
    _assert_no_device_holds_a_whole_kernel(sharded.params)
    single = _single_device(sharded)
    vocabulary = sharded.vocabulary()
    inputs = [_encode(vocabulary, a) for a, _ in PAIRS] + [_encode(vocabulary, "red sky")]
    for method in ("greedy", "beam"):
        config = predict.DecodingConfig(method=method, max_decode_length=32, beam_size=3)
        outputs = [predict.predict(model=cfg, params=r.params, prompts=inputs, decoding_config=config,
                                   eos_id=vocabulary.eos_id, batch_size=8, placement=r.placement)
                   for r in (sharded, single)]
        assert outputs[0] == outputs[1], method
        assert [vocabulary.decode(t) for t in outputs[0][:len(PAIRS)]] == [b for _, b in PAIRS], method
    beams = [decoding.beam_search_with_scores(model=cfg, params=r.params, inputs=inputs, max_decode_length=32,
                                              beam_size=3, eos_id=vocabulary.eos_id, placement=r.placement)
             for r in (sharded, single)]
    assert [t for t, _ in beams[0]] == [t for t, _ in beams[1]]
    # Log-probabilities near 0 (a trained model): compared in absolute terms, float32 rounding.
    np.testing.assert_allclose([s for _, s in beams[0]], [s for _, s in beams[1]], rtol=1e-5, atol=1e-5)

    from t5x_lite.data.tasks.text_to_text import text_to_text_task
    name = text_to_text_task(name="fsdp_pairs", splits={"validation": str(_write_pairs(tmp_path / "p.jsonl"))},
                             vocabulary=str(data_dir / "spm.model"), metrics=("accuracy", "log_likelihood"))
    metrics = []
    for restored, log_dir in ((sharded, "fsdp"), (single, "single")):
        evaluation = seqio_metrics.SeqioEvaluation(
            mixture_or_task_name=name, split="validation", log_dir=str(tmp_path / log_dir), num_examples=None,
            batch_size=8, decoding_config=predict.DecodingConfig(max_decode_length=32))
        metrics.append(evaluation.run(restored)[name])
        evaluation.close()
    assert metrics[0]["accuracy"] == metrics[1]["accuracy"] == pytest.approx(100.0)
    assert metrics[0]["log_likelihood"] == pytest.approx(metrics[1]["log_likelihood"], rel=1e-5, abs=1e-5)
