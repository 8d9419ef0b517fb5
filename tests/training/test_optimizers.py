"""Optimizers and schedules chosen in gin: the schedules' math against closed forms, their checks,
Adafactor per layer (scanned == unrolled, factored by logical axes), t5x's T5 recipe from
gin/optimizers/, exact resume with Adafactor, and its state's size."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.config import resolve as config_resolve
from t5x_lite.estimate import memory as estimate_memory
from t5x_lite.estimate import run_from_gin
from t5x_lite.models import decoder_only
from t5x_lite.parallel import partitioning
from t5x_lite.training import adafactor, optim, schedules
from t5x_lite.training import trainer as trainer_lib
from tests.param_trees import unrolled_params
from tests.training.test_run_values import refused, spec
from tests.training.test_trainer import CFG, make_batch

ONE_DEVICE = (("data", 1), ("fsdp", 1), ("tensor", 1))
T5_RECIPE = ["runs/t5_quickstart.gin", "optimizers/adafactor_t5.gin"]


def _values(schedule, steps):
    return [float(schedule(s)) for s in steps]


# -- schedules: pure functions of the step ----------------------------------------------------------


def test_rsqrt_is_t5x_constant_times_rsqrt_decay():
    lr = schedules.RsqrtDecay().build(total_steps=123)  # t5x's defaults: base 1.0, 10,000 warmup steps
    np.testing.assert_allclose(_values(lr, [0, 1, 5000, 9999, 10_000]), 0.01, rtol=1e-6)
    np.testing.assert_allclose(_values(lr, [40_000, 1_000_000]), [1 / 200, 1 / 1000], rtol=1e-6)
    small = schedules.RsqrtDecay(base_learning_rate=0.5, warmup_steps=4).build(10)
    np.testing.assert_allclose(_values(small, [0, 4, 9, 16]), [0.25, 0.25, 0.5 / 3, 0.125], rtol=1e-6)


def test_constant_with_and_without_warmup():
    np.testing.assert_allclose(_values(schedules.Constant(0.5, warmup_steps=4).build(10), [0, 1, 2, 4, 99]),
                               [0, 0.125, 0.25, 0.5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(_values(schedules.Constant(0.5).build(10), [0, 7]), [0.5, 0.5], rtol=1e-6)


def test_warmup_linear_decays_along_a_line_to_the_final_fraction():
    peak, final = 2e-3, 0.1 * 2e-3
    lr = schedules.WarmupLinear(peak_learning_rate=peak, warmup_steps=10, final_learning_rate_fraction=0.1).build(50)
    np.testing.assert_allclose(_values(lr, [0, 5, 10]), [0, peak / 2, peak], rtol=1e-6)
    # decay_steps None: over the rest of the run, 40 steps.
    np.testing.assert_allclose(_values(lr, [20, 30, 40]), [peak + (final - peak) * k / 4 for k in (1, 2, 3)],
                               rtol=1e-5)
    np.testing.assert_allclose(_values(lr, [50, 51, 10_000]), final, rtol=1e-5)


@pytest.mark.parametrize("shape", schedules.DECAY_SHAPES)
def test_warmup_stable_decay_closed_form(shape):
    wsd = schedules.WarmupStableDecay(peak_learning_rate=1.0, warmup_steps=10, decay_fraction=0.2,
                                      final_learning_rate_fraction=0.1, decay_shape=shape)
    assert wsd.phases(100) == (80, 20)  # the decay takes the run's last 20 steps
    lr = wsd.build(100)
    np.testing.assert_allclose(_values(lr, [0, 5]), [0, 0.5], rtol=1e-6)
    np.testing.assert_allclose(_values(lr, [10, 40, 79, 80]), 1.0, rtol=1e-6)
    fraction = 5 / 20
    expected = (1 - 0.9 * fraction if shape == "linear" else 0.1 + 0.45 * (1 + math.cos(math.pi * fraction)))
    np.testing.assert_allclose(float(lr(85)), expected, rtol=1e-5)
    np.testing.assert_allclose(_values(lr, [100, 500]), 0.1, rtol=1e-5)
    # A decay that would reach into the warmup starts after it, and still ends with the run.
    assert schedules.WarmupStableDecay(warmup_steps=90, decay_fraction=0.2).phases(100) == (90, 10)


@pytest.mark.parametrize("schedule", [schedules.WarmupCosine(warmup_steps=3), schedules.WarmupLinear(warmup_steps=3),
                                      schedules.RsqrtDecay(warmup_steps=3), schedules.Constant(warmup_steps=3),
                                      schedules.WarmupStableDecay(warmup_steps=3)],
                         ids=lambda s: type(s).__name__)
def test_every_schedule_runs_traced_as_in_the_step(schedule):
    lr = schedule.build(total_steps=20)
    traced = jax.jit(jax.vmap(lr))(jnp.arange(25))
    np.testing.assert_allclose(np.asarray(traced), _values(lr, range(25)), rtol=1e-6)
    assert np.all(np.asarray(traced) >= 0) and float(traced[3]) > 0


# -- values checked up front ------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer, message", [
    (optim.Adafactor(learning_rate=schedules.RsqrtDecay(warmup_steps=0)),
     "RsqrtDecay.warmup_steps=0 must be a positive integer"),
    (optim.AdamW(learning_rate=schedules.WarmupLinear(warmup_steps=-3)),
     "WarmupLinear.warmup_steps=-3 must be an integer >= 0"),
    (optim.Adafactor(learning_rate=schedules.Constant(learning_rate=0.0)),
     "Constant.learning_rate=0.0 must be a number > 0"),
    (optim.AdamW(learning_rate=schedules.WarmupStableDecay(decay_shape="exponential")),
     "WarmupStableDecay.decay_shape='exponential' must be one of 'linear', 'cosine'"),
    (optim.AdamW(learning_rate=schedules.WarmupStableDecay(decay_fraction=1.5)),
     "WarmupStableDecay.decay_fraction=1.5 must be a number in [0, 1]"),
    (optim.Adafactor(learning_rate=0.01), "Adafactor.learning_rate=0.01 must be a schedule: @WarmupCosine(), "),
    (optim.Adafactor(momentum=1.0), "Adafactor.momentum=1.0 must be a number in [0, 1) or None"),
    (optim.Adafactor(min_dim_size_to_factor=0), "Adafactor.min_dim_size_to_factor=0 must be a positive integer"),
    (optim.Adafactor(multiply_by_parameter_scale="yes"), "Adafactor.multiply_by_parameter_scale='yes' must be True"),
    ("adam", "train.optimizer='adam' must be @AdamW() or @Adafactor()"),
])
def test_bad_optimizer_and_schedule_values_are_named(optimizer, message):
    assert message in refused(spec(optimizer=optimizer))


def test_adafactor_refuses_to_build_without_the_logical_axes():
    with pytest.raises(ValueError, match="logical axes"):
        optim.Adafactor().build(10)


# -- Adafactor: which dims, which layers --------------------------------------------------------------


@pytest.mark.parametrize("axes, shape, view", [
    (("layers", "embed", "heads", "kv"), (2, 32, 4, 8), (0, 1, True)),  # query: [embed] x [heads*kv], per layer
    (("layers", "heads", "kv", "embed"), (2, 4, 8, 32), (0, 2, True)),  # output: [heads*kv] x [embed]
    (("embed", "mlp"), (32, 64), (None, 1, True)),
    (("layers", "mlp", "embed"), (3, 64, 32), (0, 1, True)),
    (("vocab", "embed"), (64, 32), (None, 1, True)),
    (("embed", "mlp"), (32, 8), (None, 1, False)),  # a side under min_dim_size_to_factor (16)
    (("layers", "embed"), (2, 32), (0, None, False)),  # a stacked norm scale: a vector per layer
    (("heads", "relpos_buckets"), (4, 32), (None, None, False)),  # no embed axis: not factored, as in t5x
])
def test_matrix_view_follows_the_logical_axes(axes, shape, view):
    got = adafactor.matrix_view(axes, shape, factored=True, min_dim_size_to_factor=16)
    assert (got.layer_axis, got.split, got.factored) == view
    assert not adafactor.matrix_view(axes, shape, factored=False, min_dim_size_to_factor=16).factored


def _steps(tx, params, grads_per_step):
    state, update = tx.init(params), jax.jit(tx.update)
    for grads in grads_per_step:
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def _random(key, shapes, scales=None):
    keys = jax.random.split(key, len(shapes))
    return {name: jax.random.normal(k, shape) * (scales or {}).get(name, 1.0)
            for k, (name, shape) in zip(keys, shapes.items())}


def test_a_matrix_gets_optax_adafactor_on_the_matrix_it_applies():
    """A 2-D kernel gets optax.adafactor itself; a [heads, kv, embed] kernel optax.adafactor of the
    [heads*kv, embed] matrix (t5x's factoring), not of its two largest dims."""
    shapes = {"wi": (32, 48), "out": (4, 32, 32)}
    axes = {"wi": P("embed", "mlp"), "out": P("heads", "kv", "embed")}
    params = _random(jax.random.PRNGKey(0), shapes)
    grads = [_random(jax.random.PRNGKey(i), shapes) for i in range(1, 4)]
    lr = schedules.Constant(0.01).build(10)
    ours, state = _steps(adafactor.layerwise_adafactor(axes, learning_rate=lr, min_dim_size_to_factor=16), params,
                         grads)
    reference = optax.adafactor(learning_rate=lr, min_dim_size_to_factor=16)
    flat = {"wi": params["wi"], "out": params["out"].reshape(128, 32)}
    expected, _ = _steps(reference, flat, [{"wi": g["wi"], "out": g["out"].reshape(128, 32)} for g in grads])
    np.testing.assert_allclose(ours["wi"], expected["wi"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ours["out"], expected["out"].reshape(4, 32, 32), rtol=1e-6, atol=1e-7)
    factored = state.per_param["out"][0]
    assert {factored.v_row.shape, factored.v_col.shape} == {(128,), (32,)} and factored.v.shape == (1,)
    # optax alone factors [4, 32, 32] over its two largest dims, keeping statistics per head.
    naive_state = reference.init(params)[0]
    assert naive_state.v_row["out"].shape == (4, 32)


def test_stacked_layers_update_like_separate_layers():
    """A stacked [layers, ...] leaf trains exactly as the same layers as separate leaves: factors,
    update clipping and parameter scale per layer. optax.adafactor on the stack does not."""
    num_layers = 3
    shapes = {"query": (num_layers, 32, 4, 8), "scale": (num_layers, 32)}
    axes = {"query": P("layers", "embed", "heads", "kv"), "scale": P("layers", "embed")}
    # Layers of very different sizes, so a statistic shared by the stack shows.
    scales = {"query": jnp.array([0.02, 1.0, 30.0])[:, None, None, None], "scale": jnp.array([0.1, 1.0, 10.0])[:, None]}
    params = _random(jax.random.PRNGKey(0), shapes, scales)
    grads = [_random(jax.random.PRNGKey(i), shapes, scales) for i in range(1, 5)]

    def unstack(tree):
        return {f"{name}_{i}": x[i] for name, x in tree.items() for i in range(num_layers)}

    unstacked_axes = {f"{name}_{i}": P(*axes[name][1:]) for name in shapes for i in range(num_layers)}
    lr = schedules.Constant(0.05).build(10)
    stacked, state = _steps(adafactor.layerwise_adafactor(axes, learning_rate=lr, min_dim_size_to_factor=16),
                            params, grads)
    separate, _ = _steps(adafactor.layerwise_adafactor(unstacked_axes, learning_rate=lr, min_dim_size_to_factor=16),
                         unstack(params), [unstack(g) for g in grads])
    for name, value in unstack(stacked).items():
        np.testing.assert_allclose(value, separate[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert state.per_param["query"][0].v_row.shape == (num_layers, 32)  # one row vector per layer
    assert state.per_param["query"][0].count.shape == ()  # counters are not per layer
    naive, _ = _steps(optax.adafactor(learning_rate=lr, min_dim_size_to_factor=16), params, grads)
    assert not np.allclose(unstack(naive)["query_0"], separate["query_0"], rtol=1e-3)


# -- a real model: scanned == unrolled, exact resume ---------------------------------------------------

DECODER_ADAFACTOR = optim.Adafactor(min_dim_size_to_factor=16)  # factor the tiny (32-wide) kernels


def _trainer(model_config, optimizer=DECODER_ADAFACTOR, total_steps=30):
    mesh = partitioning.make_mesh(axes=ONE_DEVICE, devices=jax.devices()[:1])
    return trainer_lib.Trainer.for_run(model=model_config, optimizer=optimizer, total_steps=total_steps, mesh=mesh,
                                       rules=partitioning.DEFAULT_RULES)


def _start(trainer, params, batch):
    """A train state from these params, the optimizer's fresh state, in the trainer's shardings."""
    trainer.abstract_state(batch)
    state = trainer_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                   opt_state=jax.jit(trainer.optimizer.init)(params))
    return jax.device_put(state, trainer.state_shardings)


def _train(trainer, state, batch, steps):
    global_batch = partitioning.host_batch_to_global(batch, trainer.batch_sharding)
    losses = []
    for _ in range(steps):
        state, metrics = trainer.train_step(state, global_batch, jax.random.PRNGKey(1))
        losses.append(float(metrics["loss_sum"] / metrics["weight_sum"]))
    return state, losses


@pytest.fixture(scope="module")
def scanned_decoder():
    """(trainer, initial params) of the tiny scanned decoder with Adafactor."""
    trainer = _trainer(CFG)
    params = jax.tree.map(np.asarray, trainer.init_state(jax.random.PRNGKey(0), make_batch()).params)
    return trainer, params


def test_scanned_and_unrolled_models_get_the_same_updates(scanned_decoder):
    trainer, params = scanned_decoder
    batch = make_batch()
    scanned, scanned_losses = _train(trainer, _start(trainer, params, batch), batch, 3)
    unrolled_trainer = _trainer(decoder_only.DecoderConfig(**{**CFG.to_dict(), "scan_layers": False}))
    unrolled_start = _start(unrolled_trainer, unrolled_params(params), batch)
    unrolled, unrolled_losses = _train(unrolled_trainer, unrolled_start, batch, 3)
    np.testing.assert_allclose(scanned_losses, unrolled_losses, rtol=1e-5)
    assert scanned_losses[-1] < scanned_losses[0]
    got, want = jax.tree.map(np.asarray, unrolled_params(scanned.params)), jax.tree.map(np.asarray, unrolled.params)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), got, want)
    start = jax.tree.leaves(unrolled_params(params))
    moved = max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(want), start))
    assert moved > 1e-3  # the comparison is of real updates
    # The stacked kernels were factored per layer: a row vector per layer, not a full second moment.
    mlp_in = scanned.opt_state.per_param["layers"]["mlp"]["wi_0"]["kernel"][0]
    assert mlp_in.v_row.shape == (CFG.num_layers, CFG.emb_dim) and mlp_in.v.shape == (CFG.num_layers, 1)


