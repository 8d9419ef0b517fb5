"""Strided perplexity and multiple-choice scoring, checked against direct forward passes."""

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x_lite.errors import EmptyEvalSetError, EvalDataError
from t5x_lite.evaluation import multiple_choice
from t5x_lite.evaluation import perplexity as perplexity_eval
from t5x_lite.inference import scoring
from t5x_lite.models import decoder_only, losses

CFG = decoder_only.DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                                 mlp_dim=64, num_layers=2, max_len=32)


def _init(cfg, seed=0):
    return jax.jit(cfg.make_module().init)(jax.random.PRNGKey(seed), jnp.zeros((1, 8), jnp.int32))["params"]


@pytest.fixture(scope="module")
def params():
    # A fresh model's logits are nearly uniform; sharpen them so a wrong position or target shows.
    p = _init(CFG)
    return {**p, "logits": {"kernel": p["logits"]["kernel"] * 40.0}}


@pytest.fixture(scope="module")
def forward(params):
    """Float64 log-probabilities of one unpadded sequence: row i is the distribution of token i+1."""
    apply = jax.jit(lambda tokens: CFG.make_module().apply({"params": params}, tokens))

    def log_probs(tokens):
        logits = apply(jnp.asarray([tokens[:-1]], jnp.int32))[0]
        return np.asarray(jax.nn.log_softmax(logits), np.float64)

    return log_probs


def _direct_sum(forward, sequence, num_scored):
    """Summed log-probability of the last `num_scored` tokens of `sequence`, from one forward pass."""
    log_probs = forward(sequence)
    return sum(log_probs[i - 1, sequence[i]] for i in range(len(sequence) - num_scored, len(sequence)))


def _random_requests(seed, n=10):
    rng = np.random.default_rng(seed)
    return [(rng.integers(1, CFG.vocab_size, rng.integers(0, 14)).tolist(),
             rng.integers(1, CFG.vocab_size, rng.integers(1, 7)).tolist()) for _ in range(n)]


# --- strided_windows --------------------------------------------------------------------------

def test_strided_windows_score_every_token_exactly_once():
    for num_tokens in range(0, 41):
        for context_length in range(1, 11):
            for stride in range(1, context_length + 1):
                windows = perplexity_eval.strided_windows(num_tokens, context_length=context_length, stride=stride)
                case = (num_tokens, context_length, stride)
                scored = [t for w in windows for t in range(w.score_from, w.end)]
                assert scored == list(range(num_tokens)), case
                for i, w in enumerate(windows):
                    assert w.end - w.begin <= context_length, case
                    assert w.begin <= w.score_from < w.end, case
                    assert w.begin == i * stride, case
                    if i > 0:  # the HF guarantee: at least context_length - stride tokens of context
                        assert w.score_from - w.begin >= context_length - stride, case


def test_strided_windows_match_hugging_face_example():
    assert perplexity_eval.strided_windows(10, context_length=4, stride=2) == [
        perplexity_eval.Window(begin=0, end=4, score_from=0), perplexity_eval.Window(begin=2, end=6, score_from=4),
        perplexity_eval.Window(begin=4, end=8, score_from=6), perplexity_eval.Window(begin=6, end=10, score_from=8)]


def test_stride_equal_to_context_length_gives_disjoint_windows():
    windows = perplexity_eval.strided_windows(23, context_length=5, stride=5)
    assert [(w.begin, w.end) for w in windows] == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 23)]
    assert all(w.score_from == w.begin for w in windows)


@pytest.mark.parametrize("stride", [0, -1, 9])
def test_strided_windows_reject_a_stride_outside_one_to_context_length(stride):
    with pytest.raises(ValueError, match="stride"):
        perplexity_eval.strided_windows(20, context_length=8, stride=stride)


# --- continuation_logprobs --------------------------------------------------------------------

def test_continuation_logprobs_match_one_forward_pass(params, forward):
    requests = _random_requests(0, n=6) + [([], [7])]  # an empty context is predicted from BOS alone
    results = scoring.continuation_logprobs(model=CFG, params=params, requests=requests, batch_size=3)
    for (context, continuation), (logprob, count, _) in zip(requests, results):
        expected = _direct_sum(forward, [0, *context, *continuation], len(continuation))
        assert count == len(continuation)
        assert logprob == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert logprob < -1e-3  # the sharpened model is not certain of random tokens


