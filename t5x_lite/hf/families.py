"""Which family module converts a Hugging Face config or a t5x_lite model config.

A family module has MODEL_TYPE, ARCHITECTURE, `dims(config_json)`, `config_from_hf`,
`config_to_hf`, `differences(model_config)` and `mapping(model_config, names)`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from t5x_lite.hf import gemma, gpt2, llama, mistral, qwen2, t5
from t5x_lite.hf.errors import ConversionError

FAMILIES: dict[str, ModuleType] = {m.MODEL_TYPE: m for m in (llama, mistral, qwen2, gemma, gpt2, t5)}
SUPPORTED = ", ".join(f"{m.MODEL_TYPE} ({m.ARCHITECTURE})" for m in FAMILIES.values())


def for_hf_config(config: dict[str, Any]) -> ModuleType:
    """The family of a config.json; a ConversionError names model_type or architectures otherwise."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ConversionError(f"config.json model_type={model_type!r} (architectures {config.get('architectures')}) "
                              f"is not supported; supported: {SUPPORTED}.")
    family = FAMILIES[model_type]
    architectures = config.get("architectures") or [family.ARCHITECTURE]
    if family.ARCHITECTURE not in architectures:
        raise ConversionError(f"config.json architectures={architectures} is not supported for model_type "
                              f"{model_type!r}; only {family.ARCHITECTURE} converts (the language-modelling head).")
    return family


def for_model(model: Any, prefer: str | None = None) -> ModuleType:
    """The family that can represent a t5x_lite model config; a ConversionError names the fields otherwise.

    The first that fits of LLaMA, Mistral, Qwen2, Gemma and GPT-2 (a LLaMA-shaped model with a
    sliding window is a Mistral, with q, k and v biases a Qwen2), unless the family whose
    model_type is `prefer` (the config.json a model was converted from) fits too: a Mistral
    without a window goes back as a Mistral.
    """
    candidates = [FAMILIES[model_type] for model_type in model.hf_model_types if model_type in FAMILIES]
    preferred = FAMILIES.get(prefer) if isinstance(prefer, str) else None
    if preferred in candidates and not preferred.differences(model):
        return preferred
    problems = {}
    for family in candidates:
        differences = family.differences(model)
        if not differences:
            return family
        problems[family.ARCHITECTURE] = differences
    raise ConversionError("This model has no Hugging Face counterpart:\n  " + "\n  ".join(
        f"not a {arch}: " + "; ".join(diffs) for arch, diffs in problems.items()))
