"""Configs written for an older t5x_lite or saved by another editor: a renamed configurable or
parameter fails with one line naming its successor (config/renames.py); a UTF-8 byte-order mark
is skipped."""

from __future__ import annotations

import re

import gin
import pytest

from t5x_lite.config import parsing, registry, renames


def _named_configurables(text: str) -> list[str]:
    """The configurables a successor's gin text names: @Name() references and Name.param bindings."""
    return re.findall(r"@(\w+)\(", text) + re.findall(r"\b(\w+)\.\w+\b", text)


@pytest.fixture(scope="module")
def configurables():
    registry.register_configurables()
    return registry.own_configurables()


def test_every_successor_and_moved_parameter_exists(configurables):
    """The table can only point at names a config can bind today, and no old name is bindable."""
    assert renames.RENAMED_CONFIGURABLES and renames.RENAMED_PARAMETERS
    for old, renamed in renames.RENAMED_CONFIGURABLES.items():
        assert old not in configurables, old
        for name in _named_configurables(renamed.successor):
            assert name in configurables, (old, name)
        for param, target in renamed.params.items():
            name, new_param = target.split(".")
            assert new_param in registry.params_of(configurables[name]), (old, param, target)
    for (name, param), successor in renames.RENAMED_PARAMETERS.items():
        assert param not in registry.params_of(configurables[name]), (name, param)
        for new in _named_configurables(successor.successor):
            assert new in configurables, (name, param, new)


def _parse_error(tmp_path, text: str = "", bindings: tuple[str, ...] = ()) -> str:
    old = tmp_path / "old.gin"
    old.write_text(text)
    with pytest.raises(parsing.ConfigError) as e:
        parsing.parse(gin_files=["runs/quickstart.gin", str(old)], gin_bindings=bindings)
    return str(e.value)


@pytest.mark.parametrize("text, bindings, message", [
    ("SEED = 1\nOptimizerConfig.warmup_steps = 10\n", (),
     "OptimizerConfig.warmup_steps (in {old}, line 2) is now WarmupCosine.warmup_steps: OptimizerConfig was replaced "
     "by train.optimizer = @AdamW() with AdamW.learning_rate = @WarmupCosine() (docs/optimizers.md)."),
    ("OptimizerConfig.clip_grad_norm = 0.5\n", (), "OptimizerConfig.clip_grad_norm (in {old}, line 1) is now "
     "AdamW.clip_grad_norm: "),
    ("train.optimizer = @OptimizerConfig()\n", (),
     "OptimizerConfig (in {old}, line 1) was replaced by train.optimizer = @AdamW() with AdamW.learning_rate = "
     "@WarmupCosine(); its peak_learning_rate, warmup_steps, decay_steps, final_learning_rate_fraction are "
     "WarmupCosine's; its b1, b2, eps, weight_decay, clip_grad_norm are AdamW's (docs/optimizers.md)."),
    ("", ("SEED = 1", "OptimizerConfig.peak_learning_rate = 1e-3"),
     "OptimizerConfig.peak_learning_rate (in --gin.OptimizerConfig.peak_learning_rate=1e-3) is now "
     "WarmupCosine.peak_learning_rate: "),
    ("train.keep_checkpoints = 3\n", (), "train.keep_checkpoints (in {old}, line 1) was replaced by "
     "train.retention = @RetentionPolicy() with RetentionPolicy.keep_last (docs/checkpoints.md)."),
], ids=["parameter_to_schedule", "parameter_to_optimizer", "reference", "flag", "train_parameter"])
def test_a_renamed_name_is_one_line_naming_its_successor(tmp_path, text, bindings, message):
    error = _parse_error(tmp_path, text, bindings)
    assert error.startswith(message.format(old=tmp_path / "old.gin")), error
    assert "\n" not in error, error


def test_a_name_never_renamed_keeps_gins_message_and_suggestions(tmp_path):
    error = _parse_error(tmp_path, "OptimizerConfg.b1 = 0.9\n")
    assert error.startswith("No configurable matching 'OptimizerConfg'"), error
    assert "Configurables: " in error
    assert renames.renamed_message(error) is None


def test_a_byte_order_mark_is_skipped_in_files_and_includes(tmp_path):
    inner = tmp_path / "inner.gin"
    inner.write_bytes("\ufeffDecoderConfig.num_layers = 3\n".encode())
    outer = tmp_path / "outer.gin"
    outer.write_bytes(f"\ufeffinclude 'runs/quickstart.gin'\ninclude '{inner}'\nDecoderConfig.emb_dim = 48\n".encode())
    parsing.parse(gin_files=[str(outer)])
    try:
        assert gin.query_parameter("DecoderConfig.num_layers") == 3
        assert gin.query_parameter("DecoderConfig.emb_dim") == 48
    finally:
        gin.clear_config()


def test_a_byte_order_mark_elsewhere_is_still_an_error(tmp_path):
    """Only a leading mark is an editor's: one inside the text is reported where it is."""
    bad = tmp_path / "bad.gin"
    bad.write_bytes("SEED = 1\n\ufeffTRAIN_STEPS = 7\n".encode())
    with pytest.raises(parsing.ConfigError, match=r"bad.gin, line 2"):
        parsing.parse(gin_files=["runs/quickstart.gin", str(bad)])
