"""Preemption: SIGTERM (or JAX's multi-host preemption notice) asks the run to save and stop.

The signal handler only sets a flag; the train loop looks at it between steps, saves a
checkpoint of the step it finished, waits for the write, and exits with EXIT_PREEMPTED so a
scheduler (or a wrapper script) can tell "stopped on request, resume me" from a failure.
"""

from __future__ import annotations

import signal
import threading

import jax
from jax.experimental import multihost_utils

# EX_TEMPFAIL from sysexits.h: a temporary failure; run the same command again to continue.
EXIT_PREEMPTED = 75


class Preempted(Exception):
    """The run saved a checkpoint and stopped because it was asked to (SIGTERM or preemption)."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"{reason}: saved a checkpoint at step {step} and stopped; run the same command "
                         "again to resume.")
        self.step = step


class PreemptionWatcher:
    """Notices SIGTERM (installed while in use) and, with several processes, JAX's preemption sync point."""

    def __init__(self):
        self._requested = threading.Event()
        self._reason = ""
        self._previous = None

    def __enter__(self) -> "PreemptionWatcher":
        # With several processes JAX's coordination service owns SIGTERM (see should_stop).
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_signal(self, signum, frame) -> None:
        self._reason = f"received {signal.Signals(signum).name}"
        self._requested.set()

    def should_stop(self, step: int) -> str | None:
        """Why the run should save and stop after `step`, or None to go on.

        With several processes every process must call this at every step: JAX's sync point
        makes them all agree on the same step, so they save together.
        """
        if jax.process_count() > 1:
            if multihost_utils.reached_preemption_sync_point(step):
                return self._reason or "preemption notice"
            return None
        return self._reason if self._requested.is_set() else None
