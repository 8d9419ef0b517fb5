"""What every model family's config shares: dtype handling, validation helpers, a dict form."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from t5x_lite.errors import ConfigValueError
from t5x_lite.models import layers, stack

# Compute dtypes a model runs in; parameters and optimizer state are float32 whatever this says.
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """A ConfigValueError naming the field, the bad value and the valid ones."""
    if value not in choices:
        raise ConfigValueError(f"Unknown {name} {value!r}; choose one of {list(choices)}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class ModelConfigBase:
    """Mixin for the frozen config dataclasses (fields `dtype`, `remat_policy`, `scan_layers`, `scan_unroll`,
    `mlp_activations`)."""

    def _check_common(self) -> None:
        self._check_field_types()
        check_choice(f"{type(self).__name__}.dtype", self.dtype, COMPUTE_DTYPES)
        # JSON (checkpoint metadata) turns tuples into lists; keep the config hashable.
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        stack.remat_policy(self.remat_policy)  # fails early on an unknown name
        if self.scan_unroll != 1 and not self.scan_layers:
            raise ConfigValueError(
                f"{type(self).__name__}.scan_unroll={self.scan_unroll} applies to scanned layers only; "
                "set scan_layers=True, or leave scan_unroll at 1 with unrolled layers.")
        for name in self.mlp_activations:
            check_choice("mlp_activations entry", name, tuple(layers.ACTIVATIONS))

    def _check_field_types(self) -> None:
        """Sizes are positive integers (or None where optional), rates and scales numbers in range,
        switches True/False."""
        name = type(self).__name__
        for field in dataclasses.fields(self):
            value, kind = getattr(self, field.name), field.type
            if kind == "int" and not (_is_int(value) and value >= 1):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be a positive integer.")
            if kind == "int | None" and not (value is None or (_is_int(value) and value >= 1)):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be a positive integer or None.")
            if kind == "bool" and not isinstance(value, bool):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be True or False.")
            if kind == "str" and not isinstance(value, str):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be a string in quotes.")
            if kind in ("float", "float | None") and not (
                    (value is None and kind != "float") or (_is_number(value) and value >= 0)):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be a number >= 0"
                                       + (" or None." if kind != "float" else "."))
        if not self.dropout_rate < 1:
            raise ConfigValueError(f"{name}.dropout_rate={self.dropout_rate!r} must be in [0, 1).")

    def check_batch(self, batch: Any) -> None:
        """Refuses a host batch (a mapping of numpy arrays) this model cannot run as configured;
        the train loop calls it before each step. Nothing to refuse unless a family says so."""

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
