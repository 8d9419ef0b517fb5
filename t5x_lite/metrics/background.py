"""`BackgroundSink`: one writer's sink on a thread of its own, so that a slow or dead backend
(an MLflow server that stopped answering, W&B's service) never holds the train loop.

`scalars` only appends the report to a bounded queue and returns; one daemon thread writes the
queue in order. A full queue drops the new report (the loop never waits): the first drop is one
warning line naming the writer, and the count of every report not written is said again when
the run ends. A write that fails is a warning line (the first of each run of failures; the
count at the end). `close(status)` waits a bounded time, never minutes: up to `drain_s` for the
queue to be written, then whatever is still queued is given up and the tracked run is ended with
`status` (FINISHED, FAILED or KILLED) from a thread of its own (a write stuck in the backend's
retries cannot hold it back), waited for until `close_timeout_s` after close began. Past that the
run goes on ending without it (the threads are daemons: they never hold the process).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Mapping

from t5x_lite.metrics import tracking

QUEUE_SIZE = 1000  # reports waiting to be written; a report past them is dropped
DRAIN_S = 3.0  # close: at most this long writing what is queued...
CLOSE_TIMEOUT_S = 5.0  # ...and at most this long in all, ending the tracked run included


class BackgroundSink:
    """Wraps `sink` (a `tracking.Sink`): its writes and its close run on a background thread.

    `name` names the writer in warning lines (`MlflowWriter`); `say` prints one line (it is
    called from the background thread too).
    """

    def __init__(self, sink: tracking.Sink, *, name: str, say: Callable[[str], None],
                 queue_size: int = QUEUE_SIZE, drain_s: float = DRAIN_S, close_timeout_s: float = CLOSE_TIMEOUT_S):
        self._sink, self._name, self._say = sink, name, say
        self._queue_size, self._drain_s, self._close_timeout_s = queue_size, drain_s, close_timeout_s
        self._pending: collections.deque[tuple[str, int, dict[str, float]]] = collections.deque()
        self._lock = threading.Condition()
        self.received = self.dropped = self.failed = self.unwritten = 0
        self._failing = False  # the last write failed: the next failure is counted, not printed
        self._status: str | None = None  # set when close begins: no more reports are taken
        self._drain_deadline = self._close_deadline = 0.0
        self._drained = False  # the writing thread has stopped: nothing queued, nothing in flight
        self._in_flight = False  # a report is being written now
        self._closed = threading.Event()
        self._close_error: Exception | None = None
        self._reported = False
        self._writer = threading.Thread(target=self._write_queue, name=f"{name}-writes", daemon=True)
        self._writer.start()

    def scalars(self, name: str, step: int, values: Mapping[str, float]) -> None:
        """Queues the report and returns at once; dropped (and counted) when the queue is full."""
        with self._lock:
            if self._status is not None:
                return
            self.received += 1
            if len(self._pending) >= self._queue_size:
                self.dropped += 1
                first_drop = self.dropped == 1
            else:
                self._pending.append((name, step, dict(values)))
                self._lock.notify_all()
                first_drop = False
        if first_drop:
            self._say(f"warning: {self._name} is behind ({self._queue_size} reports wait to be written): dropped 1 "
                      f"report ({name} at step {step}); reports are dropped, not waited for, until it catches up, "
                      "and the count is said at the end.")

    def close(self, status: str) -> None:
        """Ends the tracked run with `status` (FINISHED, FAILED or KILLED), waiting at most
        `close_timeout_s` in all (`begin_close` may have started the clock earlier). Raises the
        sink's own error if closing failed; prints a warning line if it did not end in time."""
        self.begin_close(status)
        ended = self._closed.wait(max(0.0, self._close_deadline - time.monotonic()))
        self._report(status, ended)
        if ended and self._close_error is not None:
            error, self._close_error = self._close_error, None
            raise error

    def begin_close(self, status: str) -> None:
        """Starts closing and returns: several sinks closed together wait for the slowest, not the sum."""
        with self._lock:
            if self._status is not None:
                return
            self._status = status
            now = time.monotonic()
            self._drain_deadline, self._close_deadline = now + self._drain_s, now + self._close_timeout_s
            self._lock.notify_all()
        threading.Thread(target=self._end_run, name=f"{self._name}-close", daemon=True).start()

    def _write_queue(self) -> None:
        while True:
            with self._lock:
                while not self._pending and self._status is None:
                    self._lock.wait()
                if not self._pending or (self._status is not None and time.monotonic() >= self._drain_deadline):
                    break
                report = self._pending.popleft()
                self._in_flight = True
            self._write(*report)
            with self._lock:
                self._in_flight = False
        with self._lock:
            self._drained = True
            self._lock.notify_all()

    def _write(self, name: str, step: int, values: dict[str, float]) -> None:
        try:
            self._sink.scalars(name, step, values)
        except Exception as e:  # noqa: BLE001 - a tracking server that is down must not stop training
            self.failed += 1
            if not self._failing:
                self._say(f"warning: {self._name} could not write {name} at step {step}: {tracking.first_line(e)} "
                          "(further failures are counted until a write succeeds)")
            self._failing = True
        else:
            self._failing = False

    def _end_run(self) -> None:
        """Waits for the queue until the drain deadline, gives up what is left, and closes the sink."""
        with self._lock:
            self._lock.wait_for(lambda: self._drained, timeout=max(0.0, self._drain_deadline - time.monotonic()))
            self.unwritten += len(self._pending) + self._in_flight  # a write stuck in the backend counts too
            self._pending.clear()
            self._lock.notify_all()
        try:
            self._sink.close(self._status or "FINISHED")
        except Exception as e:  # noqa: BLE001 - said by `close`, in the closing thread
            self._close_error = e
        self._closed.set()

    def _report(self, status: str, ended: bool) -> None:
        """One line, once: the reports not written (if any) and a run that did not end in time."""
        if self._reported:
            return
        self._reported = True
        with self._lock:
            dropped, unwritten, failed = self.dropped, self.unwritten, self.failed
        if dropped or unwritten or failed:
            parts = [f"{dropped} dropped (queue full)" if dropped else "",
                     f"{failed} failed" if failed else "",
                     f"{unwritten} still queued or in flight at the end" if unwritten else ""]
            self._say(f"warning: {self._name}: {dropped + unwritten + failed} of {self.received} reports were not "
                      f"written: {', '.join(p for p in parts if p)}.")
        if not ended:
            self._say(f"warning: {self._name} could not end its run as {status} within {self._close_timeout_s:g} s "
                      "(its backend is slow or unreachable): the tracked run may still show it as running.")
