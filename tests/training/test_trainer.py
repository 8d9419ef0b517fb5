"""The jitted train step: learning, gradient accumulation, padding, and mesh independence."""

import functools

import jax
import numpy as np
import optax
import pytest

from t5x_lite.models import decoder_only
from t5x_lite.parallel import partitioning
from t5x_lite.training import trainer as trainer_lib
from t5x_lite.training.optim import AdamW, WarmupCosine

CFG = decoder_only.DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                                 mlp_dim=64, num_layers=2, max_len=16)
BATCH, LENGTH = 8, 16
ADAMW = AdamW(learning_rate=WarmupCosine(peak_learning_rate=1e-2, warmup_steps=0, decay_steps=30,
                                         final_learning_rate_fraction=0.1), weight_decay=0.01, clip_grad_norm=1.0)
# Plain SGD makes parameters a linear function of the gradient: the strictest comparison.
OPTIMIZERS = {"adamw": (ADAMW.build(total_steps=30), ADAMW.schedule(30), ADAMW.clip_grad_norm),
              "sgd": (optax.sgd(0.5), lambda step: 0.5, None),
              "clipped_sgd": (optax.sgd(0.5), lambda step: 0.5, 0.05)}


def make_batch(seed=0, batch=BATCH, length=LENGTH):
    rng = np.random.default_rng(seed)
    seq = rng.integers(2, CFG.vocab_size, size=(batch, length + 1)).astype(np.int32)
    weights = np.ones((batch, length), np.float32)
    # Uneven padding: the first half of the batch has far fewer target tokens than the second,
    # so normalising per microbatch (instead of per global batch) would be caught.
    for row, real in enumerate([4, 6, 9, 16, 16, 16, 12, 16][:batch]):
        weights[row, real:] = 0.0
    inputs, targets = seq[:, :-1].copy(), seq[:, 1:].copy()
    inputs[weights == 0] = 0
    targets[weights == 0] = 0
    return {"decoder_input_tokens": inputs, "decoder_target_tokens": targets, "decoder_loss_weights": weights}


@functools.lru_cache(maxsize=None)
def get_trainer(mesh_axes=(("data", 1), ("fsdp", 1), ("tensor", 1)), optimizer="adamw", microbatches=1):
    devices = jax.devices()[: int(np.prod([s for _, s in mesh_axes]))]
    mesh = partitioning.make_mesh(axes=mesh_axes, devices=devices)
    tx, schedule, clip = OPTIMIZERS[optimizer]
    return trainer_lib.Trainer(model=decoder_only.Decoder(CFG), optimizer=tx, learning_rate_fn=schedule,
                               mesh=mesh, rules=partitioning.DEFAULT_RULES, microbatches=microbatches,
                               clip_grad_norm=clip)


_INITIAL_STATES = {}


def initial_state(trainer, batch, seed=0):
    """trainer.init_state, computed once per mesh and optimizer (each call compiles anew), then copied.

    Trainers that differ only in `microbatches` share it, so they start from identical states.
    """
    key = (tuple(trainer.mesh.shape.items()), trainer.optimizer, seed)
    if key not in _INITIAL_STATES:
        state = trainer.init_state(jax.random.PRNGKey(seed), batch)
        _INITIAL_STATES[key] = jax.tree.map(np.asarray, state)
    if trainer.state_shardings is None:
        trainer.abstract_state(batch)
    return jax.device_put(_INITIAL_STATES[key], trainer.state_shardings)


def run_steps(trainer, batch, steps, seed=0):
    state = initial_state(trainer, batch, seed)
    global_batch = partitioning.host_batch_to_global(batch, trainer.batch_sharding)
    history = []
    for _ in range(steps):
        state, metrics = trainer.train_step(state, global_batch, jax.random.PRNGKey(123))
        history.append({k: float(v) for k, v in metrics.items()})
    params = jax.tree.map(np.asarray, state.params)
    return params, history, int(state.step)


def assert_trees_close(a, b, rtol, atol):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


@pytest.fixture(scope="module")
def one_device_adamw_run():
    """3 AdamW steps on one device: the reference of the mesh tests."""
    return run_steps(get_trainer(), make_batch(), 3)


