"""Where decision records are written: a bounded queue and one writer thread
(``RecordWriter``).

Writing never blocks the event loop and never fails a decision: when the queue is full a
record is dropped, counted in ``semif_decision_records_dropped_total`` and logged at most
once a minute; a write that fails drops its batch the same way. Records handed to the sink
are counted in ``semif_decision_records_written_total``. The records themselves, and the
decision ids: ``proxy/recorder.py``; the policy: docs/records.md.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from .metrics import Metrics

__all__ = ["STDOUT", "RecordWriter", "sink_writer"]

STDOUT = "stdout"
_BATCH = 256  # records written at once by the writer thread, at most
# the bytes queued, at most, whatever the count: a record holding its inputs can be as
# large as a request body (--max-body-bytes)
MAX_QUEUED_BYTES = 64 * 1024 * 1024
_DROP_LOG_S = 60.0  # a drop is logged at most this often
log = logging.getLogger("proxy.records")


class _DropLog:
    """Drops counted in the metric and logged at most once a minute (with how many since
    the last line). Called from the event loop and the writer thread."""

    def __init__(self, metrics: Metrics | None, every_s: float = _DROP_LOG_S) -> None:
        self._metrics = metrics
        self._every_s = every_s
        self._lock = threading.Lock()
        self._since = 0
        self._last = -every_s

    def __call__(self, n: int, why: str) -> None:
        if self._metrics is not None:
            self._metrics.records_dropped.inc(n)
        with self._lock:
            self._since += n
            now = time.monotonic()
            if now - self._last < self._every_s:
                return
            count, self._since, self._last = self._since, 0, now
        log.warning(
            "%d decision record(s) dropped (%s); semif_decision_records_dropped_total counts "
            "them all; this is logged at most once a minute",
            count,
            why,
        )


class RecordWriter:
    """A bounded queue of records and one thread that writes them, as JSON lines, through
    ``write`` (blocking; whole batches of lines per call). ``put`` never blocks: a full
    queue drops the record (counted, logged). A failed write drops its batch the same
    way. ``close`` gives what is queued ``timeout_s`` to be written. The queue holds at
    most ``capacity`` records and ``max_bytes`` bytes of them, as JSON lines (each record
    is serialised as it is queued: one that cannot be is dropped alone)."""

    def __init__(
        self,
        write: Callable[[bytes], None],
        capacity: int,
        metrics: Metrics | None = None,
        *,
        on_close: Callable[[], None] | None = None,
        max_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self._write = write
        self._metrics = metrics
        self._on_close = on_close
        self._queue: queue.Queue[bytes | None] = queue.Queue(capacity)
        self._max_bytes = max_bytes
        self._bytes = 0  # queued, not yet taken by the writer thread
        self._bytes_lock = threading.Lock()
        self._dropped = _DropLog(metrics)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="semif-records", daemon=True)
        self._thread.start()

    def put(self, record: Mapping[str, Any]) -> bool:
        """Queue ``record``; False (and counted as dropped) when the queue is full, holds
        its bytes, or the writer is closed, or the record is not JSON."""
        if self._closed:
            self._dropped(1, "the proxy is shutting down")
            return False
        try:
            line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        except Exception as exc:  # noqa: BLE001 - counted and logged, never raised
            self._dropped(1, f"the record is not JSON: {exc}")
            return False
        with self._bytes_lock:
            if self._bytes + len(line) > self._max_bytes:
                full = True
            else:
                full = False
                self._bytes += len(line)
        if full:
            self._dropped(1, "the record queue holds its byte limit: the sink does not keep up")
            return False
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self._taken(len(line))
            self._dropped(1, "the record queue is full: the sink does not keep up")
            return False
        return True

    def _taken(self, size: int) -> None:
        with self._bytes_lock:
            self._bytes -= size

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < _BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            data = b"".join(batch)
            self._taken(len(data))
            try:
                self._write(data)
            except Exception as exc:  # noqa: BLE001 - counted and logged, never raised
                self._dropped(len(batch), f"writing failed: {exc}")
            else:
                if self._metrics is not None:
                    self._metrics.records_written.inc(len(batch))

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (for at most ``timeout_s``), then stop the thread."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning(
                "about %d decision record(s) not written: the sink did not take them within "
                "%g s of shutting down",
                self._queue.qsize(),
                timeout_s,
            )
        elif self._on_close is not None:
            self._on_close()


def _write_all(fd: int) -> Callable[[bytes], None]:
    """Write to ``fd`` until every byte is taken (a pipe may take part of a large write)."""

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    return write


def sink_writer(target: str) -> tuple[Callable[[bytes], None], Callable[[], None] | None]:
    """``write`` and ``close`` for ``--decision-records``: stdout (file descriptor 1, left
    open) or a file opened for appending (created 0640 when missing)."""
    if target == STDOUT:
        return _write_all(1), None
    fd = os.open(Path(target), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    return _write_all(fd), lambda: os.close(fd)
