"""Logit filtering, KV-cached generation (decoder-only and T5) against full recomputation, and beam search."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite.errors import UserError
from t5x_lite.inference import decoding
from t5x_lite.models import decoder_only, encoder_decoder, generation
from t5x_lite.models.generation import PromptTooLongError
from tests.param_trees import unrolled_params

LLAMA = decoder_only.DecoderConfig(vocab_size=32, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                                   mlp_dim=64, num_layers=2, max_len=32)
GPT2 = dataclasses.replace(LLAMA, position_embedding="learned", norm="layernorm", mlp_activations=("gelu",),
                           use_bias=True, tie_embeddings=True)
DECODERS = {"llama_scan": LLAMA, "llama_unrolled": dataclasses.replace(LLAMA, scan_layers=False),
            "gpt2_scan": GPT2, "gpt2_unrolled": dataclasses.replace(GPT2, scan_layers=False)}
T5 = encoder_decoder.T5Config(vocab_size=32, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                              num_encoder_layers=2, num_decoder_layers=2)
PROMPTS = [[5, 9, 3], [7, 2, 11, 4, 6, 8], []]  # different lengths: left padding in one batch
INPUTS = [[5, 9, 3, 7], [7, 2, 11, 4, 6, 8, 10], [4], [12, 13, 14, 15, 16]]
MAX_NEW = 8
NO_EOS = 1000  # outside the vocabulary: never generated


# ---------------------------------------------------------------------------- filter_logits


def _distinct_logits(seed, shape):
    rng = np.random.default_rng(seed)
    # A random permutation of well-separated values per row: no ties.
    rows = [rng.permutation(shape[-1]) * 0.37 + rng.standard_normal() for _ in range(int(np.prod(shape[:-1])))]
    return np.asarray(rows, np.float32).reshape(shape)


def test_temperature_scales_logits():
    logits = _distinct_logits(0, (2, 10))
    for t in (0.5, 1.0, 2.5):
        out = generation.filter_logits(jnp.asarray(logits), temperature=t, top_k=0, top_p=1.0)
        np.testing.assert_allclose(np.asarray(out), logits / t, rtol=1e-6)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k_keeps_exactly_k_largest(k):
    logits = _distinct_logits(1, (4, 12))
    out = np.asarray(generation.filter_logits(jnp.asarray(logits), temperature=1.0, top_k=k, top_p=1.0))
    finite = np.isfinite(out)
    assert np.all(finite.sum(-1) == k)
    for row in range(logits.shape[0]):
        expected = set(np.argsort(-logits[row])[:k])
        assert set(np.flatnonzero(finite[row])) == expected
        np.testing.assert_allclose(out[row, finite[row]], logits[row, finite[row]], rtol=1e-6)
    assert np.all(out[~finite] == -np.inf)


def _numpy_top_p_keep(logits, p):
    """Smallest set of most-likely tokens whose probability mass reaches p."""
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    cumulative = np.cumsum(probs[order])
    n_keep = int(np.searchsorted(cumulative, p) + 1)  # first index where the mass reaches p
    return set(order[: min(n_keep, len(order))])


@pytest.mark.parametrize("p", [0.05, 0.3, 0.6, 0.9, 0.99])
def test_top_p_keeps_smallest_prefix_reaching_p(p):
    logits = _distinct_logits(2, (5, 16))
    out = np.asarray(generation.filter_logits(jnp.asarray(logits), temperature=1.0, top_k=0, top_p=p))
    for row in range(logits.shape[0]):
        kept = set(np.flatnonzero(np.isfinite(out[row])))
        assert kept == _numpy_top_p_keep(logits[row].astype(np.float64), p), (row, p)
        assert len(kept) >= 1


def test_top_p_applies_after_temperature():
    logits = _distinct_logits(3, (3, 16))
    t, p = 3.0, 0.5
    out = np.asarray(generation.filter_logits(jnp.asarray(logits), temperature=t, top_k=0, top_p=p))
    for row in range(logits.shape[0]):
        kept = set(np.flatnonzero(np.isfinite(out[row])))
        assert kept == _numpy_top_p_keep(logits[row].astype(np.float64) / t, p)
    # A hotter temperature flattens the distribution, so at least as many tokens survive.
    cold = np.asarray(generation.filter_logits(jnp.asarray(logits), temperature=1.0, top_k=0, top_p=p))
    assert np.all(np.isfinite(out).sum(-1) >= np.isfinite(cold).sum(-1))


# ---------------------------------------------------------------------------- decoder-only


def _sharpen(params, factor, stack=None):
    """Scales the final norm (so the logits) by `factor`: greedy choices are then not decided by float noise."""
    def scale(path, x):
        names = [getattr(k, "key", None) for k in path]
        return x * factor if "final_norm" in names and (stack is None or stack in names) else x

    return jax.tree_util.tree_map_with_path(scale, params)


@functools.lru_cache(maxsize=None)
def _init(cfg):
    """Random params of the scanned model (an unrolled one gets its scanned twin's: the same function)."""
    scanned = dataclasses.replace(cfg, scan_layers=True)
    tokens = jnp.ones((1, 8), jnp.int32)
    args = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
    params = jax.jit(scanned.make_module().init)(jax.random.PRNGKey(0), *args)["params"]
    return params if cfg.scan_layers else unrolled_params(params)


@functools.lru_cache(maxsize=None)
def _decoder_params(cfg, sharpen=30.0):
    return _sharpen(_init(cfg), sharpen)


def _generate(cfg, prompts, *, max_new=MAX_NEW, eos_id=NO_EOS, params=None, **kwargs):
    params = _decoder_params(cfg) if params is None else params
    return decoding.generate_batch(model=cfg, params=params, prompts=prompts, max_new_tokens=max_new,
                                   rng=jax.random.PRNGKey(0), eos_id=eos_id, **kwargs)


@functools.lru_cache(maxsize=None)
def _greedy_reference(name):
    """Uncached greedy tokens; an unrolled model's are its scanned twin's (the same params and function)."""
    return _generate(DECODERS[name.replace("unrolled", "scan")], PROMPTS, use_cache=False)


@functools.lru_cache(maxsize=None)
def _jitted_apply(cfg):
    return jax.jit(cfg.make_module().apply)


def _full_forward_logits(cfg, params, sequence):
    """The plain model's logits after `sequence` (right-padded to max_len: causal, so one compile)."""
    buffer = np.zeros((1, cfg.max_len), np.int32)
    buffer[0, :len(sequence)] = sequence
    return np.array(_jitted_apply(cfg)({"params": params}, buffer))[0, len(sequence) - 1]


def _manual_greedy(cfg, params, prompt, max_new):
    """Runs the plain model on [BOS=0, *prompt, *generated] each step."""
    seq, new = [generation.PAD_ID, *prompt], []
    for _ in range(max_new):
        logits = _full_forward_logits(cfg, params, seq)
        logits[generation.PAD_ID] = -np.inf
        new.append(int(np.argmax(logits)))
        seq.append(new[-1])
    return new


@pytest.mark.parametrize("name", list(DECODERS))
def test_cached_greedy_matches_uncached(name):
    uncached = _greedy_reference(name)
    assert all(len(row) == MAX_NEW for row in uncached)
    assert len({t for row in uncached for t in row}) > 4, "degenerate greedy output: pick another seed"
    assert _generate(DECODERS[name], PROMPTS) == uncached


@pytest.mark.parametrize("name", ["llama_scan", "gpt2_unrolled"])
def test_batched_greedy_matches_each_prompt_alone(name):
    # Padding does not leak: each prompt decoded alone (no padding but BOS) gives the same tokens.
    assert [_generate(DECODERS[name], [p])[0] for p in PROMPTS] == _greedy_reference(name)


@pytest.mark.parametrize("name", ["llama_scan", "gpt2_unrolled"])
def test_cached_prefill_logits_match_a_plain_forward_pass(name):
    cfg, params = DECODERS[name], _decoder_params(DECODERS[name])
    module = cfg.make_module()
    slots, cache_length = 8, 12
    pad = np.asarray([slots - 1 - len(p) for p in PROMPTS])
    tokens = np.zeros((len(PROMPTS), cache_length), np.int32)
    for row, p in enumerate(PROMPTS):
        tokens[row, pad[row] + 1:slots] = p
    positions = np.maximum(np.arange(cache_length)[None] - pad[:, None], 0)
    valid = np.arange(cache_length)[None] >= pad[:, None]
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), tokens, decoder_positions=positions,
                                                decode=True, cache_mask=valid))["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    prefill = jax.jit(lambda variables, *args, **kwargs: module.apply(variables, *args, decode=True,
                                                                      mutable=["cache"], **kwargs))
    logits, _ = prefill({"params": params, "cache": cache}, tokens[:, :slots], decoder_positions=positions[:, :slots],
                        cache_mask=valid)
    for row, p in enumerate(PROMPTS):
        full = _full_forward_logits(cfg, params, [0, *p])
        np.testing.assert_allclose(np.asarray(logits[row, -1]), full, rtol=1e-5, atol=1e-5)
        top2 = np.sort(full[1:])[-2:]
        assert top2[1] - top2[0] > 1e-3, "the greedy choice must not be decided by float noise"


