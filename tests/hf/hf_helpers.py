"""What the Hugging Face interop tests share: random transformers models, logits on both sides
compared to a fraction of the largest logit, folders loaded back and their tensors read."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

SMALL_VOCAB = 128
# Logits agree to this fraction of their largest magnitude (float32 on both sides).
RELATIVE_TOLERANCE = 1e-4


def perturbed(model, noise: float = 0.05):
    """`model` with every parameter perturbed (seeded), so norm scales and biases are not 1 or 0."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise)
    return model.eval()


def hf_logits(model, inputs, targets=None) -> np.ndarray:
    import torch

    with torch.no_grad():
        if targets is None:
            return model(input_ids=torch.tensor(inputs)).logits.numpy()
        return model(input_ids=torch.tensor(inputs), decoder_input_ids=torch.tensor(targets)).logits.numpy()


def our_logits(config, params, inputs, targets=None) -> np.ndarray:
    module = config.make_module()
    args = (jnp.asarray(inputs),) if targets is None else (jnp.asarray(inputs), jnp.asarray(targets))
    return np.asarray(jax.jit(module.apply)({"params": params}, *args))


def assert_logits_agree(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    scale = np.abs(theirs).max()
    error = np.abs(ours - theirs).max()
    assert error <= RELATIVE_TOLERANCE * scale, f"max |difference| {error} vs largest logit {scale}"


def load_hf(folder):
    """The folder as transformers loads it, which must find every tensor it expects and no other."""
    import transformers

    if json.loads((folder / "config.json").read_text())["model_type"] == "t5":
        model, info = transformers.T5ForConditionalGeneration.from_pretrained(folder, output_loading_info=True)
    else:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def all_tensors(folder) -> dict[str, np.ndarray]:
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def assert_same_tensors(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
    """Every tensor back bit for bit, in its dtype, and no other."""
    assert sorted(after) == sorted(before)
    for name, value in before.items():
        assert after[name].dtype == value.dtype and np.array_equal(after[name], value), name
