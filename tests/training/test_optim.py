"""AdamW: its warmup + cosine schedule, weight-decay mask and gradient clipping."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec

from t5x_lite.models import decoder_only
from t5x_lite.training import optim, schedules

PEAK, WARMUP, DECAY, FINAL = 2e-3, 10, 40, 0.1


def _lr(step):
    return float(schedules.warmup_cosine_schedule(step, peak_learning_rate=PEAK, warmup_steps=WARMUP,
                                              decay_steps=DECAY, final_learning_rate_fraction=FINAL))


def test_schedule_warmup_is_linear_from_zero_to_peak():
    assert _lr(0) == 0.0
    np.testing.assert_allclose(_lr(WARMUP // 2), PEAK / 2, rtol=1e-6)
    for step in range(WARMUP):
        np.testing.assert_allclose(_lr(step), PEAK * step / WARMUP, rtol=1e-6)
    np.testing.assert_allclose(_lr(WARMUP), PEAK, rtol=1e-6)


def test_schedule_cosine_decay_reaches_final_and_stays():
    final = FINAL * PEAK
    np.testing.assert_allclose(_lr(WARMUP + DECAY), final, rtol=1e-5)
    for step in (WARMUP + DECAY + 1, WARMUP + DECAY + 100, 10_000):
        np.testing.assert_allclose(_lr(step), final, rtol=1e-5)
    # Halfway through the decay the cosine is exactly at the midpoint of peak and final.
    np.testing.assert_allclose(_lr(WARMUP + DECAY // 2), (PEAK + final) / 2, rtol=1e-5)
    # Closed form at an arbitrary point of the decay.
    step = WARMUP + 7
    expected = final + 0.5 * (PEAK - final) * (1 + math.cos(math.pi * 7 / DECAY))
    np.testing.assert_allclose(_lr(step), expected, rtol=1e-5)


def test_schedule_monotone_non_increasing_after_warmup():
    values = np.array([_lr(s) for s in range(WARMUP, WARMUP + DECAY + 20)])
    assert np.all(np.diff(values) <= 1e-12)
    assert values[0] > values[-1]


def test_schedule_works_under_jit_with_traced_steps():
    steps = jnp.arange(0, WARMUP + DECAY + 5)
    fn = jax.jit(jax.vmap(lambda s: schedules.warmup_cosine_schedule(
        s, peak_learning_rate=PEAK, warmup_steps=WARMUP, decay_steps=DECAY,
        final_learning_rate_fraction=FINAL)))
    np.testing.assert_allclose(np.asarray(fn(steps)), [_lr(int(s)) for s in steps], rtol=1e-6)


def test_config_schedule_decays_over_rest_of_run_by_default():
    cfg = optim.AdamW(learning_rate=optim.WarmupCosine(peak_learning_rate=1.0, warmup_steps=5,
                                                       final_learning_rate_fraction=0.2))
    sched = cfg.schedule(total_steps=25)
    np.testing.assert_allclose(float(sched(5)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(float(sched(25)), 0.2, rtol=1e-5)
    assert float(sched(24)) > 0.2


def _params_tree():
    cfg_scan = decoder_only.DecoderConfig(vocab_size=32, emb_dim=16, num_heads=2, num_kv_heads=1,
                                          head_dim=8, mlp_dim=32, num_layers=2, max_len=8)
    cfg_unrolled = decoder_only.DecoderConfig(**{**cfg_scan.to_dict(), "scan_layers": False})
    tokens = jnp.zeros((1, 8), jnp.int32)
    p_scan = jax.eval_shape(lambda: decoder_only.Decoder(cfg_scan).init(jax.random.PRNGKey(0), tokens))
    p_unr = jax.eval_shape(lambda: decoder_only.Decoder(cfg_unrolled).init(jax.random.PRNGKey(0), tokens))
    return p_scan["params"], p_unr["params"]


@pytest.mark.parametrize("scanned", [True, False])
def test_weight_decay_mask_on_real_model_params(scanned):
    params = _params_tree()[0 if scanned else 1]
    mask = optim.weight_decay_mask(params)
    flat = jax.tree_util.tree_flatten_with_path(mask)[0]
    shapes = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    seen = {"kernel": 0, "embedding": 0, "scale": 0}
    for path, value in flat:
        leaf = path[-1].key
        seen[leaf] += 1
        if leaf in ("kernel", "embedding"):
            assert value is True, path
        else:
            assert leaf == "scale"
            assert value is False, path
    assert all(seen.values()), seen
    if scanned:
        # The scanned norms' scales are [layers, embed] and must still be excluded.
        scanned_scales = [p for p, _ in flat if p[-1].key == "scale" and len(shapes[p].shape) == 2]
        assert scanned_scales and all(not dict(flat)[p] for p in scanned_scales)


def test_weight_decay_applies_only_to_masked_leaves():
    """With zero gradients AdamW's update is -lr * wd * param on matrices and 0 on scales."""
    params = {
        "dense": {"kernel": jnp.ones((3, 4))},
        "embed": {"embedding": jnp.full((5, 3), 2.0)},
        "norm": {"scale": jnp.ones((3,))},
        "layers": {"norm": {"scale": jnp.ones((2, 3))}},
    }
    cfg = optim.AdamW(learning_rate=optim.WarmupCosine(peak_learning_rate=0.5, warmup_steps=0, decay_steps=10,
                                                       final_learning_rate_fraction=1.0),
                      weight_decay=0.1, clip_grad_norm=0.0)
    tx = cfg.build(total_steps=10)
    state = tx.init(params)
    grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(grads, state, params)
    np.testing.assert_allclose(updates["dense"]["kernel"], -0.5 * 0.1 * 1.0, rtol=1e-6)
    np.testing.assert_allclose(updates["embed"]["embedding"], -0.5 * 0.1 * 2.0, rtol=1e-6)
    np.testing.assert_array_equal(updates["norm"]["scale"], 0.0)
    np.testing.assert_array_equal(updates["layers"]["norm"]["scale"], 0.0)


