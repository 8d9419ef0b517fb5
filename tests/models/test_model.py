"""The decoder-only LM: shapes, parameter count, scan/remat equivalence, packing, causality."""

import dataclasses
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite.errors import ConfigValueError
from t5x_lite.models import decoder_only, stack

BASE = decoder_only.DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                                  mlp_dim=64, num_layers=2, max_len=16)
# GPT-2 style: learned positions, LayerNorm, a plain GELU MLP, biases everywhere, tied logits.
GPT2 = dataclasses.replace(BASE, position_embedding="learned", norm="layernorm", mlp_activations=("gelu",),
                           use_bias=True, tie_embeddings=True)


def _cfg(**overrides):
    return dataclasses.replace(BASE, **overrides)


@functools.lru_cache(maxsize=None)
def _jitted_init(cfg, length):
    model = decoder_only.Decoder(cfg)
    return jax.jit(lambda rng: model.init(rng, jnp.zeros((1, length), jnp.int32))["params"])


@functools.lru_cache(maxsize=None)
def _jitted_apply(cfg):
    model = decoder_only.Decoder(cfg)
    return jax.jit(lambda params, tokens, **kw: model.apply({"params": params}, tokens, **kw))


def _init(cfg, seed=0, length=16):
    return _jitted_init(cfg, length)(jax.random.PRNGKey(seed))


def _tokens(seed, shape, vocab=BASE.vocab_size):
    return jnp.asarray(np.random.default_rng(seed).integers(1, vocab, size=shape), jnp.int32)


def _apply(cfg, params, tokens, **kwargs):
    return _jitted_apply(cfg)(params, tokens, **kwargs)


def scanned_to_unrolled(params, num_layers):
    """Slices every scanned [layers, ...] leaf into layers_unrolled/layers_{i}."""
    out = {k: v for k, v in params.items() if k != "layers"}
    out["layers_unrolled"] = {
        f"layers_{i}": jax.tree.map(lambda x, i=i: x[i], params["layers"]) for i in range(num_layers)
    }
    return out


def test_output_shape_and_float32_logits():
    params = _init(BASE)
    logits = _apply(BASE, params, _tokens(0, (3, 10)))
    assert logits.shape == (3, 10, BASE.vocab_size)
    assert logits.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(logits)))
    # The small output init puts the initial loss close to ln(vocab).
    log_probs = jax.nn.log_softmax(logits)
    assert abs(float(-jnp.mean(log_probs)) - math.log(BASE.vocab_size)) < 0.5


@pytest.mark.parametrize("scan", [True, False])
def test_num_params_matches_tree(scan):
    for cfg in (_cfg(scan_layers=scan), _cfg(scan_layers=scan, num_layers=3, num_kv_heads=4, mlp_dim=48)):
        shapes = jax.eval_shape(lambda cfg=cfg: decoder_only.Decoder(cfg).init(
            jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])
        actual = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
        assert cfg.num_params() == actual


def test_scan_and_unrolled_give_equal_logits():
    scanned_cfg, unrolled_cfg = _cfg(scan_layers=True), _cfg(scan_layers=False)
    params = _init(scanned_cfg, seed=3)
    unrolled_params = scanned_to_unrolled(params, BASE.num_layers)
    # The converted tree has exactly the structure and shapes of a freshly initialised unrolled model.
    reference = jax.eval_shape(lambda: decoder_only.Decoder(unrolled_cfg).init(
        jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])
    assert jax.tree.structure(reference) == jax.tree.structure(unrolled_params)
    jax.tree.map(lambda r, p: (r.shape == p.shape) or pytest.fail(f"{r.shape} != {p.shape}"),
                 reference, unrolled_params)

    tokens = _tokens(1, (2, 12))
    a = _apply(scanned_cfg, params, tokens)
    b = _apply(unrolled_cfg, unrolled_params, tokens)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    # Swapping the two layers' parameters does change the output (the layers really differ).
    swapped = jax.tree.map(lambda x: x[::-1], params["layers"])
    c = _apply(scanned_cfg, {**params, "layers": swapped}, tokens)
    assert not np.allclose(np.asarray(a), np.asarray(c), atol=1e-4)


