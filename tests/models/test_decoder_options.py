"""The decoder's Mistral, Qwen2 and Gemma options: sliding-window attention (training and the KV
cache), q/k/v biases, RMSNorm scaled by (1 + scale), scaled embeddings; their parameter counts,
FLOPs and logical axes."""

import dataclasses
import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.linen import partitioning as nn_partitioning

from t5x_lite.errors import ConfigValueError
from t5x_lite.models import decoder_only, layers

BASE = decoder_only.DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                                  mlp_dim=64, num_layers=2, max_len=32)
WINDOW = 3
MISTRAL = dataclasses.replace(BASE, sliding_window=WINDOW)
QWEN2 = dataclasses.replace(BASE, qkv_bias=True, tie_embeddings=True)
GEMMA = dataclasses.replace(BASE, norm="rmsnorm_plus_one", mlp_activations=("gelu", "linear"), scale_embeddings=True,
                            tie_embeddings=True, num_kv_heads=1, head_dim=12)


def _tokens(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).integers(1, BASE.vocab_size, size=shape), jnp.int32)


def _init(cfg, seed=0):
    """Params and their logical axes (the `params_axes` collection)."""
    variables = jax.jit(lambda: cfg.make_module().init(jax.random.PRNGKey(seed), jnp.zeros((1, 8), jnp.int32)))()
    return variables["params"], nn_partitioning.get_axis_names(variables["params_axes"])


@functools.lru_cache(maxsize=None)
def _jitted_apply(cfg):
    module = cfg.make_module()
    return jax.jit(lambda params, tokens, **kw: module.apply({"params": params}, tokens, **kw))


def _apply(cfg, params, tokens, **kwargs):
    return np.asarray(_jitted_apply(cfg)(params, tokens, **kwargs))


def _leaves(tree) -> dict:
    """{'/'-joined path: leaf}, an AxisMetadata (logical axis names) counting as a leaf."""
    is_axes = lambda x: isinstance(x, nn_partitioning.AxisMetadata)  # noqa: E731
    return {"/".join(str(getattr(k, "key", k)) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_axes)[0]}


