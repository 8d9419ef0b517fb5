"""The T5 encoder-decoder: shapes, parameter count, scan/remat equivalence, packing, masks, dropout."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite.models import encoder_decoder, stack

TINY = encoder_decoder.T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                                num_encoder_layers=2, num_decoder_layers=2)
# One batch shape for most tests, so that they share compiled functions.
BATCH, INPUTS_LEN, TARGETS_LEN = 2, 12, 10
# LLVM's optimisation level does not change what a program computes; level 0 roughly halves
# the compile time of these graphs on CPU.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _cfg(**overrides):
    return dataclasses.replace(TINY, **overrides)


@functools.lru_cache(maxsize=None)
def _jitted_init(cfg):
    model = encoder_decoder.EncoderDecoder(cfg)
    return jax.jit(lambda rng: model.init(rng, jnp.ones((1, INPUTS_LEN), jnp.int32),
                                          jnp.ones((1, TARGETS_LEN), jnp.int32))["params"],
                   compiler_options=FAST_COMPILE)


def _init(cfg=TINY, seed=0):
    return _jitted_init(cfg)(jax.random.PRNGKey(seed))


@functools.lru_cache(maxsize=None)
def _jitted_apply(cfg):
    model = encoder_decoder.EncoderDecoder(cfg)
    return jax.jit(lambda params, **kw: model.apply({"params": params}, **kw), compiler_options=FAST_COMPILE)


def _apply(cfg, params, inputs, decoder_inputs, **kw):
    return np.asarray(_jitted_apply(cfg)(params, encoder_input_tokens=inputs, decoder_input_tokens=decoder_inputs,
                                         **kw))


def _tokens(seed, shape, vocab=TINY.vocab_size):
    """Random non-padding ids (1 .. vocab-1)."""
    return np.random.default_rng(seed).integers(1, vocab, size=shape).astype(np.int32)


def _shift_right(targets):
    return np.concatenate([np.zeros_like(targets[..., :1]), targets[..., :-1]], axis=-1)


def _batch(seed):
    inputs = _tokens(seed, (BATCH, INPUTS_LEN))
    targets = _tokens(seed + 1000, (BATCH, TARGETS_LEN))
    return {"encoder_input_tokens": inputs, "decoder_input_tokens": _shift_right(targets),
            "decoder_target_tokens": targets}


def _token_losses(logits, targets):
    """Cross entropy of each target token, in float64 numpy."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(-1))
    return log_z - np.take_along_axis(shifted, targets[..., None], -1)[..., 0]


@functools.lru_cache(maxsize=None)
def _jitted_loss_and_grads(cfg):
    model = encoder_decoder.EncoderDecoder(cfg)

    def loss(params, batch):
        logits = model.apply({"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
        log_probs = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1)
        return jnp.mean(nll), logits

    return jax.jit(jax.value_and_grad(loss, has_aux=True), compiler_options=FAST_COMPILE)


def _loss_and_grads(cfg, params, batch):
    (loss, logits), grads = _jitted_loss_and_grads(cfg)(params, batch)
    return float(loss), np.asarray(logits), grads


def scanned_to_unrolled(params, cfg):
    """Slices the scanned [layers, ...] leaves of both stacks into layers_unrolled/layers_{i}."""
    out = dict(params)
    for name, num_layers in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
        stack_params = {k: v for k, v in params[name].items() if k != "layers"}
        stack_params["layers_unrolled"] = {
            f"layers_{i}": jax.tree.map(lambda x, i=i: x[i], params[name]["layers"]) for i in range(num_layers)
        }
        out[name] = stack_params
    return out


def _assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol), a, b)


def _param_shapes(cfg):
    return jax.eval_shape(lambda: encoder_decoder.EncoderDecoder(cfg).init(
        jax.random.PRNGKey(0), jnp.ones((1, 6), jnp.int32), jnp.ones((1, 5), jnp.int32))["params"])


# --- shapes and sizes ---------------------------------------------------------------------------