def test_generate_matches_a_manual_loop_of_full_forward_passes():
    params = _decoder_params(LLAMA)
    expected = _manual_greedy(LLAMA, params, PROMPTS[0], MAX_NEW)
    assert _greedy_reference("llama_scan")[0] == expected
    # One prompt alone through the front door inference.sample.sample_texts uses.
    out = decoding.generate_batch(model=LLAMA, params=params, prompts=[PROMPTS[0]], max_new_tokens=MAX_NEW,
                                  rng=jax.random.PRNGKey(5), temperature=0.0)
    assert out == [expected]


def test_sampling_gives_the_same_tokens_cached_or_not():
    params = _decoder_params(LLAMA, sharpen=3.0)
    kwargs = dict(temperature=0.8, top_k=10, top_p=0.95, params=params)
    sampled = _generate(LLAMA, PROMPTS, **kwargs)
    assert sampled == _generate(LLAMA, PROMPTS, use_cache=False, **kwargs)
    assert all(generation.PAD_ID not in row for row in sampled)
    # It is sampling: another rng or greedy decoding gives other tokens.
    other = decoding.generate_batch(model=LLAMA, params=params, prompts=PROMPTS, max_new_tokens=MAX_NEW,
                                    rng=jax.random.PRNGKey(1), eos_id=NO_EOS, temperature=0.8, top_k=10, top_p=0.95)
    assert other != sampled
    assert _generate(LLAMA, PROMPTS, params=params) != sampled


