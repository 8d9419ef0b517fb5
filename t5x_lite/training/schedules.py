"""Learning-rate schedules: pure functions of the step, and the gin-bound classes that build them.

Each schedule is a pure function `f(step, **values) -> learning rate` (jnp, so it runs traced inside
the jitted step and is tested directly against its closed form); each class holds the values a
gin file binds (`AdamW.learning_rate = @WarmupCosine()`) and `build(total_steps)` turns them into
the `optax.Schedule` of a run of `total_steps` optimizer steps. `check(problems)` names every bad
value (run_values.py calls it before anything is built).

Steps count from 0: the update of step `s` uses `f(s)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax

DECAY_SHAPES = ("linear", "cosine")


def _steps(step: jax.Array | int) -> jax.Array:
    return jnp.asarray(step, jnp.float32)


def _linear_warmup(step: jax.Array, peak: float, warmup_steps: int) -> jax.Array:
    return peak * step / max(warmup_steps, 1)


def _decayed(progress: jax.Array, peak: float, final: float, shape: str) -> jax.Array:
    """From `peak` (progress 0) to `final` (progress 1), along a line or half a cosine."""
    if shape == "cosine":
        return final + 0.5 * (peak - final) * (1.0 + jnp.cos(jnp.pi * progress))
    return peak + (final - peak) * progress


def warmup_cosine_schedule(
    step: jax.Array | int, *, peak_learning_rate: float, warmup_steps: int, decay_steps: int,
    final_learning_rate_fraction: float = 0.1,
) -> jax.Array:
    """Linear warmup from 0 to the peak, then cosine decay to `final_learning_rate_fraction * peak`.

    `decay_steps` counts from the end of the warmup; past it the rate stays at the final value.
    """
    step = _steps(step)
    progress = jnp.clip((step - warmup_steps) / max(decay_steps, 1), 0.0, 1.0)
    final = final_learning_rate_fraction * peak_learning_rate
    decayed = _decayed(progress, peak_learning_rate, final, "cosine")
    return jnp.where(step < warmup_steps, _linear_warmup(step, peak_learning_rate, warmup_steps), decayed)


def warmup_linear_schedule(
    step: jax.Array | int, *, peak_learning_rate: float, warmup_steps: int, decay_steps: int,
    final_learning_rate_fraction: float = 0.0,
) -> jax.Array:
    """Linear warmup from 0 to the peak, then a straight line down to `final_learning_rate_fraction *
    peak` over `decay_steps`; past it the rate stays at the final value."""
    step = _steps(step)
    progress = jnp.clip((step - warmup_steps) / max(decay_steps, 1), 0.0, 1.0)
    final = final_learning_rate_fraction * peak_learning_rate
    decayed = _decayed(progress, peak_learning_rate, final, "linear")
    return jnp.where(step < warmup_steps, _linear_warmup(step, peak_learning_rate, warmup_steps), decayed)


def rsqrt_schedule(step: jax.Array | int, *, base_learning_rate: float, warmup_steps: int) -> jax.Array:
    """t5x's `constant * rsqrt_decay`: `base / sqrt(max(step, warmup_steps))`, flat at
    `base / sqrt(warmup_steps)` for the first `warmup_steps` steps, then decaying as 1/sqrt(step)."""
    return base_learning_rate / jnp.sqrt(jnp.maximum(_steps(step), float(warmup_steps)))


def constant_schedule(step: jax.Array | int, *, learning_rate: float, warmup_steps: int = 0) -> jax.Array:
    """`learning_rate` throughout, after an optional linear warmup from 0 over `warmup_steps`."""
    step = _steps(step)
    return jnp.where(step < warmup_steps, _linear_warmup(step, learning_rate, warmup_steps),
                     jnp.asarray(learning_rate, jnp.float32))


def warmup_stable_decay_schedule(
    step: jax.Array | int, *, peak_learning_rate: float, warmup_steps: int, decay_start: int, decay_steps: int,
    final_learning_rate_fraction: float = 0.0, decay_shape: str = "linear",
) -> jax.Array:
    """Linear warmup to the peak, the peak until `decay_start`, then a decay (`decay_shape` 'linear'
    or 'cosine') to `final_learning_rate_fraction * peak` over `decay_steps`; the final rate after."""
    step = _steps(step)
    progress = jnp.clip((step - decay_start) / max(decay_steps, 1), 0.0, 1.0)
    final = final_learning_rate_fraction * peak_learning_rate
    decayed = _decayed(progress, peak_learning_rate, final, decay_shape)
    return jnp.where(step < warmup_steps, _linear_warmup(step, peak_learning_rate, warmup_steps), decayed)


# --------------------------------------------------------------------------- gin-bound classes


class Problems(Protocol):
    """What `check` reports bad values to: run_values.Problems (which imports this module)."""

    def add(self, name: str, value: Any, need: str, hint: str = "") -> None: ...
    def integer(self, name: str, value: Any, *, minimum: int = 1, optional: bool = False) -> None: ...
    def number(self, name: str, value: Any, *, low: float, high: float = ..., low_open: bool = False,
               high_open: bool = False, optional: bool = False) -> None: ...
    def boolean(self, name: str, value: Any, *, optional: bool = False) -> None: ...


def _decay_after_warmup(decay_steps: int | None, warmup_steps: int, total_steps: int) -> int:
    return decay_steps if decay_steps is not None else max(total_steps - warmup_steps, 1)


# Every schedule class, in the order they are defined: subclassing `Schedule` registers one (gin
# binds it under its class name and the configuration reference documents it).
SCHEDULES: dict[str, type["Schedule"]] = {}


class Schedule:
    """Base of the learning-rate schedule configs an optimizer's `learning_rate` takes (frozen dataclasses)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        SCHEDULES.setdefault(cls.__name__, cls)  # the first of a name: gin's own subclass of it is not another

    def build(self, total_steps: int) -> Any:
        """The optax schedule (step -> learning rate) of a run of `total_steps` optimizer steps."""
        raise NotImplementedError

    def check(self, problems: Problems) -> None:
        """Adds each bad value, named as gin binds it, to `problems`."""


