"""bench/torch_reference.py: the eager PyTorch reference trainer, at --quick sizes (PyTorch optional)."""

import sys

import pytest

from bench import throughput, torch_reference
from bench.__main__ import BENCHMARKS, parser

# --quick sizes; one thread, as pytest-xdist runs two workers on a small machine's cores.
QUICK = {**torch_reference.DEFAULTS, **torch_reference.QUICK, "threads": 1}


def test_registered_with_throughputs_sizes():
    assert BENCHMARKS["torch_reference"] is torch_reference
    for key in torch_reference.SIZES:
        assert torch_reference.DEFAULTS[key] == throughput.DEFAULTS[key]
        assert torch_reference.QUICK[key] == throughput.QUICK[key]


def test_without_torch_one_line_names_the_make_target(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    args = parser().parse_args(["torch_reference", "--quick"])
    with pytest.raises(SystemExit) as exc:
        torch_reference.run(args, "python -m bench torch_reference --quick")
    message = str(exc.value)
    assert "make install-torch" in message and "\n" not in message


@pytest.mark.parametrize("style", torch_reference.STYLES)
def test_measure_trains_and_matches_the_t5x_lite_config(style):
    pytest.importorskip("torch")
    r = torch_reference.measure(style, QUICK)
    cfg = r["cfg"]
    assert r["tokens_per_s"] > 0 and r["best_tokens_per_s"] >= r["tokens_per_s"]
    assert r["tokens"] == QUICK["batch_size"] * QUICK["seq_len"]
    assert r["loss"] < r["first_loss"], (r["first_loss"], r["loss"])
    assert r["threads"] == 1
    # Like for like: the matmul parameters are the ones behind t5x_lite's FLOPs formula.
    assert r["matmul_params"] == torch_reference.library_matmul_params(cfg)
    attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * QUICK["seq_len"]
    assert r["flops_token"] == 6 * r["matmul_params"] + attention
    if style == "llama":
        assert r["params"] == cfg.num_params()
    else:  # t5x_lite's gpt2 ties the output projection to the embedding; the PyTorch one does not
        assert r["params"] == cfg.num_params() + cfg.vocab_size * cfg.emb_dim


def test_mismatched_parameter_count_fails_loudly(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(torch_reference, "library_matmul_params", lambda cfg: 1)
    with pytest.raises(SystemExit, match="matmul parameters"):
        torch_reference.measure("llama", QUICK)