def test_eos_stops_its_row_and_the_others_continue():
    reference = _greedy_reference("llama_scan")
    eos = reference[0][2]
    assert eos not in reference[0][:2]
    out = _generate(LLAMA, PROMPTS, eos_id=eos)
    expected = [row[: row.index(eos)] if eos in row else row for row in reference]
    assert out == expected
    assert len(out[0]) == 2 and max(len(row) for row in out) > 2


def test_max_new_tokens_and_max_len_bound_each_row():
    # GPT-2's learned positions: the padded buffer outgrows max_len while every position stays inside it.
    reference = _greedy_reference("gpt2_scan")
    long = list(range(2, 2 + GPT2.max_len - 3))  # BOS + prompt leave 2 slots
    out = _generate(GPT2, [long, PROMPTS[0]], max_new=5)
    assert [len(row) for row in out] == [2, 5]
    assert out[1] == reference[0][:5]
    assert out[0] == _manual_greedy(GPT2, _decoder_params(GPT2), long, 2)
    full = list(range(2, 2 + GPT2.max_len - 1))  # BOS + prompt fill max_len: nothing fits
    assert _generate(GPT2, [full, PROMPTS[0]], max_new=0) == [[], []]
    assert _generate(GPT2, [full]) == [[]]


def test_a_huge_max_new_tokens_is_capped_at_what_the_context_leaves():
    """No row generates more than the context leaves after its prompt, so nothing is sized by more."""
    assert decoding.new_token_limit(LLAMA, [[3] * 5, [4] * 9], 10**9) == LLAMA.max_len - 1 - 5
    assert decoding.new_token_limit(LLAMA, [[3] * 5], 4) == 4
    assert decoding.new_token_limit(LLAMA, [[3] * (LLAMA.max_len - 1)], 4) == 0
    assert decoding.new_token_limit(T5, [[3]], 10**9) == 10**9  # an encoder-decoder's outputs: no such limit
    assert _generate(LLAMA, PROMPTS, max_new=10**9) == _generate(LLAMA, PROMPTS, max_new=LLAMA.max_len)


