"""bench/step_ab.py: variants parsed from the command line, paired ratios, a --quick run on CPU."""

import pytest

from bench import step_ab
from bench.__main__ import BENCHMARKS
from tests.bench_helpers import run_bench

FIELDS = ("scan_unroll", "remat_policy", "attention_implementation")


def test_a_variant_takes_config_fields_and_xla_options_with_typed_values():
    v = step_ab.parse_variant("fast:scan_unroll=4,remat_policy=full,xla_cpu_enable_fast_math=true,"
                              "xla_cpu_experimental_ynn_fusion_type=", FIELDS)
    assert v.name == "fast"
    assert v.model == {"scan_unroll": 4, "remat_policy": "full"}
    assert v.xla == {"xla_cpu_enable_fast_math": True, "xla_cpu_experimental_ynn_fusion_type": ""}
    assert step_ab.parse_variant("base", FIELDS) == step_ab.Variant("base", {}, {})
    assert step_ab.parse_variant("base", FIELDS).describe() == "as configured"


@pytest.mark.parametrize("text,message", [
    ("x:scan_unrol=4", "neither a field of the model's config nor an XLA option"),
    ("x:scan_unroll", "is not SETTING=VALUE"),
    (":scan_unroll=4", "give it a name"),
])
def test_a_bad_variant_says_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        step_ab.parse_variant(text, FIELDS)


def test_paired_ratios_cancel_drift_common_to_both_sides():
    """The machine slows by half in round 2: each round's ratio is still 0.9."""
    ratios = step_ab.paired_ratios({"a": [1.0, 2.0, 1.5], "b": [0.9, 1.8, 1.35], "c": [1.0, 1.0, 3.0]}, "a")
    assert ratios["a"] == (1.0, 1.0, 1.0)
    assert ratios["b"] == pytest.approx((0.9, 0.9, 0.9))
    assert ratios["c"] == pytest.approx((1.0, 0.5, 2.0))


def _run(*extra):
    return run_bench("step_ab", "--quick", *extra)


def test_quick_variants_time_the_same_math():
    """Loop-free layers and YNNPACK turned off change how the step runs, not what it computes:
    every variant ends at the baseline's loss; the baseline's ratio to itself is 1."""
    assert BENCHMARKS["step_ab"] is step_ab
    result, out = _run("--variant=base", "--variant=loop_free:scan_unroll=2",
                       "--variant=eigen:xla_cpu_experimental_ynn_fusion_type=")
    variants = result["variants"]
    assert list(variants) == ["base", "loop_free", "eigen"]
    assert variants["base"]["paired_ratio"] == (1.0, 1.0, 1.0)
    for v in variants.values():
        assert v["ms_per_step"] > 0 and v["temp_bytes"] > 0
        assert v["loss"] == pytest.approx(variants["base"]["loss"], rel=1e-4)
    assert "command: `python -m bench step_ab --quick" in out.splitlines()[0]
    assert "| loop_free | scan_unroll=2" in out


def test_a_variant_with_another_vocabulary_gets_its_own_batch():
    """Tokens drawn for 512 would index past a 64-entry embedding: the 64-vocabulary variant trains
    on its own tokens, starting near log(64) instead of log(512)."""
    result, _ = _run("--variant=base", "--variant=small:vocab_size=64")
    losses = {name: v["loss"] for name, v in result["variants"].items()}
    assert losses["small"] < losses["base"] - 1.0


@pytest.mark.parametrize("variants,message", [
    (["--variant=base"], "two or more --variant"),
    (["--variant=a", "--variant=a:scan_unroll=2"], "each with its own name"),
    (["--variant=a", "--variant=b:no_such_field=2"], "neither a field"),
    (["--variant=a", "--variant=b:xla_no_such_option=1"], "XLA refused its options"),
])
def test_bad_variants_stop_with_one_line(variants, message):
    with pytest.raises(SystemExit, match=message):
        _run(*variants)