@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
def test_num_params_match_the_tree_and_new_parameters_carry_logical_axes(scan):
    for cfg in (MISTRAL, QWEN2, dataclasses.replace(QWEN2, tie_embeddings=False), GEMMA):
        cfg = dataclasses.replace(cfg, scan_layers=scan)
        shapes = jax.eval_shape(lambda cfg=cfg: cfg.make_module().init(
            jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
        params = _leaves(shapes["params"])
        assert cfg.num_params() == sum(math.prod(x.shape) for x in params.values()), cfg
        axes = {path: tuple(a.names) for path, a in _leaves(shapes["params_axes"]).items()}
        layer = "layers/attention/" if scan else "layers_unrolled/layers_0/attention/"
        biases = {p for p in params if p.endswith("/bias")}
        if cfg.qkv_bias:  # q, k and v only, each with its kernel's output axes
            assert biases == {f"{'layers' if scan else f'layers_unrolled/layers_{i}'}/attention/{n}/bias"
                              for n in ("query", "key", "value") for i in range(1 if scan else 2)}
            for name in ("query", "key", "value"):
                kernel, bias = axes[f"{layer}{name}/kernel_axes"], axes[f"{layer}{name}/bias_axes"]
                assert bias == kernel[:-3] + kernel[-2:] and params[f"{layer}{name}/bias"].shape[-2:] == (
                    cfg.num_heads if name == "query" else cfg.num_kv_heads, cfg.head_dim)
        else:
            assert not biases
        assert all(len(a) == params[p.replace("_axes", "")].ndim for p, a in axes.items())


def test_sliding_window_hides_tokens_further_back_than_the_window_per_layer():
    """With 2 layers a token reaches 2 * (WINDOW - 1) positions ahead and no further."""
    params, _ = _init(MISTRAL, seed=1)
    tokens = _tokens(2, (1, 12))
    changed = tokens.at[0, 0].set((tokens[0, 0] + 7) % BASE.vocab_size)
    a, b = _apply(MISTRAL, params, tokens), _apply(MISTRAL, params, changed)
    reach = 2 * (WINDOW - 1)
    assert not np.allclose(a[0, reach], b[0, reach], atol=1e-5)
    np.testing.assert_array_equal(a[0, reach + 1:], b[0, reach + 1:])
    # Without the window every later position sees the change.
    full = _apply(BASE, params, tokens), _apply(BASE, params, changed)
    assert not np.allclose(full[0][0, -1], full[1][0, -1], atol=1e-5)
    # 'xla' (jax's local_window_size) computes what 'explicit' (a mask) does.
    xla = dataclasses.replace(MISTRAL, attention_implementation="xla")
    np.testing.assert_allclose(_apply(xla, params, tokens), a, rtol=1e-5, atol=1e-5)
    # Packed, the second example is windowed as it would be alone.
    segments = jnp.asarray([[1] * 5 + [2] * 7], jnp.int32)
    positions = jnp.asarray([list(range(5)) + list(range(7))], jnp.int32)
    packed = _apply(MISTRAL, params, tokens, decoder_segment_ids=segments, decoder_positions=positions)
    np.testing.assert_allclose(packed[0, 5:], _apply(MISTRAL, params, tokens[:, 5:])[0], rtol=1e-5, atol=1e-5)


def test_the_kv_cache_keeps_the_window_when_decoding_one_token_at_a_time():
    """Prefill 4 tokens, then one at a time up to 12 (four windows): each step's logits equal the
    full forward pass's at that position."""
    params, _ = _init(MISTRAL, seed=3)
    tokens = _tokens(4, (2, 12))
    expected = _apply(MISTRAL, params, tokens)
    module = MISTRAL.make_module()
    cache = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), tokens, decode=True))["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache)

    @jax.jit
    def step(cache, new, start):
        positions = start + jnp.broadcast_to(jnp.arange(new.shape[1]), new.shape)
        logits, variables = module.apply({"params": params, "cache": cache}, new, decoder_positions=positions,
                                         decode=True, mutable=["cache"])
        return logits, variables["cache"]

    logits, cache = step(cache, tokens[:, :4], 0)
    got = [logits]
    for i in range(4, 12):
        logits, cache = step(cache, tokens[:, i:i + 1], i)
        got.append(logits)
    np.testing.assert_allclose(np.concatenate(got, axis=1), expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(expected[:, -1], _apply(BASE, params, tokens)[:, -1], atol=1e-4)


def test_qkv_biases_shift_q_k_and_v_and_leave_the_rest_alone():
    params, _ = _init(QWEN2, seed=5)
    tokens = _tokens(6, (2, 9))
    # Zero biases: the model without them.
    zeroed = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if getattr(path[-1], "key", "") == "bias" else x, params)
    no_bias = {**zeroed, "layers": {**zeroed["layers"], "attention": {
        n: {"kernel": v["kernel"]} for n, v in zeroed["layers"]["attention"].items()}}}
    np.testing.assert_allclose(_apply(QWEN2, zeroed, tokens),
                               _apply(dataclasses.replace(QWEN2, qkv_bias=False), no_bias, tokens), rtol=1e-6)
    shifted = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.5 if getattr(path[-1], "key", "") == "bias" else x, zeroed)
    assert not np.allclose(_apply(QWEN2, shifted, tokens), _apply(QWEN2, zeroed, tokens), atol=1e-3)


