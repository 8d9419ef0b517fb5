"""Preemption: SIGTERM (or JAX's multi-host preemption notice) asks the run to save and stop.

Two stages. From the start of `t5x-lite train` until the loop's first step, `StartupSignals`
(installed by train.py before anything heavy is imported) ends the run at once on SIGTERM or
SIGINT: nothing has been trained, so there is nothing to save, and `StoppedBySignal` unwinds
(closing what was opened) to one line and exit 75 (SIGTERM) or 130 (SIGINT). When the loop
starts, `PreemptionWatcher` takes SIGTERM over: its handler only sets a flag; the loop looks at
it between steps, saves a checkpoint of the step it finished, waits for the write, and raises
`Preempted`, exit EXIT_PREEMPTED, so a scheduler (or a wrapper script) can tell "stopped on
request, resume me" from a failure.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import weakref

from t5x_lite import tf_setup

# EX_TEMPFAIL from sysexits.h: a temporary failure; run the same command again to continue.
EXIT_PREEMPTED = 75
# 128 + SIGINT, what a shell reports for a command stopped with Ctrl-C.
EXIT_INTERRUPTED = 130
EXIT_CODES = {signal.SIGTERM: EXIT_PREEMPTED, signal.SIGINT: EXIT_INTERRUPTED}


class Preempted(Exception):
    """The run saved a checkpoint and stopped because it was asked to (SIGTERM or preemption)."""

    exit_code = EXIT_PREEMPTED

    def __init__(self, step: int, reason: str):
        super().__init__(f"{reason}: saved a checkpoint at step {step} and stopped; run the same command "
                         "again to resume.")
        self.step = step


class StoppedBySignal(BaseException):
    """SIGTERM or SIGINT before the first step: the run stops at once, saving nothing.

    A BaseException (as KeyboardInterrupt), so that no `except Exception` on the way (a damaged
    checkpoint skipped, a pipeline error turned into a message) mistakes it for something else.
    """

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.exit_code = EXIT_CODES.get(signum, 128 + signum)


def startup_message(signum: int) -> str:
    name = signal.Signals(signum).name
    return (f"received {name} before the first step: nothing was saved; run the same command again to "
            "start (or to resume from the checkpoint the model directory already holds).")


class StartupSignals:
    """SIGTERM and SIGINT end the process with `StoppedBySignal` until the train loop takes over.

    A context manager (for the whole of train.py's main). `PreemptionWatcher` calls
    `hand_over()` when the loop starts: the original handlers come back (SIGINT: Python's
    KeyboardInterrupt) and SIGTERM becomes the watcher's. Outside the main thread it does nothing.

    Python runs a signal handler in whatever Python code the main thread is running, and an
    exception raised inside a finaliser (a `__del__`, a weakref or gc callback, such as JAX's
    after a collection) is printed and dropped; one raised while TensorFlow's start-up output is
    captured (tf_setup.py) would leave it captured; one raised while XLA compiles leaves the
    compile running in another thread, which crashes the process as it exits. There the handler
    raises nothing: it sends the signal again a moment later (a long compile delays the stop).
    """

    active: "StartupSignals | None" = None  # the one installed now, for PreemptionWatcher
    RETRY_S = 0.05

    def __init__(self):
        self._previous: dict[int, object] = {}
        self._retries: list[threading.Timer] = []

    def __enter__(self) -> "StartupSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in EXIT_CODES:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            StartupSignals.active = self
        return self

    def __exit__(self, *exc) -> None:
        for timer in self._retries:  # the process is ending: a signal sent again would only kill it
            timer.cancel()
        self.hand_over()

    def _on_signal(self, signum, frame) -> None:
        if tf_setup.capturing_stderr() or _in_finaliser(frame) or _compiling(frame):
            timer = threading.Timer(self.RETRY_S, os.kill, args=(os.getpid(), signum))
            timer.daemon = True
            self._retries.append(timer)
            timer.start()
            return
        raise StoppedBySignal(signum, startup_message(signum))

    def hand_over(self, *, leave_sigterm: bool = False):
        """Puts the handlers that were there before back (once): the run is past its start-up.

        leave_sigterm: leave SIGTERM's handler as it is and return the original one, for the
        watcher that replaces ours (with several processes, JAX's preemption notifier, which
        installed its own handler over ours when the processes joined).
        """
        original = self._previous.get(signal.SIGTERM)
        for signum, previous in self._previous.items():
            if not (leave_sigterm and signum == signal.SIGTERM):
                signal.signal(signum, previous)
        self._previous = {}
        if StartupSignals.active is self:
            StartupSignals.active = None
        return original if leave_sigterm else None


def _compiling(frame) -> bool:
    """Whether `frame` waits for XLA to compile: interrupted there, the compile goes on in XLA's
    thread pool, and a process that exits before it ends crashes in its teardown."""
    while frame is not None:
        if frame.f_code.co_filename.endswith(_JAX_COMPILER):
            return True
        frame = frame.f_back
    return False


_JAX_COMPILER = os.path.join("jax", "_src", "compiler.py")


def _in_finaliser(frame) -> bool:
    """Whether `frame` runs inside a `__del__`, a gc callback or a weakref finaliser, where Python
    prints and drops an exception instead of raising it."""
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code in callbacks or code.co_filename == weakref.__file__:
            return True
        frame = frame.f_back
    return False


class PreemptionWatcher:
    """Notices SIGTERM (installed while in use) and, with several processes, JAX's preemption sync point.

    Entering it ends the start-up stage (StartupSignals.hand_over): from here on SIGTERM saves.
    """

    def __init__(self):
        self._requested = threading.Event()
        self._reason = ""
        self._previous = None

    def __enter__(self) -> "PreemptionWatcher":
        import jax  # jax loads in a second: imported here, so train.py can import this module first

        startup = StartupSignals.active
        original = startup.hand_over(leave_sigterm=True) if startup is not None else None
        # With several processes JAX's coordination service owns SIGTERM (see should_stop).
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            replaced = signal.signal(signal.SIGTERM, self._on_signal)
            self._previous = original if original is not None else replaced
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
        import jax  # see __enter__
        from jax.experimental import multihost_utils

        if jax.process_count() > 1:
            if multihost_utils.reached_preemption_sync_point(step):
                return self._reason or "preemption notice"
            return None
        return self._reason if self._requested.is_set() else None