def test_clip_by_global_norm_is_optax_clipping_given_the_norm():
    clip = 0.5
    grads = {"a": {"kernel": jnp.full((4, 4), 1e4)}, "b": {"scale": jnp.full((4,), -3e3)}}
    norm = optax.tree.norm(grads)
    clipped = optim.clip_by_global_norm(grads, grad_norm=norm, max_norm=clip)
    assert float(optax.tree.norm(clipped)) <= clip + 1e-5
    # Clipping is only a rescale: direction unchanged, and optax's arithmetic to the bit.
    ratio_a = np.asarray(clipped["a"]["kernel"]) / np.asarray(grads["a"]["kernel"])
    ratio_b = np.asarray(clipped["b"]["scale"]) / np.asarray(grads["b"]["scale"])
    np.testing.assert_allclose(ratio_b, ratio_a.flat[0], rtol=1e-5)
    np.testing.assert_allclose(ratio_a.flat[0], clip / float(norm), rtol=1e-5)
    clipper = optax.clip_by_global_norm(clip)
    expected, _ = clipper.update(grads, clipper.init(grads))
    jax.tree.map(np.testing.assert_array_equal, clipped, expected)
    # Below the threshold, or with clipping off, the gradients pass unchanged.
    small = jax.tree.map(lambda g: g * 1e-6, grads)
    jax.tree.map(np.testing.assert_array_equal,
                 optim.clip_by_global_norm(small, grad_norm=optax.tree.norm(small), max_norm=clip), small)
    for off in (None, 0.0):
        assert optim.clip_by_global_norm(grads, grad_norm=norm, max_norm=off) is grads


@pytest.mark.parametrize("cfg", [optim.AdamW(clip_grad_norm=0.5), optim.Adafactor(clip_grad_norm=0.5)],
                         ids=["adamw", "adafactor"])
def test_clipping_keeps_the_state_layout_of_optax_chain(cfg):
    """The state keeps optax.chain(clip_by_global_norm, tx)'s layout (checkpoints stay readable);
    the transformation itself leaves clipping to the train step."""
    params = {"a": {"kernel": jnp.ones((4, 4))}, "b": {"scale": jnp.ones((4,))}}
    axes = {"a": {"kernel": PartitionSpec("embed", "mlp")}, "b": {"scale": PartitionSpec("embed")}}
    tx = cfg.build(total_steps=100, logical_axes=axes)
    unclipped = dataclasses.replace(cfg, clip_grad_norm=None).build(total_steps=100, logical_axes=axes)
    chained = optax.chain(optax.clip_by_global_norm(0.5), unclipped)
    state = tx.init(params)
    assert jax.tree.structure(state) == jax.tree.structure(chained.init(params))
    grads = {"a": {"kernel": jnp.full((4, 4), 1e4)}, "b": {"scale": jnp.full((4,), -3e3)}}
    for _ in range(3):
        updates, state = tx.update(grads, state, params)
    reference = state[1]
    unclipped_state = unclipped.init(params)
    for _ in range(3):
        expected, unclipped_state = unclipped.update(grads, unclipped_state, params)
    jax.tree.map(np.testing.assert_array_equal, updates, expected)
    jax.tree.map(np.testing.assert_array_equal, reference, unclipped_state)


def test_no_clipping_when_disabled():
    cfg = optim.AdamW(clip_grad_norm=0.0)
    tx = cfg.build(total_steps=10)
    params = {"w": {"kernel": jnp.ones((2, 2))}}
    grads = {"w": {"kernel": jnp.full((2, 2), 1e6)}}
    adamw = optax.adamw(cfg.schedule(10), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay, mask=optim.weight_decay_mask)
    s1, s2 = tx.init(params), adamw.init(params)
    for _ in range(2):
        u1, s1 = tx.update(grads, s1, params)
        u2, s2 = adamw.update(grads, s2, params)
    np.testing.assert_allclose(u1["w"]["kernel"], u2["w"]["kernel"], rtol=1e-6)
