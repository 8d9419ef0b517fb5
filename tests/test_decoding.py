"""Logit filtering and autoregressive generation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite import decoding
from t5x_lite.models import decoder_only

CFG = decoder_only.DecoderConfig(vocab_size=32, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                                 mlp_dim=64, num_layers=2, max_len=16)
PROMPT = [5, 9, 3]
MAX_NEW = 5


def _distinct_logits(seed, shape):
    rng = np.random.default_rng(seed)
    # A random permutation of well-separated values per row: no ties.
    rows = [rng.permutation(shape[-1]) * 0.37 + rng.standard_normal() for _ in range(int(np.prod(shape[:-1])))]
    return np.asarray(rows, np.float32).reshape(shape)


def test_temperature_scales_logits():
    logits = _distinct_logits(0, (2, 10))
    for t in (0.5, 1.0, 2.5):
        out = decoding.filter_logits(jnp.asarray(logits), temperature=t, top_k=0, top_p=1.0)
        np.testing.assert_allclose(np.asarray(out), logits / t, rtol=1e-6)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k_keeps_exactly_k_largest(k):
    logits = _distinct_logits(1, (4, 12))
    out = np.asarray(decoding.filter_logits(jnp.asarray(logits), temperature=1.0, top_k=k, top_p=1.0))
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
    out = np.asarray(decoding.filter_logits(jnp.asarray(logits), temperature=1.0, top_k=0, top_p=p))
    for row in range(logits.shape[0]):
        kept = set(np.flatnonzero(np.isfinite(out[row])))
        assert kept == _numpy_top_p_keep(logits[row].astype(np.float64), p), (row, p)
        assert len(kept) >= 1


def test_top_p_applies_after_temperature():
    logits = _distinct_logits(3, (3, 16))
    t, p = 3.0, 0.5
    out = np.asarray(decoding.filter_logits(jnp.asarray(logits), temperature=t, top_k=0, top_p=p))
    for row in range(logits.shape[0]):
        kept = set(np.flatnonzero(np.isfinite(out[row])))
        assert kept == _numpy_top_p_keep(logits[row].astype(np.float64) / t, p)
    # A hotter temperature flattens the distribution, so at least as many tokens survive.
    cold = np.asarray(decoding.filter_logits(jnp.asarray(logits), temperature=1.0, top_k=0, top_p=p))
    assert np.all(np.isfinite(out).sum(-1) >= np.isfinite(cold).sum(-1))


@pytest.fixture(scope="module")
def model_and_params():
    model = decoder_only.Decoder(CFG)
    params = jax.jit(model.init)(jax.random.PRNGKey(42), jnp.zeros((1, CFG.max_len), jnp.int32))["params"]
    # Sharpen the output layer so greedy choices are not decided by float noise.
    params = dict(params, logits={"kernel": params["logits"]["kernel"] * 50.0})
    return model, params


def _manual_greedy(model, params, prompt, max_new, eos_id):
    """Runs the full model on the exact-length sequence [BOS=0, *prompt, *generated] each step."""
    apply = jax.jit(model.apply)
    seq = [decoding.PAD_ID, *prompt]
    new = []
    for _ in range(max_new):
        if len(seq) >= CFG.max_len:
            break
        logits = np.array(apply({"params": params}, jnp.asarray([seq], jnp.int32)))[0, -1]
        logits[decoding.PAD_ID] = -np.inf  # padding is never generated (decoding.generate's rule)
        token = int(np.argmax(logits))
        if token == eos_id:
            break
        new.append(token)
        seq.append(token)
    return new


@pytest.fixture(scope="module")
def greedy_reference(model_and_params):
    model, params = model_and_params
    return _manual_greedy(model, params, PROMPT, MAX_NEW, eos_id=-1)


def _generate(model, params, *, eos_id, prompt=PROMPT, max_new=MAX_NEW, **kwargs):
    kwargs = {"temperature": 0.0, **kwargs}
    return decoding.generate(model=model, params=params, prompt=prompt, max_new_tokens=max_new,
                             max_len=CFG.max_len, rng=jax.random.PRNGKey(0), eos_id=eos_id, **kwargs)


def test_greedy_generate_matches_manual_loop(model_and_params, greedy_reference):
    model, params = model_and_params
    # An eos_id outside the vocabulary never fires: all MAX_NEW tokens come back.
    out = _generate(model, params, eos_id=CFG.vocab_size + 7)
    assert len(greedy_reference) == MAX_NEW
    assert out == greedy_reference
    assert decoding.PAD_ID not in out
    # Sampling with top_k=1 is greedy whatever the temperature and rng.
    sampled = _generate(model, params, eos_id=CFG.vocab_size + 7, temperature=0.7, top_k=1)
    assert sampled == greedy_reference


def test_generation_stops_at_eos(model_and_params, greedy_reference):
    model, params = model_and_params
    first = greedy_reference[0]
    assert _generate(model, params, eos_id=first) == []
    # Stopping at a later token returns the tokens before its first occurrence, EOS excluded.
    eos = greedy_reference[2]
    expected = greedy_reference[: greedy_reference.index(eos)]
    assert expected, "pick a seed whose greedy tokens differ, so this case tests a non-empty prefix"
    assert _generate(model, params, eos_id=eos) == expected
    assert expected == _manual_greedy(model, params, PROMPT, MAX_NEW, eos_id=eos)


def test_generation_respects_max_len(model_and_params):
    model, params = model_and_params
    # BOS + prompt fill all but 2 slots of the buffer: at most 2 new tokens fit.
    prompt = list(range(2, 2 + CFG.max_len - 3))
    out = _generate(model, params, eos_id=CFG.vocab_size + 7, prompt=prompt, max_new=MAX_NEW)
    assert len(out) == 2
    # A prompt that exactly fills the buffer leaves no room: nothing is generated.
    full = list(range(2, 2 + CFG.max_len - 1))
    assert _generate(model, params, eos_id=CFG.vocab_size + 7, prompt=full) == []


def test_too_long_prompt_raises(model_and_params):
    model, params = model_and_params
    with pytest.raises(ValueError, match="max_len"):
        _generate(model, params, eos_id=1, prompt=[3] * CFG.max_len)
    with pytest.raises(ValueError):
        _generate(model, params, eos_id=1, prompt=[3] * (CFG.max_len + 5))