def test_loss_falls_on_a_fixed_batch():
    trainer = get_trainer()
    _, history, step = run_steps(trainer, make_batch(), 30)
    assert step == 30
    losses = [m["loss_sum"] / m["weight_sum"] for m in history]
    assert all(m["weight_sum"] == make_batch()["decoder_loss_weights"].sum() for m in history)
    assert abs(losses[0] - np.log(CFG.vocab_size)) < 0.5  # near-uniform predictions at init
    assert losses[-1] < 0.5 * losses[0], losses
    # The reported learning rate follows the schedule (warmup 0: peak at step 0).
    np.testing.assert_allclose(history[0]["learning_rate"], ADAMW.learning_rate.peak_learning_rate, rtol=1e-6)
    assert history[-1]["learning_rate"] < history[0]["learning_rate"]


def test_first_step_metrics_match_direct_loss():
    """The step's loss_sum/weight_sum equals the model's cross entropy computed here in numpy."""
    trainer = get_trainer(optimizer="sgd")
    batch = make_batch(seed=5)
    state = initial_state(trainer, batch)
    params = jax.tree.map(np.asarray, state.params)
    apply = jax.jit(decoder_only.Decoder(CFG).apply)
    logits = np.asarray(apply({"params": params}, batch["decoder_input_tokens"]), np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    ce = -np.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1)[..., 0]
    weights = batch["decoder_loss_weights"]
    _, metrics = trainer.train_step(state, partitioning.host_batch_to_global(batch, trainer.batch_sharding),
                                    jax.random.PRNGKey(1))
    np.testing.assert_allclose(float(metrics["weight_sum"]), weights.sum())
    np.testing.assert_allclose(float(metrics["loss_sum"]), np.sum(ce * weights), rtol=1e-5)


def test_step_clips_the_gradients_to_the_global_norm():
    """With clip_grad_norm the SGD step moves the params by -lr * the clipped gradient, and
    reports the norm before clipping."""
    batch = make_batch(seed=2)
    trainer = get_trainer(optimizer="clipped_sgd")
    params = jax.tree.map(np.asarray, initial_state(trainer, batch).params)
    new_params, history, _ = run_steps(trainer, batch, 1)

    def loss(p):
        logits = decoder_only.Decoder(CFG).apply({"params": p}, batch["decoder_input_tokens"])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["decoder_target_tokens"])
        return (ce * batch["decoder_loss_weights"]).sum() / batch["decoder_loss_weights"].sum()

    grads = jax.jit(jax.grad(loss))(params)
    norm = float(optax.tree.norm(grads))
    assert norm > 0.05 * 4  # clipping matters
    np.testing.assert_allclose(history[0]["grad_norm"], norm, rtol=1e-4)
    expected = jax.tree.map(lambda p, g: p - 0.5 * g * (0.05 / norm), params, grads)
    assert_trees_close(new_params, expected, rtol=1e-4, atol=1e-6)


def test_a_trainer_must_be_told_whether_to_clip():
    """`build()` leaves the clipping to the train step, so a Trainer made by hand without
    clip_grad_norm would train unclipped: the field has no default."""
    mesh = partitioning.make_mesh(axes=(("data", 1),), devices=jax.devices()[:1])
    with pytest.raises(TypeError, match="clip_grad_norm"):
        trainer_lib.Trainer(model=decoder_only.Decoder(CFG), optimizer=ADAMW.build(total_steps=30),
                            learning_rate_fn=ADAMW.schedule(30), mesh=mesh, rules=partitioning.DEFAULT_RULES)


def test_gradient_accumulation_matches_single_batch():
    batch = make_batch(seed=1)
    params1, hist1, _ = run_steps(get_trainer(optimizer="sgd", microbatches=1), batch, 1)
    params2, hist2, _ = run_steps(get_trainer(optimizer="sgd", microbatches=2), batch, 1)
    for key in ("loss_sum", "weight_sum", "grad_norm"):
        np.testing.assert_allclose(hist2[0][key], hist1[0][key], rtol=1e-5)
    assert_trees_close(params2, params1, rtol=1e-5, atol=1e-6)
    # Sanity: the step actually moved the parameters.
    init = jax.tree.map(np.asarray, initial_state(get_trainer(optimizer="sgd"), batch).params)
    assert not np.allclose(init["logits"]["kernel"], params1["logits"]["kernel"], atol=1e-4)