def test_continuation_logprobs_do_not_depend_on_batch_size_or_order(params):
    requests = _random_requests(1)
    reference = scoring.continuation_logprobs(model=CFG, params=params, requests=requests, batch_size=1)
    permutation = np.random.default_rng(2).permutation(len(requests))
    for batch_size in (1, 3, 8):
        shuffled = scoring.continuation_logprobs(model=CFG, params=params, batch_size=batch_size,
                                                    requests=[requests[i] for i in permutation])
        for result, i in zip(shuffled, permutation):
            assert result[0] == pytest.approx(reference[i][0], rel=1e-5, abs=1e-5)
            assert result[1:] == reference[i][1:]


def test_a_long_context_is_truncated_from_the_left(params, forward):
    rng = np.random.default_rng(3)
    context, continuation = rng.integers(1, 64, 45).tolist(), rng.integers(1, 64, 4).tolist()
    [(logprob, count, _)] = scoring.continuation_logprobs(model=CFG, params=params, batch_size=2,
                                                             requests=[(context, continuation)])
    # The model sees the last max_len inputs: BOS and the oldest context tokens are dropped.
    expected = _direct_sum(forward, [*context, *continuation][-(CFG.max_len + 1):], len(continuation))
    assert count == 4
    assert logprob == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_greedy_flag_is_true_only_for_the_argmax_continuation(params, forward):
    context, greedy = [5, 9, 3], []
    for _ in range(4):
        greedy.append(int(np.argmax(forward([0, *context, *greedy, 0])[-1])))
    wrong = [*greedy[:-1], (greedy[-1] + 1) % CFG.vocab_size]
    results = scoring.continuation_logprobs(model=CFG, params=params, batch_size=2,
                                               requests=[(context, greedy), (context, wrong)])
    assert [is_greedy for _, _, is_greedy in results] == [True, False]


@pytest.mark.parametrize("requests, batch_size, message", [
    ([([1, 2], [])], 1, "empty continuation"),
    ([([1, 2], [64])], 1, "vocab_size"),
    ([([1, 2], [3] * 33)], 1, "max_len"),
    ([([1, 2], [3])], 0, "batch_size"),
])
def test_continuation_logprobs_reject_what_the_model_cannot_score(params, requests, batch_size, message):
    with pytest.raises(ValueError, match=message):
        scoring.continuation_logprobs(model=CFG, params=params, requests=requests, batch_size=batch_size)


# --- perplexity -------------------------------------------------------------------------------

def _documents():
    rng = np.random.default_rng(4)
    return [rng.integers(1, 64, n).tolist() for n in (0, 1, 5, 17, 40, 23)]


def test_perplexity_does_not_depend_on_batch_size(params):
    runs = [perplexity_eval.perplexity(model=CFG, params=params, documents=_documents(), context_length=16, stride=6,
                                  batch_size=b) for b in (1, 4, 7)]
    for run in runs[1:]:
        assert run["loss"] == pytest.approx(runs[0]["loss"], rel=1e-6)
        assert (run["tokens"], run["windows"]) == (runs[0]["tokens"], runs[0]["windows"])


def test_perplexity_with_disjoint_windows_equals_a_chunked_loop(params, forward):
    context_length, nll, tokens, chunks = 16, 0.0, 0, 0
    for document in _documents():
        for start in range(0, len(document), context_length):
            chunk = document[start:start + context_length]
            nll -= _direct_sum(forward, [0, *chunk], len(chunk))
            tokens, chunks = tokens + len(chunk), chunks + 1
    result = perplexity_eval.perplexity(model=CFG, params=params, documents=_documents(),
                                   context_length=context_length, stride=context_length, batch_size=4)
    assert (result["tokens"], result["windows"]) == (tokens, chunks) == (86, 9)
    assert result["loss"] == pytest.approx(nll / tokens, rel=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)


def test_perplexity_with_overlapping_windows_scores_the_same_tokens_with_more_context(params, forward):
    disjoint = perplexity_eval.perplexity(model=CFG, params=params, documents=_documents(), context_length=16,
                                     stride=16, batch_size=4)
    strided = perplexity_eval.perplexity(model=CFG, params=params, documents=_documents(), context_length=16,
                                    stride=4, batch_size=4)
    assert strided["tokens"] == disjoint["tokens"]
    assert strided["windows"] > disjoint["windows"]
    assert abs(strided["loss"] - disjoint["loss"]) > 1e-3
    # Each later window: its context tokens (no BOS) followed by the tokens it scores.
    nll = 0.0
    for document in _documents():
        for w in perplexity_eval.strided_windows(len(document), context_length=16, stride=4):
            sequence = document[w.begin:w.end] if w.begin else [0, *document[:w.end]]
            nll -= _direct_sum(forward, sequence, w.end - w.score_from)
    assert strided["loss"] == pytest.approx(nll / strided["tokens"], rel=1e-5)