@pytest.mark.parametrize("settings, message", [
    (dict(temperature=-1.0), "temperature=-1.0 must be >= 0"),
    (dict(temperature=float("nan")), "temperature=nan must be >= 0"),
    (dict(top_k=-1), "top_k=-1 must be >= 0"),
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
])
def test_meaningless_sampling_settings_are_refused(settings, message):
    with pytest.raises(UserError, match=message):
        _generate(LLAMA, PROMPTS, **{"temperature": 0.8, **settings})


def test_too_long_prompt_raises_the_users_error_naming_the_prompt():
    with pytest.raises(PromptTooLongError, match=r"prompt 1 has \d+ tokens.*max_len=") as raised:
        _generate(LLAMA, [PROMPTS[0], [3] * LLAMA.max_len])
    assert isinstance(raised.value, UserError)
    # The one rule: BOS + prompt must fit max_len; the prompt may then leave no room for new tokens.
    longest = LLAMA.max_prompt_tokens(max_new_tokens=0)
    assert longest == LLAMA.max_len - 1
    assert _generate(LLAMA, [[3] * longest]) == [[]]
    with pytest.raises(PromptTooLongError):
        _generate(LLAMA, [[3] * (longest + 1)])
    # An encoder-decoder's inputs have no such limit.
    assert T5.max_prompt_tokens(max_new_tokens=4) is None


# ---------------------------------------------------------------------------- encoder-decoder


@functools.lru_cache(maxsize=None)
def _t5_params(cfg=T5):
    return _sharpen(_init(cfg), 20.0, stack="decoder")


def _t5_greedy(cfg=T5, *, eos_id=NO_EOS, **kwargs):
    return decoding.generate_seq2seq(model=cfg, params=_t5_params(cfg), inputs=INPUTS, max_decode_length=MAX_NEW,
                                     rng=jax.random.PRNGKey(0), eos_id=eos_id, **kwargs)


@functools.lru_cache(maxsize=None)
def _t5_eos():
    """An EOS that greedy decoding emits early for some inputs: finished and unfinished outputs mix."""
    return _t5_greedy(use_cache=False)[0][2]


@jax.jit
def _t5_logprob(params, inputs, targets):
    """Per row: sum of log p(target) from one plain forward pass, PAD excluded as in decoding."""
    decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]  # BOS = 0
    logits = T5.make_module().apply({"params": params}, inputs, decoder_inputs)
    logprobs = jax.nn.log_softmax(logits.at[..., generation.PAD_ID].set(-jnp.inf))
    picked = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(targets > 0, picked, 0.0), axis=-1)


def _logprobs(outputs, eos_id):
    """log p of each output, with its EOS when it ended before MAX_NEW tokens."""
    targets = np.zeros((len(outputs), MAX_NEW + 1), np.int32)
    for row, tokens in enumerate(outputs):
        full = [*tokens, eos_id] if len(tokens) < MAX_NEW else tokens
        targets[row, :len(full)] = full
    inputs = np.zeros((len(INPUTS), 8), np.int32)
    for row, x in enumerate(INPUTS):
        inputs[row, :len(x)] = x
    return np.asarray(_t5_logprob(_t5_params(), inputs, targets))


