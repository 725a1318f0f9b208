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

Thread count is therefore bounded by ``keys x (1 + max_abandoned_per_key)`` (plus one batch worker).

Reading many keys each sample (16 GPUs at 10 Hz) costs one thread hand-off per key and call that way -
on a 16-GPU node the hand-offs cost ~6x the reads themselves. :meth:`DeadlineExecutor.run_each` reads
the keys that never overran *in sequence on one shared batch worker* (one hand-off per sample) under
the same one deadline. The batch job records which key it is in; when it overruns:

- the keys it finished give their results; the key it is stuck in is marked overran exactly as if its
  own worker had overrun (the stuck batch thread counts as that key's abandoned thread: backoff,
  fail-fast and the abandoned-thread cap apply to it as above), and it is *isolated*: from then on it
  is always called on its own worker (it stays isolated - simple, and each abandonment isolates one
  more key, so batch abandonments are bounded by the number of keys);
- the keys not reached get a :class:`DeadlineExceeded` this time and go into a fresh batch worker next
  time - the batch itself never backs off, so a healthy key is never refused because of another.

A key that overran on its own worker (:meth:`submit`) is isolated too.

Everything here is plain threading, with no NVML in sight, so the tests drive it with functions that
sleep or block on an :class:`threading.Event`. The backoff clock is injectable (``clock``) so tests can
skip a backoff without sleeping through it.

Usage::

    ex = DeadlineExecutor(deadline_s=0.5)
    watts = ex.call(3, read_power, handle)          # value, or raises DeadlineExceeded / Wedged
    pending = [ex.submit(i, read_gpu, i) for i in range(8)]
    results = ex.wait_all(pending)                   # one shared deadline for all 8 GPUs
    results = ex.run_each([(i, read_gpu, (i,)) for i in range(8)])  # the same, one hand-off
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

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


class _BatchJob:
    """Several keys' calls run in sequence on one worker; ``current`` says which one it is in.

    ``current`` is the index of the call running now (-1: not started; ``len(calls)``: all finished),
    moved only under the executor's lock, which is also where the caller abandons the batch: so when
    the caller gives up, calls before ``current`` have their outcomes, ``current`` is the one stuck, and
    none after it will ever start.
    """

    __slots__ = ("abandoned", "calls", "current", "done", "errors", "lock", "values")

    def __init__(
        self, calls: Sequence[tuple[Hashable, Callable[..., Any], tuple[Any, ...]]], lock: threading.Lock
    ) -> None:
        self.calls = calls
        self.lock = lock
        self.values: list[Any] = [None] * len(calls)
        self.errors: list[BaseException | None] = [None] * len(calls)
        self.current = -1
        self.abandoned = False
        self.done = threading.Event()

    def run(self) -> None:
        calls, values, errors, lock = self.calls, self.values, self.errors, self.lock
        try:
            for i, (_key, fn, args) in enumerate(calls):
                with lock:
                    if self.abandoned:
                        return
                    self.current = i
                try:
                    values[i] = fn(*args)
                except BaseException as exc:  # handed to the caller as that key's outcome
                    errors[i] = exc
            with lock:
                self.current = len(calls)
        finally:
            self.done.set()