@functools.lru_cache(maxsize=None)
def _jitted_loss_grads(cfg):
    model = decoder_only.Decoder(cfg)

    def loss(p, tokens):
        logits = model.apply({"params": p}, tokens[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

    # Gradient graphs are the slowest to compile; LLVM's optimisation level does not change what
    # they compute, and level 0 roughly halves the compile time on CPU.
    return jax.jit(jax.grad(loss), compiler_options={"xla_backend_optimization_level": 0})


def _loss_grads(cfg, params, tokens):
    return _jitted_loss_grads(cfg)(params, tokens)


@pytest.mark.parametrize("policy", [name for name in stack.REMAT_POLICIES if name != "none"])
def test_remat_policies_give_equal_gradients(policy):
    # Every policy, the `_offloaded` ones included: the CPU backend has a pinned_host memory space.
    stack.check_backend_supports(policy)
    params = _init(BASE, seed=4)
    tokens = _tokens(2, (2, 13))
    reference = _loss_grads(_cfg(remat_policy="none"), params, tokens)
    assert float(sum(jnp.sum(jnp.abs(g)) for g in jax.tree.leaves(reference))) > 0
    grads = _loss_grads(_cfg(remat_policy=policy), params, tokens)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, reference)


def test_configs_name_the_attention_they_run(monkeypatch):
    from t5x_lite.models import encoder_decoder

    t5 = encoder_decoder.T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                                  num_encoder_layers=1, num_decoder_layers=1)
    assert BASE.attention() == t5.attention() == "explicit"  # 8 CPU devices
    assert _cfg(attention_implementation="xla").attention() == "xla"
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    assert BASE.attention() == t5.attention() == "explicit_blas"
    assert _cfg(dtype="bfloat16").attention() == "explicit"


@pytest.mark.parametrize("policy", ["none", "full"])
def test_blas_attention_products_give_equal_gradients(policy):
    """'explicit_blas' (attention on the fused native CPU kernel) inside the scanned stack,
    with and without remat, computes the gradients of 'explicit' (the same products on XLA)."""
    params = _init(BASE, seed=6)
    tokens = _tokens(4, (2, 13))
    reference = _loss_grads(_cfg(remat_policy=policy, attention_implementation="explicit"), params, tokens)
    grads = _loss_grads(_cfg(remat_policy=policy, attention_implementation="explicit_blas"), params, tokens)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, reference)


def test_remat_unrolled_gives_equal_gradients():
    params = _init(BASE, seed=5)
    tokens = _tokens(3, (2, 9))
    reference = _loss_grads(_cfg(remat_policy="none"), params, tokens)
    unrolled = _loss_grads(_cfg(remat_policy="full", scan_layers=False),
                           scanned_to_unrolled(params, BASE.num_layers), tokens)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 unrolled, scanned_to_unrolled(reference, BASE.num_layers))


@pytest.mark.parametrize("unroll", [2, 3])
def test_scan_unroll_keeps_the_layout_and_computes_the_same(unroll):
    # 3 layers: unroll 2 leaves a remainder layer outside the loop; 3 compiles no loop at all.
    looped, unrolled = _cfg(num_layers=3), _cfg(num_layers=3, scan_unroll=unroll)
    params = _init(looped, seed=6)
    shapes = jax.eval_shape(lambda: decoder_only.Decoder(unrolled).init(
        jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])
    assert jax.tree.map(lambda x: x.shape, shapes) == jax.tree.map(lambda x: x.shape, params)
    tokens = _tokens(4, (2, 11))
    np.testing.assert_allclose(np.asarray(_apply(unrolled, params, tokens)),
                               np.asarray(_apply(looped, params, tokens)), rtol=1e-5, atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 _loss_grads(unrolled, params, tokens), _loss_grads(looped, params, tokens))

    def forward_hlo(cfg):
        return _jitted_apply(cfg).lower(params, tokens).as_text()

    assert "stablehlo.while" in forward_hlo(looped)
    assert ("stablehlo.while" in forward_hlo(unrolled)) == (unroll < 3)


