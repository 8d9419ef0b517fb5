"""Throughput/MFU arithmetic, train-metric summaries and the FLOPs-per-token formula."""

import math

import jax
import jax.numpy as jnp
import pytest

from t5x_lite.metrics import arithmetic as metric_math
from t5x_lite.metrics.writer import MetricsWriter
from t5x_lite.models import decoder_only
from t5x_lite.training.reporting import initial_loss_warning, summarize_window


def test_tokens_per_second():
    assert metric_math.tokens_per_second(1000, 4.0) == 250.0
    assert metric_math.tokens_per_second(1000, 0.0) == 0.0


def test_model_flops_utilization_arithmetic():
    # 1e9 FLOPs/token at 3e4 tokens/s is 3e13 FLOP/s; 4 devices of 1e14 peak give 4e14: MFU 0.075.
    mfu = metric_math.model_flops_utilization(flops_per_token=1e9, tokens_per_second=3e4,
                                          peak_flops_per_device=1e14, num_devices=4)
    assert mfu == pytest.approx(0.075, rel=1e-12)
    # Doubling the devices halves it; doubling the throughput doubles it.
    assert metric_math.model_flops_utilization(flops_per_token=1e9, tokens_per_second=3e4,
                                           peak_flops_per_device=1e14, num_devices=8) == pytest.approx(mfu / 2)
    assert metric_math.model_flops_utilization(flops_per_token=1e9, tokens_per_second=6e4,
                                           peak_flops_per_device=1e14, num_devices=4) == pytest.approx(mfu * 2)


def test_summarize_train_metrics():
    sums = {"loss_sum": 250.0, "z_loss_sum": 5.0, "weight_sum": 100.0, "grad_norm": 6.0,
            "learning_rate": 0.03}
    out = metric_math.summarize_train_metrics(sums, steps=3)
    assert out["loss"] == pytest.approx(2.5)
    assert out["z_loss"] == pytest.approx(0.05)
    assert out["cross_entropy"] == pytest.approx(2.45)  # z-loss subtracted
    assert out["perplexity"] == pytest.approx(math.exp(2.45))
    assert out["grad_norm"] == pytest.approx(2.0)  # averaged over steps
    assert out["learning_rate"] == pytest.approx(0.01)


def test_summarize_train_metrics_without_tokens_does_not_divide_by_zero():
    sums = {"loss_sum": 0.0, "z_loss_sum": 0.0, "weight_sum": 0.0, "grad_norm": 0.0, "learning_rate": 0.0}
    out = metric_math.summarize_train_metrics(sums, steps=1)
    assert out["loss"] == 0.0 and out["perplexity"] == 1.0


def test_perplexity_saturates():
    assert metric_math.perplexity(0.0) == 1.0
    assert metric_math.perplexity(math.log(7.0)) == pytest.approx(7.0)
    assert math.isfinite(metric_math.perplexity(1e6))


@pytest.mark.parametrize("overrides", [{}, {"num_kv_heads": 4, "num_layers": 3, "mlp_dim": 48}])
def test_flops_per_token_formula(overrides):
    cfg = decoder_only.DecoderConfig(**{**dict(vocab_size=96, emb_dim=32, num_heads=4, num_kv_heads=2,
                                                head_dim=8, mlp_dim=64, num_layers=2, max_len=32),
                                        **overrides})
    # Count parameters from the real tree, not from num_params().
    shapes = jax.eval_shape(lambda: decoder_only.Decoder(cfg).init(jax.random.PRNGKey(0),
                                                                    jnp.zeros((1, 8), jnp.int32))["params"])
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    embedding = math.prod(shapes["token_embed"]["embedding"].shape)
    assert embedding == cfg.vocab_size * cfg.emb_dim
    for seq_len in (1, 16, 32):
        expected = 6 * (params - embedding) + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
        assert cfg.flops_per_token(seq_len) == pytest.approx(expected, rel=1e-12)


def test_initial_loss_warning_names_likely_causes():
    import math

    assert initial_loss_warning(math.log(512) + 0.2, 512, 1.0) is None
    warning = initial_loss_warning(math.log(512) + 3.0, 512, 1.0)
    assert "far from ln(vocab_size)" in warning and "initialisation" in warning and "vocabulary" in warning
    assert initial_loss_warning(0.5, 512, 1.0) is not None


def test_progress_bar_shows_loss_and_tokens_per_second(tmp_path, capsys):

    writer = MetricsWriter(str(tmp_path), total_steps=4, initial_step=0, progress_bar=True)
    for step in (2, 4):
        writer.progress(step, {"loss": 2.5 / step, "tok/s": 1234.0})
    writer.close()
    err = capsys.readouterr().err
    assert "4/4" in err and "loss=0.625" in err and "tok/s=1234" in err


def test_without_a_bar_reports_are_printed_lines(tmp_path, capsys):

    writer = MetricsWriter(str(tmp_path), total_steps=4, initial_step=0, progress_bar=False)
    writer.progress(2, {"loss": 1.25, "tok/s": 1234.0})
    writer.close()
    assert "step 2: loss=1.25, tok/s=1234" in capsys.readouterr().out


def test_summarize_window_normalises_over_all_steps_tokens():
    steps = [{"loss_sum": 30.0, "z_loss_sum": 0.0, "weight_sum": 10.0, "grad_norm": 1.0, "learning_rate": 0.1},
             {"loss_sum": 10.0, "z_loss_sum": 0.0, "weight_sum": 30.0, "grad_norm": 3.0, "learning_rate": 0.3}]
    summary = summarize_window(steps, seconds=2.0, tokens_per_step=100, flops_per_token=1e6,
                               peak_flops_per_device=1e9, num_devices=2)
    assert summary["loss"] == 40.0 / 40.0  # per token over both steps, not the mean of per-step losses
    assert summary["grad_norm"] == 2.0 and summary["learning_rate"] == 0.2
    assert summary["tokens_per_second"] == 100.0
    assert summary["mfu"] == 1e6 * 100.0 / 2e9
    no_peak = summarize_window(steps, seconds=2.0, tokens_per_step=100, flops_per_token=1e6,
                               peak_flops_per_device=None, num_devices=2)
    assert "mfu" not in no_peak