def test_logits_shape_float32_and_initial_loss():
    params = _init(TINY)
    batch = _batch(0)
    logits = _apply(TINY, params, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
    assert logits.shape == (BATCH, TARGETS_LEN, TINY.vocab_size)
    assert logits.dtype == np.float32
    assert np.all(np.isfinite(logits))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    # The small output init puts the initial loss close to ln(vocab).
    loss = _token_losses(logits, batch["decoder_target_tokens"]).mean()
    assert abs(loss - math.log(TINY.vocab_size)) < 0.5


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("scan", [True, False])
def test_num_params_matches_tree(tie, scan):
    for cfg in (_cfg(tie_embeddings=tie, scan_layers=scan),
                _cfg(tie_embeddings=tie, scan_layers=scan, num_encoder_layers=3, num_decoder_layers=1,
                     mlp_activations=("relu",), num_heads=2, relative_attention_num_buckets=16)):
        shapes = _param_shapes(cfg)
        assert cfg.num_params() == sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
        # Tied logits reuse the shared token table; untied ones have their own projection.
        assert ("logits" in shapes["decoder"]) == (not tie)
        assert "token_embed" in shapes and "token_embed" not in shapes["encoder"]


def test_tied_logits_are_scaled_embedding_scores():
    cfg = _cfg(tie_embeddings=True)
    params = _init(cfg, seed=1)
    batch = _batch(1)
    logits = _apply(cfg, params, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
    assert np.all(np.isfinite(logits))
    # Unit-RMS decoder outputs against N(0, 1) embedding rows, divided by sqrt(emb_dim): logits of
    # about unit scale (without the 1/sqrt(emb_dim) they would be ~sqrt(32) = 5.7 times larger).
    assert 0.4 < float(np.std(logits)) < 2.0


# --- scan and remat ----------------------------------------------------------------------------

def test_scan_and_unrolled_give_equal_outputs_and_gradients():
    scanned_cfg, unrolled_cfg = TINY, _cfg(scan_layers=False)
    params = _init(scanned_cfg, seed=3)
    unrolled_params = scanned_to_unrolled(params, TINY)
    # The converted tree has exactly the structure and shapes of a freshly initialised unrolled model.
    reference = _param_shapes(unrolled_cfg)
    assert jax.tree.structure(reference) == jax.tree.structure(unrolled_params)
    jax.tree.map(lambda r, p: (r.shape == p.shape) or pytest.fail(f"{r.shape} != {p.shape}"),
                 reference, unrolled_params)

    batch = _batch(3)
    loss_s, logits_s, grads_s = _loss_and_grads(scanned_cfg, params, batch)
    loss_u, logits_u, grads_u = _loss_and_grads(unrolled_cfg, unrolled_params, batch)
    np.testing.assert_allclose(logits_s, logits_u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss_s, loss_u, rtol=1e-6)
    _assert_trees_close(scanned_to_unrolled(grads_s, TINY), grads_u)
    # Gradients reach every layer of both stacks.
    for name in ("encoder", "decoder"):
        per_layer = jax.tree.map(lambda g: jnp.sum(jnp.abs(g), axis=tuple(range(1, g.ndim))),
                                 grads_s[name]["layers"])
        assert all(np.all(np.asarray(x) > 0) for x in jax.tree.leaves(per_layer))

    # Swapping the two layers of either stack changes the output (the layers really differ).
    for name in ("encoder", "decoder"):
        swapped = jax.tree.map(lambda x: x[::-1], params[name]["layers"])
        other = {**params, name: {**params[name], "layers": swapped}}
        logits_x = _apply(TINY, other, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
        assert not np.allclose(logits_x, logits_s, atol=1e-4)


def test_fully_unrolled_scan_gives_equal_outputs_and_gradients_with_the_same_parameters():
    unrolled_scan = _cfg(scan_unroll=2)  # both stacks: straight-line code over the stacked parameters
    params = _init(TINY, seed=7)
    assert jax.tree.map(lambda x: x.shape, _param_shapes(unrolled_scan)) == jax.tree.map(lambda x: x.shape, params)
    batch = _batch(4)
    loss_a, logits_a, grads_a = _loss_and_grads(TINY, params, batch)
    loss_b, logits_b, grads_b = _loss_and_grads(unrolled_scan, params, batch)
    np.testing.assert_allclose(logits_a, logits_b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss_a, loss_b, rtol=1e-6)
    _assert_trees_close(grads_a, grads_b)


@pytest.mark.parametrize("policy", [name for name in stack.REMAT_POLICIES if name != "none"])
def test_remat_policies_give_equal_gradients(policy):
    # The CPU backend has a pinned_host memory space, so the `_offloaded` policies run too.
    stack.check_backend_supports(policy)
    params = _init(TINY, seed=3)
    batch = _batch(3)
    loss_ref, logits_ref, reference = _loss_and_grads(TINY, params, batch)
    assert float(sum(jnp.sum(jnp.abs(g)) for g in jax.tree.leaves(reference))) > 0
    loss, logits, grads = _loss_and_grads(_cfg(remat_policy=policy), params, batch)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-6)
    np.testing.assert_allclose(logits, logits_ref, rtol=1e-5, atol=1e-6)
    _assert_trees_close(grads, reference)


class _FakeMemory:
    def __init__(self, kind):
        self.kind = kind


class _FakeDevice:
    platform = "fakeplatform"

    def addressable_memories(self):
        return [_FakeMemory("device"), _FakeMemory("unpinned_host")]


def test_check_backend_supports_rejects_offloading_without_pinned_host():
    assert stack.OFFLOADING_POLICIES
    for policy in stack.OFFLOADING_POLICIES:
        with pytest.raises(ValueError) as excinfo:
            stack.check_backend_supports(policy, _FakeDevice())
        message = str(excinfo.value)
        assert repr(policy) in message and "pinned_host" in message and "fakeplatform" in message
        # It suggests the policy that keeps the same activations on the device.
        assert repr(policy.replace("_offloaded", "")) in message
        # The real CPU device has pinned host memory.
        stack.check_backend_supports(policy, jax.devices()[0])
        stack.check_backend_supports(policy)
    for policy in stack.REMAT_POLICIES:
        if policy not in stack.OFFLOADING_POLICIES:
            stack.check_backend_supports(policy, _FakeDevice())  # nothing to offload: no error


# --- packing and masks -------------------------------------------------------------------------

def _pack(examples, inputs_len, targets_len):
    """One row as seqio's EncDecFeatureConverter packs it (segments 1, 2, ...; 0 is padding)."""
    row = {k: np.zeros(n, np.int32) for k, n in (
        ("encoder_input_tokens", inputs_len), ("encoder_segment_ids", inputs_len),
        ("encoder_positions", inputs_len), ("decoder_target_tokens", targets_len),
        ("decoder_input_tokens", targets_len), ("decoder_segment_ids", targets_len),
        ("decoder_positions", targets_len))}
    enc = dec = 0
    for segment, (inputs, targets) in enumerate(examples, start=1):
        n, m = len(inputs), len(targets)
        row["encoder_input_tokens"][enc:enc + n] = inputs
        row["encoder_segment_ids"][enc:enc + n] = segment
        row["encoder_positions"][enc:enc + n] = np.arange(n)
        row["decoder_target_tokens"][dec:dec + m] = targets
        row["decoder_input_tokens"][dec:dec + m] = _shift_right(np.asarray(targets))
        row["decoder_segment_ids"][dec:dec + m] = segment
        row["decoder_positions"][dec:dec + m] = np.arange(m)
        enc, dec = enc + n, dec + m
    return row


def test_packed_examples_give_the_same_loss_as_unpacked():
    params = _init(TINY, seed=5)
    rng = np.random.default_rng(5)
    examples = [(rng.integers(1, 64, 4), rng.integers(1, 64, 3)),
                (rng.integers(1, 64, 6), rng.integers(1, 64, 5))]
    # Two packed rows, the examples in either order; padding at the end of each.
    rows = [_pack(examples, INPUTS_LEN, TARGETS_LEN), _pack(examples[::-1], INPUTS_LEN, TARGETS_LEN)]
    packed = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    assert packed["decoder_input_tokens"][0, 3] == 0 and packed["decoder_input_tokens"][0, 4] == examples[1][1][0]
    # The same examples unpacked, one per row, padded with 0 and without segment ids.
    alone = [_pack([example], INPUTS_LEN, TARGETS_LEN) for example in examples]

    def per_example_losses(row_logits, row):
        losses = _token_losses(row_logits, row["decoder_target_tokens"])
        return [losses[row["decoder_segment_ids"] == s].sum() for s in (1, 2)]

    logits = _apply(TINY, params, packed["encoder_input_tokens"], packed["decoder_input_tokens"],
                    encoder_segment_ids=packed["encoder_segment_ids"],
                    decoder_segment_ids=packed["decoder_segment_ids"],
                    encoder_positions=packed["encoder_positions"],
                    decoder_positions=packed["decoder_positions"])
    alone_logits = _apply(TINY, params, np.stack([r["encoder_input_tokens"] for r in alone]),
                          np.stack([r["decoder_input_tokens"] for r in alone]))
    expected = [per_example_losses(alone_logits[i], alone[i])[0] for i in range(2)]  # (a, b)
    forward = per_example_losses(logits[0], rows[0])  # (a, b)
    backward = per_example_losses(logits[1], rows[1])[::-1]  # (b, a) reversed to (a, b)
    np.testing.assert_allclose(forward, expected, rtol=1e-5)
    np.testing.assert_allclose(backward, expected, rtol=1e-5)
    # Token by token, too: every target position's logits match.
    np.testing.assert_allclose(logits[0, :3], alone_logits[0, :3], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logits[0, 3:8], alone_logits[1, :5], rtol=1e-4, atol=1e-5)

    # Without segment ids the second example attends to the first: its loss changes.
    mixed = _apply(TINY, params, packed["encoder_input_tokens"], packed["decoder_input_tokens"])
    assert abs(per_example_losses(mixed[0], rows[0])[1] - expected[1]) > 1e-3


def test_decoder_is_causal_and_encoder_is_not():
    params = _init(TINY, seed=6)
    batch = _batch(6)
    inputs, dec_in = batch["encoder_input_tokens"], batch["decoder_input_tokens"]
    base = _apply(TINY, params, inputs, dec_in)
    changed = dec_in.copy()
    changed[0, 6] = changed[0, 6] % (TINY.vocab_size - 1) + 1
    after = _apply(TINY, params, inputs, changed)
    np.testing.assert_allclose(after[0, :6], base[0, :6], atol=1e-6)
    assert not np.allclose(after[0, 6:], base[0, 6:], atol=1e-4)
    np.testing.assert_allclose(after[1], base[1], atol=1e-6)  # other rows untouched
    # The encoder is bidirectional: its last token changes the decoder's first logits.
    changed_inputs = inputs.copy()
    changed_inputs[0, -1] = changed_inputs[0, -1] % (TINY.vocab_size - 1) + 1
    after = _apply(TINY, params, changed_inputs, dec_in)
    assert not np.allclose(after[0, 0], base[0, 0], atol=1e-4)


def test_encoder_padding_is_ignored():
    params = _init(TINY, seed=7)
    batch = _batch(7)
    short = batch["encoder_input_tokens"][:, :8]
    short[1, 6:] = 0  # the second row already has some padding
    padded = np.concatenate([short, np.zeros((BATCH, INPUTS_LEN - 8), np.int32)], axis=1)
    dec_in = batch["decoder_input_tokens"]
    a = _apply(TINY, params, short, dec_in)
    b = _apply(TINY, params, padded, dec_in)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    # Counting the padding as real tokens (segment 1 everywhere) does change the output.
    ones = lambda x: np.ones_like(x)  # noqa: E731
    c = _apply(TINY, params, padded, dec_in, encoder_segment_ids=ones(padded), decoder_segment_ids=ones(dec_in),
               encoder_positions=ones(padded), decoder_positions=ones(dec_in))
    assert not np.allclose(c, b, atol=1e-4)


# --- dropout -----------------------------------------------------------------------------------

def test_dropout_only_in_training_mode():
    cfg = _cfg(dropout_rate=0.2)
    model = encoder_decoder.EncoderDecoder(cfg)
    params = _init(TINY, seed=8)  # dropout adds no parameters
    batch = _batch(8)
    run = jax.jit(lambda p, rng, deterministic: model.apply(
        {"params": p}, batch["encoder_input_tokens"], batch["decoder_input_tokens"], deterministic=deterministic,
        rngs={"dropout": rng}), static_argnums=2, compiler_options=FAST_COMPILE)
    key1, key2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
    train1, train1_again, train2 = (np.asarray(run(params, k, False)) for k in (key1, key1, key2))
    eval1, eval2 = (np.asarray(run(params, k, True)) for k in (key1, key2))
    assert np.all(np.isfinite(train1))
    np.testing.assert_array_equal(train1, train1_again)  # same rng, same masks
    assert not np.allclose(train1, train2, atol=1e-3)  # another rng, other masks
    assert not np.allclose(train1, eval1, atol=1e-3)
    np.testing.assert_array_equal(eval1, eval2)  # deterministic: the rng is not used
    # ... and it is the model without dropout.
    no_dropout = _apply(TINY, params, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
    np.testing.assert_allclose(eval1, no_dropout, rtol=1e-5, atol=1e-6)