def test_remat_without_the_loop_keeps_its_recomputation_apart_from_the_forward_pass():
    # Straight-line remat needs prevent_cse (optimization barriers), or XLA merges the backward
    # pass's recomputation with the forward pass; inside the loop the barriers only cost speed.
    params, tokens = _init(_cfg(num_layers=3), seed=6), _tokens(5, (2, 11))

    def grad_hlo(cfg):
        return _jitted_loss_grads(cfg).lower(params, tokens).as_text()

    # The norms and activations recompute under their own jax.checkpoint, behind barriers of their
    # one to three operands, in every layout; the layer's remat barrier carries the layer's inputs
    # and all its parameters.
    def widest_barrier(cfg):
        barriers = re.findall(r"stablehlo\.optimization_barrier ([^:]*):", grad_hlo(cfg))
        return max(len(operands.split(",")) for operands in barriers)

    assert widest_barrier(_cfg(num_layers=3, scan_unroll=3, remat_policy="full")) > 3
    assert widest_barrier(_cfg(num_layers=3, remat_policy="full")) <= 3


def test_scan_unroll_is_a_positive_integer_for_scanned_layers_only():
    with pytest.raises(ConfigValueError, match="scan_unroll=2 applies to scanned layers only"):
        _cfg(scan_layers=False, scan_unroll=2)
    with pytest.raises(ConfigValueError, match="scan_unroll=0 must be a positive integer"):
        _cfg(scan_unroll=0)
    for bad in ("4", "Auto", True, 2.0):
        with pytest.raises(ConfigValueError, match=r"must be a positive integer or 'auto'"):
            _cfg(scan_unroll=bad)


def test_scan_unroll_auto_is_accepted_and_compiles_the_loop_until_resolved():
    """'auto' (the train loop replaces it at start-up) is valid with either layout; a model built
    from a config that still says 'auto' compiles the loop, as scan_unroll=1."""
    assert _cfg(scan_layers=False, scan_unroll="auto").layers_per_iteration == 1
    auto, looped = _cfg(num_layers=3, scan_unroll="auto"), _cfg(num_layers=3)
    assert (auto.layers_per_iteration, _cfg(scan_unroll=3).layers_per_iteration) == (1, 3)
    params, tokens = _init(looped, seed=6), _tokens(4, (2, 11))
    assert "stablehlo.while" in _jitted_apply(auto).lower(params, tokens).as_text()
    np.testing.assert_array_equal(np.asarray(_apply(auto, params, tokens)), np.asarray(_apply(looped, params, tokens)))


STYLES = pytest.mark.parametrize("cfg", [BASE, GPT2], ids=["llama", "gpt2"])