@pytest.mark.parametrize("documents", [[], [[], []]])
def test_perplexity_of_nothing_is_an_error(params, documents):
    with pytest.raises(EmptyEvalSetError, match="(?i)the eval set is empty"):
        perplexity_eval.perplexity(model=CFG, params=params, documents=documents, context_length=16, stride=8,
                              batch_size=2)


def test_perplexity_rejects_a_context_longer_than_the_model(params):
    with pytest.raises(ValueError, match="max_len"):
        perplexity_eval.perplexity(model=CFG, params=params, documents=[[1, 2]], context_length=33, stride=8,
                              batch_size=2)


# --- HellaSwag files --------------------------------------------------------------------------

def _write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def _hellaswag_record(activity_label, ctx_a, ctx_b, endings, label, ind=0):
    return {"ind": ind, "activity_label": activity_label, "ctx_a": ctx_a, "ctx_b": ctx_b,
            "ctx": f"{ctx_a} {ctx_b}", "split": "val", "split_type": "indomain", "label": label,
            "endings": endings, "source_id": f"activitynet~v_{ind}"}


def test_preprocess_removes_wikihow_tags_as_lm_eval_does():
    assert multiple_choice.preprocess_hellaswag("  Mix the flour. [step] Knead it.  ") == "Mix the flour. Knead it."
    # The text is stripped before the tags go, so a leading tag leaves a space (as in lm-eval).
    assert multiple_choice.preprocess_hellaswag("[header] How to bake bread [title] Mix the flour.") == \
        " How to bake bread. Mix the flour."


def test_read_hellaswag_builds_contexts_like_lm_eval(tmp_path):
    path = _write_jsonl(tmp_path / "val.jsonl", [
        _hellaswag_record("Roof shingle removal", "A man is sitting on a roof.", "he",
                          ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                           "is holding a rubik's cube.", "starts pulling up roofing on a roof."], 3),
        "",
        _hellaswag_record("Baking bread", "[header] How to bake bread [title] Mix the flour.", "knead the dough",
                          ["[title] for ten minutes.", "until it is smooth [step] Then rest it.", "a", "b"], "1"),
        {"context": "Plain context", "endings": ["one", "two", "three"], "label": 2},
    ])
    roof, bread, plain = multiple_choice.read_hellaswag(path)
    assert roof == multiple_choice.MultipleChoiceExample(
        context="Roof shingle removal: A man is sitting on a roof. He",
        endings=("is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."), label=3)
    assert bread.context == "Baking bread: How to bake bread. Mix the flour. Knead the dough"
    assert bread.endings == (" for ten minutes.", "until it is smooth Then rest it.", "a", "b")
    assert bread.label == 1
    assert plain == multiple_choice.MultipleChoiceExample(context="Plain context", endings=("one", "two", "three"),
                                                     label=2)


@pytest.mark.parametrize("bad_line, message", [
    ({"context": "c", "label": 0}, "missing field 'endings'"),
    ({"activity_label": "a", "ctx_a": "b", "endings": ["x", "y"], "label": 0}, "missing field 'ctx_b'"),
    ({"context": "c", "endings": ["x", "y", "z", "w"], "label": 4}, "label"),
    ({"context": "c", "endings": ["x", "y"], "label": "first"}, "label"),
    ({"context": "c", "endings": ["x"], "label": 0}, "at least 2 endings"),
    ({"context": "c", "endings": "x y", "label": 0}, "'endings' must be a list"),
    ({"context": "c", "endings": ["x", ""], "label": 0}, "ending 1"),
    ('{"context": "c", "endings": ["x", "y"]', "Expecting"),
    ('["c", ["x", "y"], 0]', "JSON object"),
])
def test_read_hellaswag_names_the_file_and_line_of_a_malformed_line(tmp_path, bad_line, message):
    good = {"context": "c", "endings": ["x", "y"], "label": 1}
    path = _write_jsonl(tmp_path / "bad.jsonl", [good, "", bad_line, good])
    with pytest.raises(EvalDataError, match=message) as error:
        multiple_choice.read_hellaswag(path)
    assert f"{path}:3:" in str(error.value)