@pytest.mark.parametrize("scan", [True, False])
def test_t5_cached_greedy_matches_uncached(scan):
    uncached = _t5_greedy(use_cache=False)  # an unrolled model has the same params and function
    assert all(len(row) == MAX_NEW for row in uncached)
    assert len({t for row in uncached for t in row}) > 4, "degenerate greedy output: pick another seed"
    assert _t5_greedy(dataclasses.replace(T5, scan_layers=scan)) == uncached


def test_beam_search_of_one_beam_is_greedy():
    eos = _t5_eos()
    greedy = _t5_greedy(eos_id=eos)
    assert any(len(row) < MAX_NEW for row in greedy) and any(len(row) == MAX_NEW for row in greedy)
    assert decoding.beam_search(model=T5, params=_t5_params(), inputs=INPUTS, max_decode_length=MAX_NEW,
                                beam_size=1, alpha=0.0, eos_id=eos) == greedy


def test_beam_search_finds_likelier_outputs_than_greedy():
    eos = _t5_eos()
    greedy = _t5_greedy(eos_id=eos)
    results = decoding.beam_search_with_scores(model=T5, params=_t5_params(), inputs=INPUTS,
                                               max_decode_length=MAX_NEW, beam_size=4, alpha=0.0, eos_id=eos)
    beams, scores = [tokens for tokens, _ in results], [score for _, score in results]
    beam_logprobs, greedy_logprobs = _logprobs(beams, eos), _logprobs(greedy, eos)
    np.testing.assert_allclose(scores, beam_logprobs, rtol=1e-5, atol=1e-5)  # alpha = 0: the score is log p
    assert np.all(beam_logprobs >= greedy_logprobs - 1e-5)
    assert np.any(beam_logprobs > greedy_logprobs + 0.1), "beam search should beat greedy on some input"


def test_brevity_penalty():
    lengths = np.arange(1, 20)
    np.testing.assert_allclose(generation.brevity_penalty(0.0, lengths), 1.0)
    np.testing.assert_allclose(generation.brevity_penalty(0.6, 1), 1.0)
    np.testing.assert_allclose(generation.brevity_penalty(0.6, 7), 2.0**0.6, rtol=1e-6)
    for alpha in (0.3, 0.6, 2.0):
        assert np.all(np.diff(np.asarray(generation.brevity_penalty(alpha, lengths))) > 0)


def test_length_penalty_is_applied_and_changes_the_choice():
    eos, alpha = _t5_eos(), 2.0

    def search(a):
        return decoding.beam_search_with_scores(model=T5, params=_t5_params(), inputs=INPUTS,
                                                max_decode_length=MAX_NEW, beam_size=4, alpha=a, eos_id=eos)

    def penalized_logprobs(outputs):
        # log p / ((5 + length) / 6) ** alpha, EOS counted in the length; unfinished outputs count MAX_NEW.
        lengths = [len(t) + 1 if len(t) < MAX_NEW else MAX_NEW for t in outputs]
        return _logprobs(outputs, eos) / np.asarray(generation.brevity_penalty(alpha, np.asarray(lengths)))

    plain, penalized = search(0.0), search(alpha)
    plain_tokens, tokens = [t for t, _ in plain], [t for t, _ in penalized]
    np.testing.assert_allclose([s for _, s in penalized], penalized_logprobs(tokens), rtol=1e-5)
    # The penalty favours longer outputs: it picks some, each at least as good as the plain choice by its measure.
    assert tokens != plain_tokens
    assert all(len(t) >= len(p) for t, p in zip(tokens, plain_tokens))
    assert np.all(penalized_logprobs(tokens) >= penalized_logprobs(plain_tokens) - 1e-5)