def test_adafactor_resume_is_exact(scanned_decoder, tmp_path):
    """Two steps, a checkpoint, a restore into a fresh state and two more steps end bit for bit
    where four steps straight do: Adafactor's factored state is all saved and read back."""
    trainer, params = scanned_decoder
    batch = make_batch(seed=3)
    straight, _ = _train(trainer, _start(trainer, params, batch), batch, 4)
    first, _ = _train(trainer, _start(trainer, params, batch), batch, 2)
    checkpointer = checkpoint_lib.Checkpointer(tmp_path)
    checkpointer.save(2, state=checkpoint_lib.to_saveable(first, jax.random.PRNGKey(7)), iterator_state={},
                      metadata={"family": "decoder_only"})
    checkpointer.close()
    reader = checkpoint_lib.Checkpointer(tmp_path, read_only=True)
    abstract = checkpoint_lib.to_saveable(trainer.abstract_state(batch), jax.random.PRNGKey(0))
    restored, _, _ = reader.restore(2, abstract_state=abstract)
    reader.close()
    restored.pop("dropout_rng")
    resumed, _ = _train(trainer, trainer_lib.TrainState(**restored), batch, 2)
    assert int(resumed.step) == int(straight.step) == 4
    for a, b in zip(jax.tree.leaves((straight.params, straight.opt_state)),
                    jax.tree.leaves((resumed.params, resumed.opt_state)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# -- t5x's T5 recipe from gin ---------------------------------------------------------------------------


def _t5_batch(seed, vocab_size, rows=4, inputs_length=16, targets_length=8):
    rng = np.random.default_rng(seed)
    targets = rng.integers(2, vocab_size, size=(rows, targets_length)).astype(np.int32)
    decoder_inputs = np.zeros_like(targets)
    decoder_inputs[:, 1:] = targets[:, :-1]
    return {"encoder_input_tokens": rng.integers(2, vocab_size, size=(rows, inputs_length)).astype(np.int32),
            "decoder_input_tokens": decoder_inputs, "decoder_target_tokens": targets,
            "decoder_loss_weights": np.ones((rows, targets_length), np.float32)}


def test_t5_tiny_trains_with_t5x_adafactor_recipe():
    """runs/t5_quickstart.gin + optimizers/adafactor_t5.gin: t5x's Adafactor and rsqrt schedule
    (the class defaults, written out) on T5 v1.1 tiny; the loss falls over a few dozen steps."""
    settings = run_from_gin.run_settings(config_resolve.load_run(gin_files=T5_RECIPE, entry="train"))
    assert settings.optimizer == optim.Adafactor()
    assert settings.optimizer.learning_rate == schedules.RsqrtDecay(base_learning_rate=1.0, warmup_steps=10_000)
    model = settings.model
    trainer = _trainer(model, optimizer=settings.optimizer, total_steps=1000)
    batches = [_t5_batch(seed, model.vocab_size) for seed in range(2)]
    state = trainer.init_state(jax.random.PRNGKey(0), batches[0])
    losses = []
    for step in range(30):
        state, step_losses = _train(trainer, state, batches[step % 2], 1)
        losses += step_losses
    assert abs(losses[0] - math.log(model.vocab_size)) < 0.5
    assert np.mean(losses[-4:]) < losses[0] - 1.0, losses  # 8.35 -> 6.8 when written
    # emb_dim 128: every kernel is factored at t5x's min_dim_size_to_factor (128).
    query = state.opt_state.per_param["encoder"]["layers"]["attention"]["query"]["kernel"][0]
    assert query.v_row.shape == (model.num_encoder_layers, model.emb_dim)
    assert query.v_col.shape == (model.num_encoder_layers, model.num_heads * model.head_dim)


# -- the state's size and shardings -----------------------------------------------------------------------

TINY_T5 = ["T5Config.vocab_size=128", "T5Config.emb_dim=32", "T5Config.num_heads=4", "T5Config.head_dim=8",
           "T5Config.mlp_dim=64", "T5Config.relative_attention_num_buckets=32", "Adafactor.min_dim_size_to_factor=16"]


def test_adafactor_state_is_rows_plus_columns_per_matrix():
    """The estimate's optimizer-state bytes for a tiny T5: exactly the closed form below, a few
    percent of AdamW's two moments per parameter."""
    settings = run_from_gin.run_settings(config_resolve.load_run(gin_files=T5_RECIPE, gin_bindings=TINY_T5,
                                                                 entry="train"))
    m = settings.model
    state = estimate_memory.state_bytes_per_device(settings, {"data": 1, "fsdp": 1, "tensor": 1})
    e, hd, mlp, v, le, ld = m.emb_dim, m.num_heads * m.head_dim, m.mlp_dim, m.vocab_size, 2, 2
    # Per layer: q, k, v are [embed] x [heads*kv], out [heads*kv] x [embed]; wi_0, wi_1, wo [embed] x [mlp].
    factored = le * (4 * (e + hd) + 3 * (e + mlp)) + ld * (8 * (e + hd) + 3 * (e + mlp)) + 2 * (v + e)
    # Full second moments: the norm scales and the two relative-position tables.
    full = le * 2 * e + ld * 3 * e + 2 * e + 2 * m.num_heads * m.relative_attention_num_buckets
    # optax's (1,) placeholders: v of each factored matrix, v_row and v_col of each other leaf (per layer).
    placeholders = (7 * le + 11 * ld + 2) + 2 * (2 * le + 3 * ld + 4)
    leaves = 7 + 11 + 2 + 2 + 3 + 4
    assert state["optimizer_state"] == 4 * (factored + full + placeholders) + 2 * 4 * leaves  # two int32 counters
    assert state["optimizer_state"] < 0.05 * 2 * state["params"]
    assert state["optimizer"].startswith("Adafactor")


def test_adafactor_state_is_split_like_the_sides_it_describes():
    """On an fsdp x tensor mesh a stacked query kernel's row statistic is split like embed and its
    column statistic like heads; counters and placeholders are replicated."""
    mesh = partitioning.make_mesh(axes=(("data", 2), ("fsdp", 2), ("tensor", 2)), devices=jax.devices())
    trainer = trainer_lib.Trainer.for_run(model=CFG, optimizer=DECODER_ADAFACTOR, total_steps=10, mesh=mesh,
                                          rules=partitioning.DEFAULT_RULES)
    shardings = trainer.abstract_state(make_batch()).opt_state.per_param
    query = jax.tree.map(lambda x: x.sharding.spec, shardings["layers"]["attention"]["query"]["kernel"][0])
    assert (query.v_row, query.v_col, query.v, query.count) == (P(None, "fsdp"), P(None, "tensor"), P(), P())
    out = jax.tree.map(lambda x: x.sharding.spec, shardings["layers"]["attention"]["out"]["kernel"][0])
    assert {out.v_row, out.v_col} == {P(None, "fsdp"), P(None, "tensor")}
    norm = jax.tree.map(lambda x: x.sharding.spec, shardings["layers"]["attn_norm"]["scale"][0])
    assert norm.v == P(None, "fsdp") and norm.v_row == P()
