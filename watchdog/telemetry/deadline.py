"""Hard deadlines for calls that may block forever (NVML on a wedged GPU).

A call into the NVIDIA driver cannot be interrupted: a GPU that fell off the bus can keep
``nvmlDeviceGetPowerUsage`` blocked for minutes, and a monitor that waits for it stops monitoring
(dcgm-exporter issue 348 is exactly that). So calls never run on the caller's thread. Each *key* (one
per GPU, plus one for device-independent calls such as ``nvmlInit``) owns a worker thread that executes
calls from a queue; the caller waits at most ``deadline_s`` for the answer.

When a call overruns, the worker is *abandoned*: it is left blocked (a daemon thread, so it never keeps
the process alive) and will exit by itself if the call ever returns. The key is then *wedged*:

- during a backoff (``backoff_s``, doubling after each consecutive overrun up to ``max_backoff_s``)
  calls fail fast with :class:`Wedged` instead of burning another deadline on a GPU known to hang;
- after the backoff a fresh worker is started and tried once more;
- a permanently wedged GPU would otherwise leak one thread per try, so at most
  ``max_abandoned_per_key`` abandoned threads may be alive per key: while that many are still stuck,
  calls fail fast as wedged, whatever the backoff says.

Thread count is therefore bounded by ``keys x (1 + max_abandoned_per_key)``.

Everything here is plain threading, with no NVML in sight, so the tests drive it with functions that
sleep or block on an :class:`threading.Event`. The backoff clock is injectable (``clock``) so tests can
skip a backoff without sleeping through it.

Usage::

    ex = DeadlineExecutor(deadline_s=0.5)
    watts = ex.call(3, read_power, handle)          # value, or raises DeadlineExceeded / Wedged
    pending = [ex.submit(i, read_gpu, i) for i in range(8)]
    results = ex.wait_all(pending)                   # one shared deadline for all 8 GPUs
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = ["DeadlineExceeded", "DeadlineExecutor", "KeyHealth", "Outcome", "Pending", "Wedged"]


class DeadlineExceeded(TimeoutError):
    """A call did not return within its deadline (or, as :class:`Wedged`, was not even tried)."""

    def __init__(self, key: Hashable, deadline_s: float, message: str | None = None) -> None:
        self.key = key
        self.deadline_s = deadline_s
        super().__init__(message or f"call on {key!r} exceeded its {deadline_s:.3g} s deadline")


class Wedged(DeadlineExceeded):
    """Fail-fast refusal: the key overran recently (backoff) or too many of its threads are stuck."""


class _Job:
    """One call and the slot its outcome lands in."""

    __slots__ = ("args", "done", "error", "fn", "kwargs", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # handed to the caller, never lost in the worker
            self.error = exc
        finally:
            self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class _CallWorker:
    """A daemon thread executing the jobs of one key, in order, until stopped or abandoned."""

    def __init__(self, key: Hashable, name: str) -> None:
        self.key = key
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.abandoned = False
        self.thread = threading.Thread(target=self._loop, name=f"{name}-{key}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job.run()
            if self.abandoned:
                # The call that got us abandoned finally returned: leave, a fresh worker owns the key.
                return

    def alive(self) -> bool:
        return self.thread.is_alive()


@dataclass(slots=True)
class _KeyState:
    worker: _CallWorker | None = None
    abandoned: list[_CallWorker] = field(default_factory=list)
    consecutive_overruns: int = 0
    retry_at: float = 0.0
    """Clock time before which calls fail fast (backoff after an overrun)."""


@dataclass(frozen=True, slots=True)
class KeyHealth:
    """What the executor knows about one key, for logs and metrics."""

    key: Hashable
    wedged: bool
    """An overrun happened and no call has returned in time since."""
    consecutive_overruns: int
    abandoned_alive: int
    """Abandoned threads of this key still stuck in their call."""
    retry_in_s: float
    """Seconds until a fresh worker may be tried (0 when not backing off)."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """The result of one call: ``value`` or ``error`` (the call's own exception or a deadline one)."""

    key: Hashable
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def timed_out(self) -> bool:
        return isinstance(self.error, DeadlineExceeded)

    def unwrap(self) -> T:
        """The value, or raise the error."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class Pending(Generic[T]):
    """A submitted call; :meth:`DeadlineExecutor.wait` / :meth:`~DeadlineExecutor.wait_all` collect it."""

    __slots__ = ("_job", "_refused", "_worker", "key")

    def __init__(
        self, key: Hashable, job: _Job | None, worker: _CallWorker | None, refused: Wedged | None = None
    ) -> None:
        self.key = key
        self._job = job
        self._worker = worker
        self._refused = refused


class DeadlineExecutor:
    """Run calls on per-key worker threads; never wait for one longer than its deadline.

    ``deadline_s``: default wait per call. ``backoff_s`` / ``max_backoff_s``: fail-fast period after an
    overrun, doubling per consecutive overrun. ``max_abandoned_per_key``: stuck threads tolerated per
    key before the key fails fast until one of them returns. ``clock``: monotonic seconds, used only
    for backoff bookkeeping (waits use real time).
    """

    def __init__(
        self,
        deadline_s: float = 0.5,
        *,
        backoff_s: float = 5.0,
        max_backoff_s: float = 300.0,
        max_abandoned_per_key: int = 2,
        clock: Callable[[], float] = time.monotonic,
        name: str = "deadline",
    ) -> None:
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        if max_abandoned_per_key < 1:
            raise ValueError(f"max_abandoned_per_key must be >= 1, got {max_abandoned_per_key}")
        self.deadline_s = float(deadline_s)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.max_abandoned_per_key = int(max_abandoned_per_key)
        self._clock = clock
        self._name = name
        self._lock = threading.Lock()
        self._keys: dict[Hashable, _KeyState] = {}
        self._closed = False

    # -- submitting -----------------------------------------------------------------------------

    def submit(self, key: Hashable, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Pending[T]:
        """Queue ``fn(*args, **kwargs)`` on ``key``'s worker; never blocks.

        A wedged key (backoff, or too many stuck threads) yields a Pending that resolves at once to
        :class:`Wedged` - the call is not attempted.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("DeadlineExecutor is closed")
            state = self._keys.setdefault(key, _KeyState())
            state.abandoned = [w for w in state.abandoned if w.alive()]
            if state.worker is None:
                refusal = self._refusal(key, state)
                if refusal is not None:
                    return Pending(key, None, None, refusal)
                state.worker = _CallWorker(key, self._name)
            job = _Job(fn, args, kwargs)
            worker = state.worker
            worker.jobs.put(job)
            return Pending(key, job, worker)

    def _refusal(self, key: Hashable, state: _KeyState) -> Wedged | None:
        """Why a fresh worker may not be started for ``key`` now (None: it may)."""
        if len(state.abandoned) >= self.max_abandoned_per_key:
            return Wedged(
                key,
                self.deadline_s,
                f"{key!r} is wedged: {len(state.abandoned)} calls still stuck (cap "
                f"{self.max_abandoned_per_key}); failing fast until one returns",
            )
        wait_s = state.retry_at - self._clock()
        if wait_s > 0:
            return Wedged(
                key,
                self.deadline_s,
                f"{key!r} is wedged: last call overran its deadline; retrying in {wait_s:.1f} s",
            )
        return None

    # -- waiting --------------------------------------------------------------------------------

    def wait(self, pending: Pending[T], timeout_s: float | None = None) -> Outcome[T]:
        """Wait at most ``timeout_s`` (default: the executor's deadline) for one call."""
        deadline = time.monotonic() + (self.deadline_s if timeout_s is None else timeout_s)
        return self._collect(pending, deadline, self.deadline_s if timeout_s is None else timeout_s)

    def wait_all(
        self, pendings: Sequence[Pending[Any]], timeout_s: float | None = None
    ) -> list[Outcome[Any]]:
        """Wait for several calls against one shared deadline: total wait <= ``timeout_s``.

        Submit one call per GPU, then ``wait_all``: a hung GPU costs one deadline for the whole
        sample, not one per GPU.
        """
        budget_s = self.deadline_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget_s
        return [self._collect(p, deadline, budget_s) for p in pendings]

    def call(
        self, key: Hashable, fn: Callable[..., T], *args: Any, deadline_s: float | None = None, **kwargs: Any
    ) -> T:
        """``fn(*args, **kwargs)`` on ``key``'s worker: its value, its exception, or
        :class:`DeadlineExceeded` / :class:`Wedged`."""
        return self.wait(self.submit(key, fn, *args, **kwargs), deadline_s).unwrap()

    def _collect(self, pending: Pending[T], deadline: float, budget_s: float) -> Outcome[T]:
        if pending._refused is not None:
            return Outcome(pending.key, error=pending._refused)
        job, worker = pending._job, pending._worker
        assert job is not None and worker is not None
        if job.done.wait(max(0.0, deadline - time.monotonic())) or self._overran(pending.key, worker, job):
            self._returned(pending.key, worker)
            return Outcome(pending.key, value=job.value, error=job.error)
        return Outcome(pending.key, error=DeadlineExceeded(pending.key, budget_s))

    # -- bookkeeping ----------------------------------------------------------------------------

    def _overran(self, key: Hashable, worker: _CallWorker, job: _Job) -> bool:
        """Abandon ``worker`` after an overrun. Returns True if the job finished in the meantime
        (a photo finish: then it counts as on time and nothing is abandoned)."""
        with self._lock:
            if job.done.is_set():
                return True
            state = self._keys[key]
            if state.worker is worker:
                worker.abandoned = True
                state.worker = None
                state.abandoned.append(worker)
                state.consecutive_overruns += 1
                backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (state.consecutive_overruns - 1))
                state.retry_at = self._clock() + backoff
                # Calls queued behind the stuck one would wait forever: fail them now.
                while True:
                    try:
                        queued = worker.jobs.get_nowait()
                    except queue.Empty:
                        break
                    if queued is not None:
                        queued.fail(
                            Wedged(key, self.deadline_s, f"{key!r} is wedged: queued behind a stuck call")
                        )
            return False

    def _returned(self, key: Hashable, worker: _CallWorker) -> None:
        """A call came back in time (with a value or its own exception): the key is healthy again."""
        with self._lock:
            state = self._keys.get(key)
            if state is not None and state.worker is worker:
                state.consecutive_overruns = 0
                state.retry_at = 0.0

    def health(self, key: Hashable) -> KeyHealth:
        with self._lock:
            state = self._keys.get(key, _KeyState())
            alive = sum(1 for w in state.abandoned if w.alive())
            return KeyHealth(
                key=key,
                wedged=state.consecutive_overruns > 0,
                consecutive_overruns=state.consecutive_overruns,
                abandoned_alive=alive,
                retry_in_s=max(0.0, state.retry_at - self._clock()),
            )

    def abandoned_alive(self) -> int:
        """Abandoned threads, over all keys, still stuck in their call."""
        with self._lock:
            return sum(1 for s in self._keys.values() for w in s.abandoned if w.alive())

    def close(self) -> None:
        """Stop the live workers (stuck ones are left to the interpreter: they are daemon threads)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for state in self._keys.values():
                if state.worker is not None:
                    state.worker.jobs.put(None)
                    state.worker = None

    def __enter__(self) -> DeadlineExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
