"""Parallelism: an encoder-decoder on 8-device meshes, the gin/mesh rule tables, mesh helpers."""

from __future__ import annotations

import gin
import jax
import numpy as np
import pytest

from t5x_lite.config import parsing as config_lib
from t5x_lite.models import decoder_only, encoder_decoder
from t5x_lite.parallel import partitioning
from t5x_lite.training import trainer as trainer_lib
from t5x_lite.training.optim import Adafactor, AdamW, WarmupCosine

T5_CFG = encoder_decoder.T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                                  num_encoder_layers=2, num_decoder_layers=2)
BATCH, INPUTS_LENGTH, TARGETS_LENGTH = 8, 12, 8
ADAMW = AdamW(learning_rate=WarmupCosine(peak_learning_rate=1e-2, warmup_steps=0, decay_steps=30,
                                         final_learning_rate_fraction=0.1), weight_decay=0.01, clip_grad_norm=1.0)
ADAFACTOR = Adafactor(min_dim_size_to_factor=16)  # the tiny T5's 32-wide kernels factored
ONE_DEVICE = (("data", 1), ("fsdp", 1), ("tensor", 1))
MESHES_8 = {"8x1x1": (("data", 8), ("fsdp", 1), ("tensor", 1)),
            "1x8x1": (("data", 1), ("fsdp", 8), ("tensor", 1)),
            "2x2x2": (("data", 2), ("fsdp", 2), ("tensor", 2))}


