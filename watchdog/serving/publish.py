"""The latest-snapshot holder: the loop publishes, REST and metrics read.

Publishing is an atomic reference swap: readers get either the previous or the new immutable
:class:`~gpu_triage.model.snapshot.Snapshot`, never a half-built one, and never wait for the loop. A reader
holds no lock while it renders, so a slow HTTP client can never delay a cycle.

:meth:`SnapshotHolder.wait_for_cycle` lets tests and tools block until a given cycle has been
published (a condition variable notified on publish; the loop holds its lock only for the notify).
"""

from __future__ import annotations

import threading
import time

from gpu_triage.model.snapshot import Snapshot


class SnapshotHolder:
    """Thread-safe holder of the latest published :class:`Snapshot` (``None`` before the first cycle)."""

    __slots__ = ("_changed", "_published_monotonic_s", "_snapshot", "_waiters")

    def __init__(self, initial: Snapshot | None = None) -> None:
        self._snapshot: Snapshot | None = initial
        self._published_monotonic_s: float | None = time.monotonic() if initial is not None else None
        self._changed = threading.Condition(threading.Lock())
        self._waiters = 0
        """Threads in :meth:`wait_for_cycle` (publish takes the lock to wake them only when there are)."""

    def publish(self, snapshot: Snapshot) -> None:
        """Make ``snapshot`` the latest (called by the loop once per cycle)."""
        self._snapshot = snapshot  # a single reference store: atomic for readers
        self._published_monotonic_s = time.monotonic()
        if self._waiters:  # a waiter counts itself before it reads the snapshot: none is missed
            with self._changed:
                self._changed.notify_all()

    def latest(self) -> Snapshot | None:
        """The latest snapshot, or ``None`` before the first cycle. Never blocks."""
        return self._snapshot

    @property
    def published_age_s(self) -> float | None:
        """Seconds (monotonic clock) since the last publish; ``None`` before the first."""
        published = self._published_monotonic_s
        return None if published is None else time.monotonic() - published

    def wait_for_cycle(self, cycle: int, timeout_s: float) -> Snapshot | None:
        """Block until a snapshot with ``snapshot.cycle >= cycle`` is published; return it, or ``None``
        when ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            self._waiters += 1
            try:
                while True:
                    snapshot = self._snapshot
                    if snapshot is not None and snapshot.cycle >= cycle:
                        return snapshot
                    remaining_s = deadline - time.monotonic()
                    if remaining_s <= 0:
                        return None
                    self._changed.wait(remaining_s)
            finally:
                self._waiters -= 1
