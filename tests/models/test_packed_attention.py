"""Packed rows on cuDNN's packed layout (models/packed_attention.py): the segments' offsets and
lengths describe the same attention pattern as the dense mask, and the decoder that passes them
computes what the dense mask computes. cuDNN's kernel runs only on GPUs; here its call is replaced
by the XLA math over a mask rebuilt from the offsets and lengths it receives, so everything up to
the kernel runs (the kernel itself: bench/NOTES.md, GPU section, checked against XLA there)."""

import dataclasses
import functools
import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x_lite.errors import ConfigValueError, TaskDataError
from t5x_lite.models import decoder_only, layers, masks, packed_attention
from t5x_lite.parallel import partitioning
from t5x_lite.training import trainer as trainer_lib

ROWS = np.asarray([
    [1, 1, 1, 2, 2, 3, 0, 0],  # three segments and a padding tail
    [4, 4, 4, 4, 4, 4, 4, 4],  # one segment filling the row
    [1, 2, 3, 4, 5, 6, 7, 8],  # eight one-token segments
    [1, 1, 2, 2, 1, 1, 0, 0],  # an id used twice: two runs
], np.int32)


def _mask_from_runs(offsets, lengths, length):
    """[batch, length, length] bool: causal within each (offset, length) run, as cuDNN reads them."""
    t = jnp.arange(length)
    offsets = jnp.asarray(offsets)[:, :-1, None]
    lengths = jnp.asarray(lengths)[:, :, None]
    in_run = (offsets <= t) & (t < offsets + lengths) & (lengths > 0)  # [batch, runs, length]
    same_run = jnp.einsum("bri,brj->bij", in_run.astype(jnp.int32), in_run.astype(jnp.int32)) > 0
    return same_run & jnp.tril(jnp.ones((length, length), bool))