def make_enc_dec_batch(seed=0):
    """A fixed random batch with uneven padding of both the inputs and the targets."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(2, T5_CFG.vocab_size, size=(BATCH, INPUTS_LENGTH)).astype(np.int32)
    for row, real in enumerate([3, 12, 7, 12, 5, 9, 12, 10]):
        inputs[row, real:] = 0
    targets = rng.integers(2, T5_CFG.vocab_size, size=(BATCH, TARGETS_LENGTH)).astype(np.int32)
    weights = np.ones((BATCH, TARGETS_LENGTH), np.float32)
    for row, real in enumerate([2, 8, 5, 8, 3, 6, 8, 4]):
        targets[row, real:] = 0
        weights[row, real:] = 0.0
    decoder_inputs = np.zeros_like(targets)
    decoder_inputs[:, 1:] = targets[:, :-1]  # shifted right, BOS = 0
    return {"encoder_input_tokens": inputs, "decoder_input_tokens": decoder_inputs,
            "decoder_target_tokens": targets, "decoder_loss_weights": weights}


def t5_trainer(mesh_axes, optimizer=ADAMW):
    devices = jax.devices()[: int(np.prod([s for _, s in mesh_axes]))]
    mesh = partitioning.make_mesh(axes=mesh_axes, devices=devices)
    return trainer_lib.Trainer.for_run(model=T5_CFG, optimizer=optimizer, total_steps=30, mesh=mesh,
                                       rules=partitioning.DEFAULT_RULES)


def run_t5_steps(mesh_axes, steps=3, optimizer=ADAMW):
    trainer = t5_trainer(mesh_axes, optimizer)
    batch = make_enc_dec_batch()
    # Each mesh initialises its own state from the same seed, directly in its shardings.
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    global_batch = partitioning.host_batch_to_global(batch, trainer.batch_sharding)
    history = []
    for _ in range(steps):
        state, metrics = trainer.train_step(state, global_batch, jax.random.PRNGKey(123))
        history.append({k: float(v) for k, v in metrics.items()})
    return trainer, state, jax.tree.map(np.asarray, state.params), history


@pytest.fixture(scope="module")
def t5_one_device_run():
    """3 AdamW steps of the tiny T5 on one device: the reference of the mesh tests."""
    _, _, params, history = run_t5_steps(ONE_DEVICE)
    return params, history


@pytest.fixture(scope="module")
def t5_one_device_adafactor_run():
    """The same with Adafactor (factored per layer matrix): the reference of its mesh test."""
    _, _, params, history = run_t5_steps(ONE_DEVICE, optimizer=ADAFACTOR)
    return params, history


def test_t5_one_device_run_learns(t5_one_device_run):
    params, history = t5_one_device_run
    batch = make_enc_dec_batch()
    losses = [m["loss_sum"] / m["weight_sum"] for m in history]
    assert all(m["weight_sum"] == batch["decoder_loss_weights"].sum() for m in history)
    assert abs(losses[0] - np.log(T5_CFG.vocab_size)) < 0.5  # near-uniform predictions at init
    assert losses[-1] < losses[0], losses
    assert all(np.isfinite(m["grad_norm"]) and m["grad_norm"] > 0 for m in history)
    # The shared embedding, encoder, decoder and untied logits all exist and are float32.
    assert {"token_embed", "encoder", "decoder"} <= set(params)
    assert params["decoder"]["logits"]["kernel"].shape == (T5_CFG.emb_dim, T5_CFG.vocab_size)


# AdamW on every mesh; Adafactor (its factored statistics split by fsdp and tensor) on the mesh with both.
MESH_CASES = {**{name: (axes, "adamw") for name, axes in MESHES_8.items()},
              "2x2x2-adafactor": (MESHES_8["2x2x2"], "adafactor")}


@pytest.mark.parametrize("mesh_axes, optimizer", list(MESH_CASES.values()), ids=list(MESH_CASES))
def test_t5_mesh_matches_one_device(mesh_axes, optimizer, request):
    assert len(jax.devices()) == 8
    reference = request.getfixturevalue({"adamw": "t5_one_device_run", "adafactor": "t5_one_device_adafactor_run"}[
        optimizer])
    trainer, state, params, history = run_t5_steps(mesh_axes, optimizer={"adamw": ADAMW, "adafactor": ADAFACTOR}[
        optimizer])
    assert trainer.mesh.devices.size == 8
    # The state really lives on all 8 devices.
    kernel = state.params["decoder"]["logits"]["kernel"]
    assert len(kernel.sharding.device_set) == 8
    mesh = dict(trainer.mesh.shape)
    if mesh["fsdp"] > 1 or mesh["tensor"] > 1:
        # [embed, vocab] is split by fsdp x tensor: each device holds a 1/(fsdp*tensor) block.
        shard = kernel.addressable_shards[0].data.shape
        assert shard == (T5_CFG.emb_dim // mesh["fsdp"], T5_CFG.vocab_size // mesh["tensor"])
    else:
        assert kernel.sharding.is_fully_replicated

    ref_params, ref_history = reference
    for got, want in zip(history, ref_history, strict=True):
        np.testing.assert_allclose(got["loss_sum"] / got["weight_sum"], want["loss_sum"] / want["weight_sum"],
                                   rtol=1e-4)
        np.testing.assert_allclose(got["weight_sum"], want["weight_sum"])
        np.testing.assert_allclose(got["grad_norm"], want["grad_norm"], rtol=1e-4)
    assert history[-1]["loss_sum"] != history[0]["loss_sum"]
    # As in tests/training/test_trainer.py: Adam amplifies reduction-order noise of near-zero gradients.
    assert jax.tree.structure(params) == jax.tree.structure(ref_params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=2e-4), params, ref_params)


# --- The rule tables of gin/mesh/*.gin ---------------------------------------------------------

DECODER_CFG = decoder_only.DecoderConfig(vocab_size=256, emb_dim=64, num_heads=4, num_kv_heads=2, head_dim=16,
                                         mlp_dim=128, num_layers=2, max_len=16)


def mesh_file_values(name: str):
    """(MESH_AXES, LOGICAL_AXIS_RULES) bound by gin/mesh/<name>.gin."""
    try:
        config_lib.parse(gin_files=[f"mesh/{name}.gin"])
        return gin.query_parameter("%MESH_AXES"), gin.query_parameter("%LOGICAL_AXIS_RULES")
    finally:
        gin.clear_config()


def state_bytes(state):
    """(bytes of the whole state, bytes each device holds) over params + optimizer state."""
    total, per_device = 0, {d: 0 for d in jax.devices()}
    for leaf in jax.tree.leaves((state.params, state.opt_state)):
        total += leaf.nbytes
        for shard in leaf.addressable_shards:
            per_device[shard.device] += shard.data.nbytes
    return total, per_device


def test_default_rules_are_the_fsdp_file():
    _, rules = mesh_file_values("fsdp")
    assert [tuple(rule) for rule in rules] == list(partitioning.DEFAULT_RULES)


@pytest.mark.parametrize("name, mesh_shape, max_fraction, min_fraction", [
    ("data_parallel", {"replica": 1, "data": 8, "fsdp": 1, "tensor": 1}, 1.0, 1.0),
    ("fsdp", {"replica": 1, "data": 1, "fsdp": 8, "tensor": 1}, 0.14, 0.125),
    ("fsdp_tensor", {"replica": 1, "data": 1, "fsdp": 4, "tensor": 2}, 0.14, 0.125),
])
def test_mesh_file_state_bytes_per_device(name, mesh_shape, max_fraction, min_fraction):
    mesh_axes, rules = mesh_file_values(name)
    # Every logical axis the models use has a rule.
    assert {logical for logical, _ in rules} >= {"batch", "embed", "heads", "kv_heads", "kv", "mlp", "vocab",
                                                  "length", "layers", "relpos_buckets", "positions"}
    mesh = partitioning.make_mesh(axes=mesh_axes)
    assert dict(mesh.shape) == mesh_shape
    optimizer = ADAMW.build(10)
    trainer = trainer_lib.Trainer(model=decoder_only.Decoder(DECODER_CFG), optimizer=optimizer,
                                  learning_rate_fn=ADAMW.schedule(10), mesh=mesh, rules=rules,
                                  clip_grad_norm=ADAMW.clip_grad_norm)
    example = {"decoder_input_tokens": np.zeros((8, 16), np.int32)}
    state = trainer.init_state(jax.random.PRNGKey(0), example)
    total, per_device = state_bytes(state)
    # params + Adam's two moments (float32), plus a few scalar counters.
    assert 3 * 4 * DECODER_CFG.num_params() <= total < 3 * 4 * DECODER_CFG.num_params() + 1024
    for device, held in per_device.items():
        assert min_fraction * total <= held <= max_fraction * total, (name, device, held / total)
    # The query kernel [layers, embed, heads, kv]: embed split by fsdp, heads by tensor.
    query = state.params["layers"]["attention"]["query"]["kernel"]
    assert query.addressable_shards[0].data.shape == (
        DECODER_CFG.num_layers, DECODER_CFG.emb_dim // mesh_shape["fsdp"],
        DECODER_CFG.num_heads // mesh_shape["tensor"], DECODER_CFG.head_dim)
    # The batch is split over the data-parallel axes (not over `tensor`, whose devices share rows).
    assert partitioning.num_batch_shards(mesh, trainer.rules) == 8 // mesh_shape["tensor"]


# --- Pure helpers ------------------------------------------------------------------------------

AXES = {"replica": 1, "data": 4, "fsdp": 2, "tensor": 2}


def test_split_over_granules_takes_hosts_from_the_outer_axes():
    assert partitioning.split_over_granules(AXES, 1) == [1, 1, 1, 1]
    assert partitioning.split_over_granules(AXES, 2) == [1, 2, 1, 1]
    assert partitioning.split_over_granules(AXES, 4) == [1, 4, 1, 1]
    assert partitioning.split_over_granules(AXES, 8) == [1, 4, 2, 1]
    assert partitioning.split_over_granules({"replica": 2, "data": 4, "fsdp": 1, "tensor": 8}, 4) == [2, 2, 1, 1]
    assert partitioning.split_over_granules({"replica": 3, "data": 2, "fsdp": 1, "tensor": 1}, 6) == [3, 2, 1, 1]


def test_split_over_granules_keeps_tensor_inside_a_host():
    with pytest.raises(ValueError, match="split the `tensor` axis"):
        partitioning.split_over_granules(AXES, 16)
    with pytest.raises(ValueError, match="split the `tensor` axis"):
        partitioning.split_over_granules({"data": 1, "fsdp": 1, "tensor": 8}, 2)


def test_split_over_granules_fails_when_hosts_do_not_divide():
    with pytest.raises(ValueError, match="cannot be laid over 3 hosts"):
        partitioning.split_over_granules(AXES, 3)
    with pytest.raises(ValueError, match="cannot be laid over 32 hosts"):
        partitioning.split_over_granules(AXES, 32)


def test_rules_for_mesh_drops_missing_mesh_axes():
    mesh = partitioning.make_mesh(axes=(("data", 4), ("tensor", 2)))
    rules = (("batch", ("replica", "data", "fsdp")), ("vocab", "tensor"), ("embed", "fsdp"),
             ("mlp", ("fsdp", "tensor")), ("other", ("replica", "fsdp")), ("length", None))
    assert partitioning.rules_for_mesh(rules, mesh) == (
        ("batch", ("data",)), ("vocab", "tensor"), ("embed", None), ("mlp", ("tensor",)), ("other", None),
        ("length", None))
    # A mesh with every axis keeps the table as it is.
    full = partitioning.make_mesh(axes=(("replica", 1), ("data", 2), ("fsdp", 2), ("tensor", 2)))
    assert partitioning.rules_for_mesh(partitioning.DEFAULT_RULES, full) == partitioning.DEFAULT_RULES
    # The dropped rules resolve to usable specs on the smaller mesh.
    kept = partitioning.rules_for_mesh(partitioning.DEFAULT_RULES, mesh)
    assert partitioning.num_batch_shards(mesh, kept) == 4
    assert partitioning.logical_to_mesh_spec(("embed", "vocab"), kept) == jax.sharding.PartitionSpec(None, "tensor")


def test_make_mesh_sizes():
    mesh = partitioning.make_mesh(axes=(("data", -1), ("fsdp", 2), ("tensor", 2)))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert mesh.devices.size == 8 and len(set(mesh.devices.flat)) == 8
    mesh = partitioning.make_mesh(axes={"data": 1, "fsdp": -1})
    assert dict(mesh.shape) == {"data": 1, "fsdp": 8}
    mesh = partitioning.make_mesh(axes=(("data", 2), ("tensor", -1)), devices=jax.devices()[:4])
    assert dict(mesh.shape) == {"data": 2, "tensor": 2}


def test_make_mesh_errors():
    with pytest.raises(ValueError, match="at most one axis may have size -1"):
        partitioning.make_mesh(axes=(("data", -1), ("fsdp", -1)))
    with pytest.raises(ValueError, match="need 4 devices but 8 are available"):
        partitioning.make_mesh(axes=(("data", 2), ("fsdp", 2), ("tensor", 1)))
    with pytest.raises(ValueError, match="need 16 devices but 8 are available"):
        partitioning.make_mesh(axes=(("data", 8), ("tensor", 2)))
    with pytest.raises(ValueError, match="do not divide the 8 devices"):
        partitioning.make_mesh(axes=(("data", -1), ("tensor", 3)))
