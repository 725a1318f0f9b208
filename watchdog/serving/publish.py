"""The latest-snapshot holder: the loop publishes, REST and metrics read.

Publishing is an atomic reference swap: readers get either the previous or the new immutable
:class:`~gpu_triage.model.snapshot.Snapshot`, never a half-built one, and never wait for the loop. A reader
holds no lock while it renders, so a slow HTTP client can never delay a cycle.

The loop may publish a cycle *unbuilt* (:meth:`SnapshotHolder.publish_lazy`): the values the snapshot
is made of, taken (immutable) at the end of the cycle, and the function that makes it. The first reader
of that cycle builds it, once (under the holder's build lock, which the loop never takes: readers
building two cycles take turns); a cycle nobody reads is never built. Ten cycles a second and a scrape
every few seconds: most are never read (issue 30).

:meth:`SnapshotHolder.wait_for_cycle` lets tests and tools block until a given cycle has been
published (a condition variable notified on publish; the loop holds its lock only for the notify).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpu_triage.model.snapshot import Snapshot


class _Unbuilt:
    """One published cycle not built yet: built by its first reader, once."""

    __slots__ = ("_build", "_lock", "_snapshot", "cycle")

    def __init__(self, cycle: int, build: Callable[[], Snapshot], lock: threading.Lock) -> None:
        self.cycle = cycle
        self._build: Callable[[], Snapshot] | None = build
        self._snapshot: Snapshot | None = None
        self._lock = lock
        """The holder's build lock (shared: not a lock made per cycle, 10 times a second)."""

    def get(self) -> Snapshot:
        snapshot = self._snapshot
        if snapshot is not None:
            return snapshot
        with self._lock:
            if self._snapshot is None:
                assert self._build is not None
                self._snapshot, self._build = self._build(), None
            return self._snapshot


class SnapshotHolder:
    """Thread-safe holder of the latest published :class:`Snapshot` (``None`` before the first cycle)."""

    __slots__ = ("_build_lock", "_changed", "_latest", "_published_monotonic_s", "_waiters")

    def __init__(self, initial: Snapshot | None = None) -> None:
        self._latest: Snapshot | _Unbuilt | None = initial
        self._published_monotonic_s: float | None = time.monotonic() if initial is not None else None
        self._changed = threading.Condition(threading.Lock())
        self._waiters = 0
        """Threads in :meth:`wait_for_cycle` (publish takes the lock to wake them only when there are)."""
        self._build_lock = threading.Lock()
        """Held by a reader while it builds an unbuilt cycle (never by the loop)."""

    def publish(self, snapshot: Snapshot) -> None:
        """Make ``snapshot`` the latest (called by the loop once per cycle)."""
        self._swap(snapshot)

    def publish_lazy(self, cycle: int, build: Callable[[], Snapshot]) -> None:
        """Make cycle ``cycle`` the latest, built by ``build`` when first read (on the reader's thread:
        ``build`` reads only values that no longer change)."""
        self._swap(_Unbuilt(cycle, build, self._build_lock))

    def _swap(self, latest: Snapshot | _Unbuilt) -> None:
        self._latest = latest  # a single reference store: atomic for readers
        self._published_monotonic_s = time.monotonic()
        if self._waiters:  # a waiter counts itself before it reads the snapshot: none is missed
            with self._changed:
                self._changed.notify_all()

    def latest(self) -> Snapshot | None:
        """The latest snapshot, or ``None`` before the first cycle. Never waits for the loop (it may
        build the latest cycle's snapshot, once)."""
        latest = self._latest
        return latest.get() if isinstance(latest, _Unbuilt) else latest

    @property
    def latest_cycle(self) -> int | None:
        """The latest published cycle, without building its snapshot."""
        latest = self._latest
        return None if latest is None else latest.cycle

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
                    latest = self._latest
                    if latest is not None and latest.cycle >= cycle:
                        break
                    remaining_s = deadline - time.monotonic()
                    if remaining_s <= 0:
                        return None
                    self._changed.wait(remaining_s)
            finally:
                self._waiters -= 1
        return latest.get() if isinstance(latest, _Unbuilt) else latest  # built outside the lock