def test_gemma_norm_and_embedding_scale():
    x = 3.0 * jax.random.normal(jax.random.PRNGKey(0), (2, 5, 16)) + 1.0
    norm = layers.NORMS["rmsnorm_plus_one"]()
    variables = norm.init(jax.random.PRNGKey(0), x)
    np.testing.assert_array_equal(np.asarray(variables["params"]["scale"]), 0.0)  # stored as Gemma stores it
    plain = np.asarray(layers.RMSNorm().apply({"params": {"scale": jnp.ones(16)}}, x))
    np.testing.assert_allclose(np.asarray(norm.apply(variables, x)), plain, rtol=1e-6)
    scale = jnp.linspace(-0.5, 0.5, 16)
    np.testing.assert_allclose(np.asarray(norm.apply({"params": {"scale": scale}}, x)),
                               plain * (1.0 + np.asarray(scale)), rtol=1e-5)

    # Scaled embeddings: the same as a table multiplied by sqrt(emb_dim) (untied, so the logits
    # do not read the table).
    untied = dataclasses.replace(GEMMA, tie_embeddings=False)
    params, _ = _init(untied, seed=7)
    tokens = _tokens(8, (2, 7))
    table = params["token_embed"]["embedding"]
    scaled_table = {**params, "token_embed": {"embedding": table * np.float32(math.sqrt(BASE.emb_dim))}}
    np.testing.assert_allclose(_apply(untied, params, tokens),
                               _apply(dataclasses.replace(untied, scale_embeddings=False), scaled_table, tokens),
                               rtol=1e-5, atol=1e-5)
    # In bfloat16 the factor is rounded to bfloat16 first: sqrt(32) = 5.657 -> 5.65625.
    assert float(jnp.asarray(np.float32(math.sqrt(32)), jnp.bfloat16)) == 5.65625


def test_flops_count_at_most_the_window_and_bad_windows_are_refused():
    assert MISTRAL.flops_per_token(2) == BASE.flops_per_token(2)
    window_part = MISTRAL.flops_per_token(100) - BASE.flops_per_token(0)
    assert window_part == 12 * BASE.num_layers * BASE.num_heads * BASE.head_dim * WINDOW
    for bad in (0, -4, 2.5, "64", True):
        with pytest.raises(ConfigValueError, match="sliding_window"):
            dataclasses.replace(BASE, sliding_window=bad)
    with pytest.raises(ConfigValueError, match="rmsnorm_plus_one"):
        dataclasses.replace(BASE, norm="bogus")


def test_a_checkpoint_saved_before_the_options_existed_still_fits_the_same_model():
    from t5x_lite.checkpoints.compatibility import CheckpointMismatchError, check_compatible

    current = {"family": BASE.family, "model": json.loads(json.dumps(BASE.to_dict()))}
    older = {"family": BASE.family, "model": {k: v for k, v in current["model"].items()
                                             if k not in ("sliding_window", "qkv_bias", "scale_embeddings")}}
    check_compatible(older, current, model_dir="/nowhere")  # the defaults are what that model computed
    windowed = {"family": BASE.family, "model": json.loads(json.dumps(MISTRAL.to_dict()))}
    with pytest.raises(CheckpointMismatchError, match="sliding_window: checkpoint None vs config 3"):
        check_compatible(older, windowed, model_dir="/nowhere")


def test_a_checkpoint_fits_a_config_that_only_unrolls_the_scan_differently():
    from t5x_lite.checkpoints.compatibility import CheckpointMismatchError, check_compatible

    saved = {"family": BASE.family, "model": json.loads(json.dumps(BASE.to_dict()))}
    unrolled_scan = dataclasses.replace(BASE, scan_unroll=BASE.num_layers)
    check_compatible(saved, {"family": BASE.family, "model": json.loads(json.dumps(unrolled_scan.to_dict()))},
                     model_dir="/nowhere")  # the same stacked parameters
    unscanned = dataclasses.replace(BASE, scan_layers=False)
    with pytest.raises(CheckpointMismatchError, match="scan_layers: checkpoint True vs config False"):
        check_compatible(saved, {"family": BASE.family, "model": json.loads(json.dumps(unscanned.to_dict()))},
                         model_dir="/nowhere")
