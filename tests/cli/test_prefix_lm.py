"""Prefix LM on the decoder-only model: the mask, the model's dependencies, the data config, a whole run."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite.data.task_access import DataConfig
from t5x_lite.errors import ConfigValueError
from t5x_lite.models import DecoderConfig, T5Config, decoder_only, masks
from tests.cli_helpers import TINY_MODEL, losses, run_cli

CFG = decoder_only.DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                                 mlp_dim=64, num_layers=2, max_len=16)


def test_prefix_lm_mask_by_hand():
    # One row, prefix of 3 positions (seqio's decoder_causal_attention), no packing.
    mask = np.asarray(masks.make_prefix_lm_mask(jnp.asarray([[1, 1, 1, 0, 0]])))
    expected = np.array([[1, 1, 1, 0, 0],
                         [1, 1, 1, 0, 0],
                         [1, 1, 1, 0, 0],
                         [1, 1, 1, 1, 0],
                         [1, 1, 1, 1, 1]], bool)
    assert mask.shape == (1, 1, 5, 5) and mask.dtype == np.bool_
    np.testing.assert_array_equal(mask[0, 0], expected)


def test_prefix_lm_mask_packed_by_hand():
    # Two packed examples (prefixes of 2 and 1 positions) and a padding position.
    causal_attention = jnp.asarray([[1, 1, 0, 1, 0, 0]])
    segments = jnp.asarray([[1, 1, 1, 2, 2, 0]])
    mask = np.asarray(masks.make_prefix_lm_mask(causal_attention, segments))
    expected = np.array([[1, 1, 0, 0, 0, 0],
                         [1, 1, 0, 0, 0, 0],
                         [1, 1, 1, 0, 0, 0],
                         [0, 0, 0, 1, 0, 0],
                         [0, 0, 0, 1, 1, 0],
                         [0, 0, 0, 0, 0, 1]], bool)
    np.testing.assert_array_equal(mask[0, 0], expected)
    # Without a prefix it is the causal, segment-separating mask.
    np.testing.assert_array_equal(np.asarray(masks.make_prefix_lm_mask(jnp.zeros_like(segments), segments)),
                                  np.asarray(masks.make_attention_mask(segments)))


@pytest.fixture(scope="module")
def decoder():
    model = decoder_only.Decoder(CFG)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 12), jnp.int32))["params"]
    apply = jax.jit(lambda tokens, **kw: model.apply({"params": params}, tokens, **kw))
    return apply


def _tokens(seed, length=12):
    return jnp.asarray(np.random.default_rng(seed).integers(1, CFG.vocab_size, size=(1, length)), jnp.int32)


def _changed(tokens, position):
    return tokens.at[0, position].set(tokens[0, position] % (CFG.vocab_size - 1) + 1)


def test_prefix_attends_bidirectionally_and_targets_causally(decoder):
    prefix = 5  # positions 0-4 read the prefix (the inputs and the first target position)
    causal_attention = jnp.asarray([[1] * prefix + [0] * 7])
    tokens = _tokens(1)
    base = np.asarray(decoder(tokens, decoder_causal_attention=causal_attention))
    # A later prefix token changes the earlier prefix positions (and every target position).
    later_prefix = np.asarray(decoder(_changed(tokens, 3), decoder_causal_attention=causal_attention))
    assert not np.allclose(base[0, :3], later_prefix[0, :3], atol=1e-4)
    assert not np.allclose(base[0, prefix:], later_prefix[0, prefix:], atol=1e-4)
    # A target token never changes what earlier positions see.
    for position in (prefix, 8, 11):
        later_target = np.asarray(decoder(_changed(tokens, position), decoder_causal_attention=causal_attention))
        np.testing.assert_allclose(base[0, :position], later_target[0, :position], atol=1e-6)
        assert not np.allclose(base[0, position:], later_target[0, position:], atol=1e-4)
    # Plain causal LM: the same later prefix token does not reach earlier positions.
    causal = np.asarray(decoder(tokens))
    np.testing.assert_allclose(causal[0, :3], np.asarray(decoder(_changed(tokens, 3)))[0, :3], atol=1e-6)
    # An empty prefix is the causal LM.
    np.testing.assert_allclose(np.asarray(decoder(tokens, decoder_causal_attention=jnp.zeros_like(tokens))),
                               causal, atol=1e-5)


def test_packed_prefix_lm_examples_match_examples_run_alone(decoder):
    a, b = _tokens(2, 5), _tokens(3, 6)
    tokens = jnp.concatenate([a, b, jnp.zeros((1, 1), jnp.int32)], axis=1)
    causal_a, causal_b = [1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]
    packed = np.asarray(decoder(tokens, decoder_segment_ids=jnp.asarray([[1] * 5 + [2] * 6 + [0]]),
                                decoder_positions=jnp.asarray([list(range(5)) + list(range(6)) + [0]]),
                                decoder_causal_attention=jnp.asarray([causal_a + causal_b + [0]])))
    alone_a = np.asarray(decoder(a, decoder_causal_attention=jnp.asarray([causal_a])))
    alone_b = np.asarray(decoder(b, decoder_causal_attention=jnp.asarray([causal_b])))
    np.testing.assert_allclose(packed[0, :5], alone_a[0], atol=1e-5)
    np.testing.assert_allclose(packed[0, 5:11], alone_b[0], atol=1e-5)


def test_prefix_lm_data_config():
    config = DataConfig("task", sequence_length=64, feature_converter="prefix_lm")
    assert config.seqio_lengths() == {"inputs": 32, "targets": 32}
    assert config.model_feature_shapes(4) == {"decoder_input_tokens": (4, 64), "decoder_causal_attention": (4, 64)}
    assert dataclasses.replace(config, inputs_length=48).seqio_lengths() == {"inputs": 48, "targets": 16}
    decoder, t5 = DecoderConfig(), T5Config()
    assert config.for_model(decoder).feature_converter == "prefix_lm"
    assert DataConfig("task").for_model(decoder).feature_converter == "lm"
    with pytest.raises(ConfigValueError, match="'enc_dec'"):
        config.for_model(t5)
    with pytest.raises(ConfigValueError, match="'lm' or 'prefix_lm'"):
        DataConfig("task", inputs_length=8, feature_converter="enc_dec").for_model(decoder)
    for inputs_length in (0, 64):
        with pytest.raises(ConfigValueError, match="INPUTS_LENGTH between 1 and 63"):
            DataConfig("task", sequence_length=64, inputs_length=inputs_length, feature_converter="prefix_lm")


def test_packed_rows_score_only_the_targets(small_data_dir):
    import seqio

    from t5x_lite.data.tasks import prefix_lm

    name = prefix_lm.prefix_lm_task(name="test_prefix_lm_rows", data_dir=str(small_data_dir))
    config = DataConfig(name, sequence_length=64, feature_converter="prefix_lm")
    dataset = seqio.get_mixture_or_task(name).get_dataset(
        sequence_length=config.seqio_lengths(), split="train", shuffle=False, num_epochs=1, seed=0)
    examples = list(dataset.take(40).as_numpy_iterator())
    rows = list(seqio.PrefixLMFeatureConverter(pack=True)(dataset.take(40), config.seqio_lengths())
                .as_numpy_iterator())
    assert all(row["decoder_target_tokens"].shape == (64,) for row in rows)
    assert len(rows) <= 21  # examples of 32 tokens: two fill a row
    segments = [(row, s) for row in rows for s in range(1, row["decoder_segment_ids"].max() + 1)]
    assert len(segments) == len(examples)
    for (row, s), ex in zip(segments, examples):
        at = row["decoder_segment_ids"] == s
        n_in, n_all = len(ex["inputs"]), len(ex["inputs"]) + len(ex["targets"])
        np.testing.assert_array_equal(row["decoder_target_tokens"][at], np.concatenate([ex["inputs"], ex["targets"]]))
        np.testing.assert_array_equal(row["decoder_loss_weights"][at], [0] * n_in + [1] * (n_all - n_in))
        np.testing.assert_array_equal(row["decoder_causal_attention"][at], [1] * (n_in + 1) + [0] * (n_all - n_in - 1))


def test_tiny_decoder_trains_as_a_prefix_lm(small_data_dir, tmp_path):
    result = run_cli("train", "--gin_file=runs/prefix_lm_quickstart.gin", f"--gin.DATA_DIR='{small_data_dir}'",
                     f"--gin.MODEL_DIR='{tmp_path / 'run'}'", *TINY_MODEL, "--gin.TRAIN_STEPS=24",
                     "--gin.train.log_period=6", "--gin.WarmupCosine.warmup_steps=6")
    assert result.returncode == 0, result.stderr[-3000:]
    # One CPU device in float32: attention on the fused native kernel, said at start-up.
    assert "model: decoder_only" in result.stdout and "explicit_blas attention" in result.stdout
    seen = losses(result.stdout)
    assert len(seen) == 4 and seen[-1] < seen[0] - 1.0, (seen, result.stdout)
    assert "step 24: validation loss" in result.stdout
    assert "DataConfig.feature_converter = 'prefix_lm'" in (tmp_path / "run" / "config.gin").read_text()