def test_runs_describe_the_dense_mask_of_every_row():
    offsets, lengths, overflow = packed_attention.segment_runs(jnp.asarray(ROWS), max_segments=8)
    np.testing.assert_array_equal(np.asarray(offsets)[0], [0, 3, 5, 6, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(np.asarray(lengths)[0], [3, 2, 1, 2, -1, -1, -1, -1])
    np.testing.assert_array_equal(np.asarray(overflow), [False] * 4)
    # Each run is one contiguous segment, so within it causal over runs equals causal & same segment
    # (the id used twice in row 3 forms two runs: position 4 must not see positions 0-1).
    dense = np.asarray(masks.make_attention_mask(jnp.asarray(ROWS[:3])))[:, 0]
    np.testing.assert_array_equal(np.asarray(_mask_from_runs(offsets, lengths, 8))[:3], dense)
    assert not np.asarray(_mask_from_runs(offsets, lengths, 8))[3, 4, :2].any()


def test_rows_with_more_runs_than_the_layout_holds_are_marked():
    _, lengths, overflow = packed_attention.segment_runs(jnp.asarray(ROWS), max_segments=3)
    np.testing.assert_array_equal(np.asarray(overflow), [True, False, True, True])
    np.testing.assert_array_equal(np.asarray(lengths)[1], [8, -1, -1])


def _xla_on_runs(q, k, v, bias=None, mask=None, *, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale,
                 mask_type):
    """Stands in for cuDNN's kernel: the XLA math over the pattern the offsets and lengths describe."""
    assert mask_type == packed_attention._cudnn.MaskType.CAUSAL and bias is None and mask is None
    assert q_offsets is kv_offsets and q_seqlen is kv_seqlen
    runs = _mask_from_runs(q_offsets, q_seqlen, q.shape[1])[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=runs, scale=scale, implementation="xla")


@pytest.fixture
def xla_for_cudnn(monkeypatch):
    monkeypatch.setattr(packed_attention._cudnn, "dot_product_attention", _xla_on_runs)


CFG = decoder_only.DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64,
                                 num_layers=2, max_len=8, attention_implementation="xla")
PACKED = dataclasses.replace(CFG, attention_implementation="cudnn", cudnn_segments_per_row=4)


@functools.lru_cache(maxsize=None)
def _jitted_logits(cfg):
    module = cfg.make_module()
    positions = jnp.asarray(np.broadcast_to(np.arange(8), ROWS.shape), jnp.int32)
    return jax.jit(lambda params, tokens, segments: module.apply(params, tokens, decoder_positions=positions,
                                                                 decoder_segment_ids=segments))


def _logits(cfg, params, tokens, segments=ROWS):
    return np.asarray(_jitted_logits(cfg)(params, tokens, jnp.asarray(segments)))


TOKENS = jnp.asarray(np.random.default_rng(0).integers(1, 64, size=ROWS.shape), jnp.int32)


def test_the_decoder_on_the_packed_layout_computes_what_the_dense_mask_computes(xla_for_cudnn):
    params = CFG.make_module().init(jax.random.PRNGKey(0), TOKENS)
    packed_8 = dataclasses.replace(PACKED, cudnn_segments_per_row=8)  # every row of ROWS fits
    dense, packed = _logits(CFG, params, TOKENS), _logits(packed_8, params, TOKENS)
    # Rows 0-2 as packing writes them; row 3 repeats an id after another, which the dense mask joins
    # into one segment and the packed layout keeps as two runs (docs/models.md).
    np.testing.assert_allclose(packed[:3], dense[:3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(packed[3, 4:6], dense[3, 4:6], atol=1e-3)
    # Segment 2 of row 0 starts at position 3: its logits ignore the tokens before it.
    moved = _logits(packed_8, params, TOKENS.at[0, :3].set(5))
    np.testing.assert_allclose(moved[0, 3:6], packed[0, 3:6], rtol=1e-5, atol=1e-5)


def test_a_row_with_too_many_segments_comes_out_nan_and_the_others_do_not(xla_for_cudnn):
    params = CFG.make_module().init(jax.random.PRNGKey(0), TOKENS)
    logits = _logits(PACKED, params, TOKENS)  # rows of 3 + padding, 1, 8 and 4 runs; 4 laid out
    np.testing.assert_array_equal(np.isnan(logits).all(axis=(1, 2)), [False, False, True, False])
    assert not np.isnan(logits[[0, 1, 3]]).any()


def test_segment_ids_outside_the_packed_layout_are_refused():
    attention = layers.Attention(num_heads=2, num_kv_heads=2, head_dim=8, implementation="xla", is_causal=True,
                                 cudnn_segments_per_row=4)
    x = jnp.ones((1, 8, 16))
    with pytest.raises(ValueError, match="packed layout"):
        attention.init(jax.random.PRNGKey(0), x, x, None, segment_ids=jnp.ones((1, 8), jnp.int32))


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_bad_segments_per_row_are_refused(value):
    with pytest.raises(ConfigValueError, match="cudnn_segments_per_row"):
        dataclasses.replace(CFG, cudnn_segments_per_row=value)


def test_a_checkpoint_fits_a_config_that_only_changes_the_segments_per_row():
    from t5x_lite.checkpoints.compatibility import CheckpointMismatchError, check_compatible

    def described(cfg):
        return {"family": cfg.family, "model": json.loads(json.dumps(cfg.to_dict()))}

    check_compatible(described(CFG), described(dataclasses.replace(CFG, cudnn_segments_per_row=16)),
                     model_dir="/nowhere")  # no parameter changes
    with pytest.raises(CheckpointMismatchError, match="mlp_dim"):
        check_compatible(described(CFG), described(dataclasses.replace(CFG, mlp_dim=32)), model_dir="/nowhere")


def test_a_batch_with_a_row_the_layout_cannot_hold_is_refused_on_the_host_before_any_step():
    with pytest.raises(TaskDataError, match="holds 8 segments.*cudnn_segments_per_row=4.*at least 8"):
        packed_attention.check_rows(ROWS, max_segments=4)
    packed_attention.check_rows(ROWS, max_segments=8)  # eight one-token segments fit eight
    batch = {"decoder_input_tokens": np.ones_like(ROWS), "decoder_segment_ids": ROWS}
    CFG.check_batch(batch)  # the dense mask holds any packing
    PACKED.check_batch({**batch, "decoder_segment_ids": ROWS[:2]})
    PACKED.check_batch({**batch, "decoder_causal_attention": np.ones_like(ROWS)})  # a prefix LM: the dense mask
    mesh = partitioning.make_mesh(axes=(("data", 1),), devices=jax.devices()[:1])
    trainer = trainer_lib.Trainer(model=PACKED.make_module(), optimizer=optax.sgd(0.1), learning_rate_fn=lambda _: 0.1,
                                  mesh=mesh, rules=partitioning.DEFAULT_RULES, clip_grad_norm=None)
    with pytest.raises(TaskDataError, match="holds 8 segments"):
        trainer.place_batch(batch)  # what the train loop and its validation pass call


def test_the_private_jax_function_still_takes_the_packed_layout():
    """packed_attention.py is the one user of a private JAX module: a JAX upgrade that changes it
    fails here, on CPU, rather than on a user's GPU."""
    parameters = inspect.signature(packed_attention._cudnn.dot_product_attention).parameters
    assert {"q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "scale", "mask_type"} <= set(parameters)
    assert packed_attention._cudnn.MaskType.CAUSAL is not None
