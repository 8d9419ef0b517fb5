"""Orbax's own reports of failures, which the Checkpointer replaces with one line of its own.

Orbax logs each failure with its traceback (hundreds of lines for one full disk), asyncio
reports each of its write tasks whose error nobody read, and its TensorStore threads report
"Event loop is closed" dozens of times after a failed save; the
Checkpointer raises one CheckpointSaveError naming the cause instead. Only those records are
dropped: other libraries' logs and every other exception report are left as they are.
"""

from __future__ import annotations

import logging
import os
import sys


class WithoutOrbaxLogs(logging.Filter):
    """Orbax logs every failure with its traceback (hundreds of lines for one full disk); the
    Checkpointer reports each failure itself in one line, so Orbax's own records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}orbax{os.sep}" not in record.pathname


class WithoutOrbaxTaskErrors(logging.Filter):
    """After a failed save, asyncio reports each of Orbax's write tasks whose error nobody read
    ("Task exception was never retrieved", with its traceback): those reports are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or not record.getMessage().startswith("Task exception was never retrieved"):
            return True
        traceback = record.exc_info[2]
        while traceback is not None:
            if f"{os.sep}orbax{os.sep}" in traceback.tb_frame.f_code.co_filename:
                return False
            traceback = traceback.tb_next
        return True


logging.getLogger("absl").addFilter(WithoutOrbaxLogs())
logging.getLogger("asyncio").addFilter(WithoutOrbaxTaskErrors())


def quiet_closed_loop_reports() -> None:
    """When a save fails, TensorStore's threads still hand their results to Orbax's asyncio loops,
    which are closed by then; each attempt reports "RuntimeError: Event loop is closed" with a
    traceback (dozens for one full disk, through sys.unraisablehook or sys.excepthook) before the
    failure reaches the Checkpointer, which reports it in one line. Those reports, and only
    those, are dropped."""
    if getattr(sys.unraisablehook, "drops_closed_loop_reports", False):
        return
    previous_unraisable, previous_except = sys.unraisablehook, sys.excepthook

    def closed_loop(value: BaseException | None) -> bool:
        return isinstance(value, RuntimeError) and str(value) == "Event loop is closed"

    def unraisable(report):
        if not closed_loop(report.exc_value):
            previous_unraisable(report)

    def excepthook(kind, value, traceback):
        if not closed_loop(value):
            previous_except(kind, value, traceback)

    unraisable.drops_closed_loop_reports = True
    sys.unraisablehook, sys.excepthook = unraisable, excepthook