def test_read_hellaswag_of_an_empty_or_missing_file_is_an_error(tmp_path):
    path = _write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(EmptyEvalSetError, match=re.escape(f"empty: {path} holds no examples")):
        multiple_choice.read_hellaswag(path)
    with pytest.raises(EvalDataError, match="does not exist"):
        multiple_choice.read_hellaswag(str(tmp_path / "missing.jsonl"))


# --- Multiple choice --------------------------------------------------------------------------

ENDINGS = ["slides the tray into the hot oven.", "pulls the oars back hard.", "dips the brush in red paint.",
           "tosses three balls up high."]
CONTEXTS = [("Baking cookies", "A woman mixes dough in a bowl.", "she"),
            ("Rowing", "A man sits in a small boat.", "he"),
            ("Painting", "[header] How to paint [title] A girl stands at an easel.", "she"),
            ("Juggling", "A clown walks into the ring.", "he")]
MC_CFG = decoder_only.DecoderConfig(vocab_size=64, emb_dim=64, num_heads=4, num_kv_heads=2, head_dim=16,
                                    mlp_dim=128, num_layers=2, max_len=32, scan_layers=False)


def _hellaswag_file(path, label_shift):
    """Example k shows every ending in a rotated order; its right ending, ENDINGS[k], is moved by label_shift."""
    records = []
    for k, (activity, ctx_a, ctx_b) in enumerate(CONTEXTS):
        order = [(j + 2 * k) % 4 for j in range(4)]
        label = (order.index(k) + label_shift) % 4
        records.append(_hellaswag_record(activity, ctx_a, ctx_b, [ENDINGS[i] for i in order], label, ind=k))
    return _write_jsonl(path, records)


def _word_encoder(examples):
    """A word-level vocabulary of the examples' texts; id 0 stays BOS."""
    words = sorted({w for e in examples for text in (e.context, *e.endings) for w in text.split()})
    ids = {w: i + 1 for i, w in enumerate(words)}
    assert len(ids) < MC_CFG.vocab_size
    return lambda text: [ids[w] for w in text.split()]


def _train_on(sequences, steps=150):
    """A tiny decoder fitted to `sequences` (each starting with BOS) with plain Adam."""
    length = max(map(len, sequences))
    tokens = np.zeros((len(sequences), length), np.int32)
    weights = np.zeros((len(sequences), length - 1), np.float32)
    for row, sequence in enumerate(sequences):
        tokens[row, :len(sequence)] = sequence
        weights[row, :len(sequence) - 1] = 1.0
    module, optimizer = MC_CFG.make_module(), optax.adam(1e-2)

    def loss_fn(p):
        logits = module.apply({"params": p}, tokens[:, :-1])
        sums = losses.weighted_loss_sums(logits, tokens[:, 1:], weights)
        return sums["loss_sum"] / sums["weight_sum"]

    @jax.jit
    def step(p, state):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(p, updates), state, loss

    p = _init(MC_CFG, seed=1)
    state = optimizer.init(p)
    for _ in range(steps):
        p, state, _ = step(p, state)
    return p


def test_multiple_choice_picks_the_ending_the_model_learned(tmp_path):
    right = multiple_choice.read_hellaswag(_hellaswag_file(tmp_path / "right.jsonl", label_shift=0))
    wrong = multiple_choice.read_hellaswag(_hellaswag_file(tmp_path / "wrong.jsonl", label_shift=1))
    encode = _word_encoder(right)
    assert right[2].context == "Painting: How to paint. A girl stands at an easel. She"
    params = _train_on([[0, *encode(e.context), *encode(" " + e.endings[e.label])] for e in right])
    assert [e.endings[e.label] for e in right] == ENDINGS
    for examples, expected in ((right, 1.0), (wrong, 0.0)):
        scores = multiple_choice.score_multiple_choice(model=MC_CFG, params=params, examples=examples, encode=encode,
                                                  batch_size=5)
        assert scores == {"acc": expected, "acc_norm": expected, "examples": 4}


def test_multiple_choice_of_no_examples_is_an_error(params):
    with pytest.raises(EmptyEvalSetError, match="(?i)the eval set is empty"):
        multiple_choice.score_multiple_choice(model=CFG, params=params, examples=[], encode=lambda t: [1],
                                         batch_size=2)