def test_padding_rows_do_not_change_the_update():
    trainer = get_trainer(optimizer="sgd")
    batch = make_batch(seed=2)
    real = {k: v[:6] for k, v in batch.items()}
    padded = {k: v.copy() for k, v in batch.items()}
    rng = np.random.default_rng(7)
    padded["decoder_loss_weights"][6:] = 0.0
    padded["decoder_input_tokens"][6:] = rng.integers(1, CFG.vocab_size, size=(2, LENGTH))
    padded["decoder_target_tokens"][6:] = rng.integers(1, CFG.vocab_size, size=(2, LENGTH))
    other = {k: v.copy() for k, v in padded.items()}
    other["decoder_input_tokens"][6:] = rng.integers(1, CFG.vocab_size, size=(2, LENGTH))
    other["decoder_target_tokens"][6:] = rng.integers(1, CFG.vocab_size, size=(2, LENGTH))

    params_a, hist_a, _ = run_steps(trainer, padded, 1)
    params_b, hist_b, _ = run_steps(trainer, other, 1)
    params_real, hist_real, _ = run_steps(trainer, real, 1)  # the same real rows, no padding rows
    for key in ("loss_sum", "weight_sum", "grad_norm"):
        np.testing.assert_allclose(hist_b[0][key], hist_a[0][key], rtol=1e-5)
        np.testing.assert_allclose(hist_real[0][key], hist_a[0][key], rtol=1e-5)
    assert_trees_close(params_b, params_a, rtol=1e-5, atol=1e-6)
    assert_trees_close(params_real, params_a, rtol=1e-5, atol=1e-6)


MESHES_8 = {"8x1x1": (("data", 8), ("fsdp", 1), ("tensor", 1)),
            "1x8x1": (("data", 1), ("fsdp", 8), ("tensor", 1)),
            "2x2x2": (("data", 2), ("fsdp", 2), ("tensor", 2))}


@pytest.mark.parametrize("mesh_axes", list(MESHES_8.values()), ids=list(MESHES_8))
def test_multi_device_mesh_matches_one_device(mesh_axes, one_device_adamw_run):
    assert len(jax.devices()) == 8
    trainer = get_trainer(mesh_axes=mesh_axes)
    assert trainer.mesh.devices.size == 8
    batch = make_batch()
    # Initialise directly on the mesh (not copied from the one-device run).
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    assert len(state.params["logits"]["kernel"].sharding.device_set) == 8
    global_batch = partitioning.host_batch_to_global(batch, trainer.batch_sharding)
    history = []
    for _ in range(3):
        state, metrics = trainer.train_step(state, global_batch, jax.random.PRNGKey(123))
        history.append({k: float(v) for k, v in metrics.items()})
    params = jax.tree.map(np.asarray, state.params)
    ref_params, ref_history, _ = one_device_adamw_run
    for got, want in zip(history, ref_history):
        np.testing.assert_allclose(got["loss_sum"] / got["weight_sum"], want["loss_sum"] / want["weight_sum"],
                                   rtol=1e-4)
        np.testing.assert_allclose(got["weight_sum"], want["weight_sum"])
        np.testing.assert_allclose(got["grad_norm"], want["grad_norm"], rtol=1e-4)
    # Training moved the loss, so equal losses at steps 2 and 3 compare the updates too.
    assert history[-1]["loss_sum"] != history[0]["loss_sum"]
    # Adam divides by the gradient's running RMS, which amplifies float reduction-order noise in
    # near-zero gradients; 2e-4 is still far below one step's size (~lr = 1e-2).
    assert_trees_close(params, ref_params, rtol=1e-4, atol=2e-4)


def test_lowered_train_step_memory_orders_the_remat_policies():
    """lower_train_step allocates nothing, and its compiled memory analysis sees the remat policy."""
    import dataclasses

    batch = make_batch()

    def temp_bytes(policy):
        cfg = dataclasses.replace(CFG, remat_policy=policy, num_layers=4)
        mesh = partitioning.make_mesh(axes=(("data", 1),), devices=jax.devices()[:1])
        trainer = trainer_lib.Trainer(model=decoder_only.Decoder(cfg), optimizer=optax.sgd(0.1),
                                      learning_rate_fn=lambda step: 0.1, mesh=mesh, rules=partitioning.DEFAULT_RULES,
                                      clip_grad_norm=None)
        compiled = trainer.lower_train_step(batch).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    none, minimal, save_dots, full = (temp_bytes(p) for p in ("none", "minimal", "save_dots", "full"))
    assert 0 < full < minimal <= save_dots < none  # minimal saves the projections that full recomputes
