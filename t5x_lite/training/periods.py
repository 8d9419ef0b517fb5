"""How often something happens in the train loop: every N steps or every N epochs."""

from __future__ import annotations

import dataclasses
import re

from t5x_lite.errors import ConfigValueError

_PERIOD = re.compile(r"^\s*(\d+)\s*(step|steps|epoch|epochs)\s*$")


@dataclasses.dataclass(frozen=True)
class Period:
    """Every `every` steps or epochs; `every == 0` means never (only at the end of the run)."""

    every: int
    unit: str = "steps"

    @property
    def in_epochs(self) -> bool:
        return self.unit == "epochs"

    def due(self, *, step: int, epochs_finished: int, end_of_epoch: bool) -> bool:
        """Whether the period falls at this step (`end_of_epoch`: the step ended an epoch)."""
        if self.every == 0:
            return False
        if self.in_epochs:
            return end_of_epoch and epochs_finished % self.every == 0
        return step % self.every == 0


def parse_period(value: int | str | None, *, name: str) -> Period:
    """Parses 500, '500 steps', '1 epoch' or '2 epochs' (0 or None: never)."""
    if value is None:
        return Period(0)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return Period(value)
    match = _PERIOD.match(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigValueError(
            f"{name}={value!r} is not a period; give a number of steps (500) or a string like "
            f"'500 steps' or '1 epoch', e.g. --gin.{name}=\"'1 epoch'\".")
    count, unit = int(match.group(1)), match.group(2)
    return Period(count, "epochs" if unit.startswith("epoch") else "steps")