@dataclasses.dataclass(frozen=True)
class WarmupCosine(Schedule):
    """Linear warmup from 0 to the peak, then cosine decay to a fraction of it.

    Attributes:
      peak_learning_rate: learning rate at the end of warmup.
      warmup_steps: steps of linear warmup from 0.
      decay_steps: steps of cosine decay after warmup; None decays over the rest of the run.
      final_learning_rate_fraction: the final rate as a fraction of the peak.
    """

    peak_learning_rate: float = 3e-3
    warmup_steps: int = 100
    decay_steps: int | None = None
    final_learning_rate_fraction: float = 0.1

    def build(self, total_steps: int) -> optax.Schedule:
        """The schedule of a run of `total_steps` optimizer steps."""
        decay = _decay_after_warmup(self.decay_steps, self.warmup_steps, total_steps)
        return lambda step: warmup_cosine_schedule(
            step, peak_learning_rate=self.peak_learning_rate, warmup_steps=self.warmup_steps,
            decay_steps=decay, final_learning_rate_fraction=self.final_learning_rate_fraction)

    def check(self, problems: Problems) -> None:
        """Adds each bad value, named as gin binds it, to `problems`."""
        _check_peak_warmup_decay(problems, "WarmupCosine", self)


@dataclasses.dataclass(frozen=True)
class WarmupLinear(Schedule):
    """Linear warmup from 0 to the peak, then a linear decay to a fraction of it.

    Attributes:
      peak_learning_rate: learning rate at the end of warmup.
      warmup_steps: steps of linear warmup from 0.
      decay_steps: steps of linear decay after warmup; None decays over the rest of the run.
      final_learning_rate_fraction: the final rate as a fraction of the peak.
    """

    peak_learning_rate: float = 3e-3
    warmup_steps: int = 100
    decay_steps: int | None = None
    final_learning_rate_fraction: float = 0.0

    def build(self, total_steps: int) -> optax.Schedule:
        """The schedule of a run of `total_steps` optimizer steps."""
        decay = _decay_after_warmup(self.decay_steps, self.warmup_steps, total_steps)
        return lambda step: warmup_linear_schedule(
            step, peak_learning_rate=self.peak_learning_rate, warmup_steps=self.warmup_steps,
            decay_steps=decay, final_learning_rate_fraction=self.final_learning_rate_fraction)

    def check(self, problems: Problems) -> None:
        """Adds each bad value, named as gin binds it, to `problems`."""
        _check_peak_warmup_decay(problems, "WarmupLinear", self)