@STYLES
def test_packed_sequences_match_sequences_run_alone(cfg):
    params = _init(cfg, seed=6)
    seq_a, seq_b = _tokens(10, (5,)), _tokens(11, (7,))
    length = 16
    pad = length - 12
    tokens = jnp.concatenate([seq_a, seq_b, jnp.zeros((pad,), jnp.int32)])[None]
    segment_ids = jnp.asarray([[1] * 5 + [2] * 7 + [0] * pad], jnp.int32)
    positions = jnp.asarray([list(range(5)) + list(range(7)) + [0] * pad], jnp.int32)
    packed = np.asarray(_apply(cfg, params, tokens, decoder_positions=positions, decoder_segment_ids=segment_ids))
    alone_a = np.asarray(_apply(cfg, params, seq_a[None]))
    alone_b = np.asarray(_apply(cfg, params, seq_b[None]))
    np.testing.assert_allclose(packed[0, :5], alone_a[0], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(packed[0, 5:12], alone_b[0], atol=1e-5, rtol=1e-5)
    # Without segment ids and restarted positions the second sequence would see the first.
    unpacked = np.asarray(_apply(cfg, params, tokens))
    assert not np.allclose(unpacked[0, 5:12], alone_b[0], atol=1e-3)


@STYLES
def test_causality_future_tokens_do_not_change_past_logits(cfg):
    params = _init(cfg, seed=7)
    tokens = _tokens(12, (1, 12))
    changed = tokens.at[0, 7].set((tokens[0, 7] + 5) % cfg.vocab_size)
    a = np.asarray(_apply(cfg, params, tokens))
    b = np.asarray(_apply(cfg, params, changed))
    np.testing.assert_allclose(a[0, :7], b[0, :7], atol=1e-6)
    assert not np.allclose(a[0, 7:], b[0, 7:], atol=1e-4)


def test_unknown_remat_policy_raises_naming_valid_ones():
    with pytest.raises(ValueError) as excinfo:
        _cfg(remat_policy="everything")
    message = str(excinfo.value)
    assert "everything" in message
    for name in stack.REMAT_POLICIES:
        assert name in message
    with pytest.raises(ValueError, match="none"):
        stack.stack_layers(decoder_only.DecoderBlock, num_layers=2, scan=True, remat="bogus", num_broadcast=3)


def test_bfloat16_keeps_float32_params_and_runs():
    cfg = _cfg(dtype="bfloat16")
    params = _init(cfg, seed=8)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    tokens = _tokens(13, (2, 10))
    logits = _apply(cfg, params, tokens)
    assert logits.dtype == jnp.float32 and logits.shape == (2, 10, BASE.vocab_size)
    assert np.all(np.isfinite(np.asarray(logits)))
    # Same function as float32, up to bfloat16 rounding.
    ref = np.asarray(_apply(BASE, params, tokens))
    err = np.max(np.abs(np.asarray(logits) - ref))
    assert err < 0.1 * np.max(np.abs(ref)) + 1e-2


def _param_shapes(cfg):
    return jax.eval_shape(lambda: decoder_only.Decoder(cfg).init(
        jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])


@pytest.mark.parametrize("tie", [True, False])
def test_gpt2_style_num_params_and_parameter_tree(tie):
    cfg = dataclasses.replace(GPT2, tie_embeddings=tie)
    shapes = _param_shapes(cfg)
    assert cfg.num_params() == sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    d, v = cfg.emb_dim, cfg.vocab_size
    # Tied logits reuse the token table: no output projection at all.
    assert ("logits" in shapes) == (not tie)
    if not tie:
        assert shapes["logits"]["kernel"].shape == (d, v) and shapes["logits"]["bias"].shape == (v,)
    assert shapes["token_embed"]["embedding"].shape == (v, d)
    assert shapes["position_embed"]["embedding"].shape == (cfg.max_len, d)
    layer = shapes["layers"]
    assert set(layer["mlp"]) == {"wi", "wo"}
    for norm in ("attn_norm", "mlp_norm"):
        assert set(layer[norm]) == {"scale", "bias"}
    assert set(shapes["final_norm"]) == {"scale", "bias"}
    for proj in ("query", "key", "value", "out"):
        assert set(layer["attention"][proj]) == {"kernel", "bias"}
    # Unrolled, the count is the same.
    assert cfg.num_params() == sum(math.prod(x.shape) for x in jax.tree.leaves(
        _param_shapes(dataclasses.replace(cfg, scan_layers=False))))


def test_default_style_has_no_biases_and_no_position_table():
    shapes = _param_shapes(BASE)
    assert "position_embed" not in shapes and "logits" in shapes
    paths = ["/".join(str(getattr(k, "key", k)) for k in path)
             for path, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]]
    assert not [p for p in paths if p.endswith("bias")]


def test_gpt2_tied_logits_use_the_token_embedding():
    params = _init(GPT2, seed=9)
    tokens = _tokens(14, (2, 10))
    logits = np.asarray(_apply(GPT2, params, tokens))
    assert logits.shape == (2, 10, GPT2.vocab_size) and np.all(np.isfinite(logits))
    # Scaling the vocabulary rows of the table scales the logits of those rows only (through the
    # output projection), once the inputs avoid them.
    table = params["token_embed"]["embedding"]
    unused = np.setdiff1d(np.arange(GPT2.vocab_size), np.asarray(tokens))
    scaled = table.at[unused].multiply(3.0)
    logits3 = np.asarray(_apply(GPT2, {**params, "token_embed": {"embedding": scaled}}, tokens))
    np.testing.assert_allclose(logits3[..., unused], 3.0 * logits[..., unused], rtol=1e-4, atol=1e-5)
    used = np.setdiff1d(np.arange(GPT2.vocab_size), unused)
    np.testing.assert_allclose(logits3[..., used], logits[..., used], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("field,valid", [
    ("norm", ("rmsnorm", "layernorm")),
    ("position_embedding", ("rope", "learned")),
    ("attention_implementation", ("auto", "xla", "cudnn")),
])
def test_unknown_choice_raises_naming_valid_ones(field, valid):
    with pytest.raises(ValueError) as excinfo:
        _cfg(**{field: "bogus_choice"})
    message = str(excinfo.value)
    assert field in message and "bogus_choice" in message
    for name in valid:
        assert name in message