class _CallWorker:
    """A daemon thread executing the jobs of one key, in order, until stopped or abandoned."""

    def __init__(self, key: Hashable, name: str) -> None:
        self.key = key
        self.jobs: queue.SimpleQueue[_Job | _BatchJob | None] = queue.SimpleQueue()
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
    isolated: bool = False
    """The key overran once: :meth:`DeadlineExecutor.run_each` calls it on its own worker from now on."""


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
        self._batch_worker: _CallWorker | None = None
        self._closed = False
        self.handoffs = 0
        """Jobs handed to worker threads so far (a batch is one): what a sample costs in hand-offs."""

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
            self.handoffs += 1
            return Pending(key, job, worker)

    def run_each(
        self,
        calls: Sequence[tuple[Hashable, Callable[..., T], tuple[Any, ...]]],
        timeout_s: float | None = None,
    ) -> list[Outcome[T]]:
        """``fn(*args)`` for each ``(key, fn, args)``, all against one shared deadline, outcomes in order.

        Keys that never overran run in sequence on the one batch worker (one hand-off for all of
        them); isolated keys (overran before) run on their own workers as :meth:`submit` runs them, so
        a wedged key still fails fast with :class:`Wedged` while it backs off. Keys must be distinct.
        """
        budget_s = self.deadline_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget_s
        batched: list[int] = []
        own: list[tuple[int, Pending[T]]] = []
        with self._lock:
            if self._closed:
                raise RuntimeError("DeadlineExecutor is closed")
            for i, (key, _fn, _args) in enumerate(calls):
                state = self._keys.get(key)
                if state is None or not state.isolated:
                    batched.append(i)
        in_batch = set(batched)
        for i, (key, fn, args) in enumerate(calls):
            if i not in in_batch:
                own.append((i, self.submit(key, fn, *args)))
        outcomes: list[Outcome[T] | None] = [None] * len(calls)
        if batched:
            job = _BatchJob([calls[i] for i in batched], self._lock)
            with self._lock:
                if self._batch_worker is None:
                    self._batch_worker = _CallWorker("batch", self._name)
                worker = self._batch_worker
                worker.jobs.put(job)
                self.handoffs += 1
            job.done.wait(max(0.0, deadline - time.monotonic()))
            for i, outcome in zip(batched, self._batch_outcomes(job, worker, budget_s), strict=True):
                outcomes[i] = outcome
        for i, pending in own:
            outcomes[i] = self._collect(pending, deadline, budget_s)
        return cast(list[Outcome[T]], outcomes)

    def _batch_outcomes(self, job: _BatchJob, worker: _CallWorker, budget_s: float) -> list[Outcome[Any]]:
        """The batch's outcomes; if it is still running, abandon it (see :class:`_BatchJob`)."""
        with self._lock:
            stuck = job.current
            if stuck < len(job.calls):
                job.abandoned = True
                worker.abandoned = True
                if self._batch_worker is worker:
                    self._batch_worker = None
                if stuck >= 0:
                    # the stuck call's key takes the blame (and the thread) exactly as its own worker would
                    self._mark_overran(job.calls[stuck][0], worker)
        outcomes: list[Outcome[Any]] = []
        for i, (key, _fn, _args) in enumerate(job.calls):
            if i < stuck or stuck == len(job.calls):
                outcomes.append(Outcome(key, value=job.values[i], error=job.errors[i]))
            else:
                outcomes.append(Outcome(key, error=DeadlineExceeded(key, budget_s)))
        return outcomes

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
                self._mark_overran(key, worker)
                # Calls queued behind the stuck one would wait forever: fail them now.
                while True:
                    try:
                        queued = worker.jobs.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(queued, _Job):  # a key's own worker never holds batches
                        queued.fail(
                            Wedged(key, self.deadline_s, f"{key!r} is wedged: queued behind a stuck call")
                        )
            return False

    def _mark_overran(self, key: Hashable, worker: _CallWorker) -> None:
        """``worker`` is stuck in a call on ``key``: count it against the key, back off, isolate.
        Called with the lock held, after ``worker`` was abandoned."""
        state = self._keys.setdefault(key, _KeyState())
        state.abandoned.append(worker)
        state.consecutive_overruns += 1
        backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (state.consecutive_overruns - 1))
        state.retry_at = self._clock() + backoff
        state.isolated = True
        if state.worker is not None and state.worker is not worker:
            # an idle worker of the key's own (health reads) would skip the backoff: retire it
            state.worker.jobs.put(None)
            state.worker = None

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
            if self._batch_worker is not None:
                self._batch_worker.jobs.put(None)
                self._batch_worker = None
            for state in self._keys.values():
                if state.worker is not None:
                    state.worker.jobs.put(None)
                    state.worker = None

    def __enter__(self) -> DeadlineExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