@dataclasses.dataclass(frozen=True)
class RsqrtDecay(Schedule):
    """t5x's `constant * rsqrt_decay`: base / sqrt(max(step, warmup_steps)) (T5's pre-training rate).

    With t5x's defaults the rate is 0.01 for the first 10,000 steps, then falls as 1/sqrt(step).

    Attributes:
      base_learning_rate: the constant factor (t5x's `base_learning_rate`).
      warmup_steps: steps at the flat rate base / sqrt(warmup_steps) before the decay.
    """

    base_learning_rate: float = 1.0
    warmup_steps: int = 10_000

    def build(self, total_steps: int) -> optax.Schedule:
        """The schedule (the same whatever `total_steps`)."""
        del total_steps
        return lambda step: rsqrt_schedule(step, base_learning_rate=self.base_learning_rate,
                                           warmup_steps=self.warmup_steps)

    def check(self, problems: Problems) -> None:
        """Adds each bad value, named as gin binds it, to `problems`."""
        problems.number("RsqrtDecay.base_learning_rate", self.base_learning_rate, low=0, low_open=True)
        problems.integer("RsqrtDecay.warmup_steps", self.warmup_steps)


@dataclasses.dataclass(frozen=True)
class Constant(Schedule):
    """A constant learning rate, after an optional linear warmup from 0.

    Attributes:
      learning_rate: the rate.
      warmup_steps: steps of linear warmup from 0 (0: none).
    """

    learning_rate: float = 1e-3
    warmup_steps: int = 0

    def build(self, total_steps: int) -> optax.Schedule:
        """The schedule (the same whatever `total_steps`)."""
        del total_steps
        return lambda step: constant_schedule(step, learning_rate=self.learning_rate, warmup_steps=self.warmup_steps)

    def check(self, problems: Problems) -> None:
        """Adds each bad value, named as gin binds it, to `problems`."""
        problems.number("Constant.learning_rate", self.learning_rate, low=0, low_open=True)
        problems.integer("Constant.warmup_steps", self.warmup_steps, minimum=0)


@dataclasses.dataclass(frozen=True)
class WarmupStableDecay(Schedule):
    """Warmup, a flat stretch at the peak, then a decay over the last fraction of the run.

    The decay covers the last `decay_fraction` of the run's steps (never reaching back into the
    warmup) and ends at the last step.

    Attributes:
      peak_learning_rate: learning rate after warmup and through the flat stretch.
      warmup_steps: steps of linear warmup from 0.
      decay_fraction: the fraction of the run's steps, at its end, over which the rate decays.
      final_learning_rate_fraction: the rate at the end of the run as a fraction of the peak.
      decay_shape: 'linear' (a straight line, the default) or 'cosine' (half a cosine).
    """

    peak_learning_rate: float = 3e-3
    warmup_steps: int = 100
    decay_fraction: float = 0.2
    final_learning_rate_fraction: float = 0.0
    decay_shape: str = "linear"

    def phases(self, total_steps: int) -> tuple[int, int]:
        """(decay_start, decay_steps) for a run of `total_steps` steps."""
        decay_start = max(total_steps - round(self.decay_fraction * total_steps), self.warmup_steps)
        return decay_start, max(total_steps - decay_start, 0)

    def build(self, total_steps: int) -> optax.Schedule:
        """The schedule of a run of `total_steps` optimizer steps."""
        decay_start, decay_steps = self.phases(total_steps)
        return lambda step: warmup_stable_decay_schedule(
            step, peak_learning_rate=self.peak_learning_rate, warmup_steps=self.warmup_steps,
            decay_start=decay_start, decay_steps=decay_steps,
            final_learning_rate_fraction=self.final_learning_rate_fraction, decay_shape=self.decay_shape)

    def check(self, problems: Problems) -> None:
        """Adds each bad value, named as gin binds it, to `problems`."""
        problems.number("WarmupStableDecay.peak_learning_rate", self.peak_learning_rate, low=0, low_open=True)
        problems.integer("WarmupStableDecay.warmup_steps", self.warmup_steps, minimum=0)
        problems.number("WarmupStableDecay.decay_fraction", self.decay_fraction, low=0, high=1)
        problems.number("WarmupStableDecay.final_learning_rate_fraction", self.final_learning_rate_fraction,
                        low=0, high=1)
        if self.decay_shape not in DECAY_SHAPES:
            problems.add("WarmupStableDecay.decay_shape", self.decay_shape,
                         f"must be one of {', '.join(map(repr, DECAY_SHAPES))}")


def _check_peak_warmup_decay(problems: Problems, name: str, schedule: Any) -> None:
    problems.number(f"{name}.peak_learning_rate", schedule.peak_learning_rate, low=0, low_open=True)
    problems.integer(f"{name}.warmup_steps", schedule.warmup_steps, minimum=0)
    problems.integer(f"{name}.decay_steps", schedule.decay_steps, optional=True)
    problems.number(f"{name}.final_learning_rate_fraction", schedule.final_learning_rate_fraction, low=0, high=1)

