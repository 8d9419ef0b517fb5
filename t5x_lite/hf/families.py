"""Which family module converts a Hugging Face config or a t5x_lite model config.

A family module has MODEL_TYPE, ARCHITECTURE, `dims(config_json)`, `config_from_hf`,
`config_to_hf`, `differences(model_config)` and `mapping(model_config, names)`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from t5x_lite.hf import gpt2, llama, t5
from t5x_lite.hf.errors import ConversionError

FAMILIES: dict[str, ModuleType] = {m.MODEL_TYPE: m for m in (llama, gpt2, t5)}
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


def for_model(model: Any) -> ModuleType:
    """The family that can represent a t5x_lite model config; a ConversionError names the fields otherwise."""
    if model.family == "encoder_decoder":
        candidates = [t5]
    else:
        candidates = [llama, gpt2]
    problems = {}
    for family in candidates:
        differences = family.differences(model)
        if not differences:
            return family
        problems[family.ARCHITECTURE] = differences
    raise ConversionError("This model has no Hugging Face counterpart:\n  " + "\n  ".join(
        f"not a {arch}: " + "; ".join(diffs) for arch, diffs in problems.items()))
