"""What every model family's config shares: dtype handling, validation helpers, a dict form."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from t5x_lite.errors import ConfigValueError
from t5x_lite.models import layers, stack


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """A ConfigValueError naming the field, the bad value and the valid ones."""
    if value not in choices:
        raise ConfigValueError(f"Unknown {name} {value!r}; choose one of {list(choices)}.")


class ModelConfigBase:
    """Mixin for the frozen config dataclasses (fields `dtype`, `remat_policy`, `mlp_activations`)."""

    def _check_common(self) -> None:
        # JSON (checkpoint metadata) turns tuples into lists; keep the config hashable.
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        stack.remat_policy(self.remat_policy)  # fails early on an unknown name
        for name in self.mlp_activations:
            check_choice("mlp_activations entry", name, tuple(layers.ACTIVATIONS))

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
