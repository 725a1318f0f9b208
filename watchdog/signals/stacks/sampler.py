"""Sample each rank's Python stack with py-spy, off the cycle thread, on a per-job schedule, under a
CPU budget it reports.

The loop calls :meth:`StackSampler.request` each process period with a job's ``{rank: pid}``; the
sampler decides whether that job is due:

- ``healthy_interval_s`` (60 s) for a job whose steps advance (the stacks are then only context);
- ``blind_interval_s`` (5 s) for a job with no progress files (stacks are its only liveness evidence);
- ``suspect_interval_s`` (3 s) when the loop says so (``urgent``: a verdict other than healthy) or,
  for a job without progress files, the last dump put a rank in a collective, a save or a stack
  that has not changed - the moments when a second dump decides between a hang and a wait.

Dumps run ``py-spy dump --json`` (with ``--nonblocking`` by default: a blocking dump stops every
thread of the rank while it reads, milliseconds on a large PyTorch process) on a small thread pool,
each under ``timeout_s``. The CPU the py-spy children use is measured (``wait4`` rusage) and
summed over a rolling minute: a non-urgent dump waits while the minute's spend is above half of
``budget_cpu_s_per_min``, an urgent one while it is above the whole budget; skipped dumps are counted.

Where py-spy is missing, or ptrace is denied (``kernel.yama.ptrace_scope``, no ``CAP_SYS_PTRACE``),
:meth:`status` says so and the sampler carries on without stacks. The per-rank record
(:class:`~gpu_triage.signals.stacks.dumps.RankStack`: latest stack, since when it has not changed) is what
:meth:`summary` returns to the detector, immutable.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.dumps import (
    AVAILABLE,
    DISABLED,
    PTRACE_DENIED,
    PY_SPY_MISSING,
    RankStack,
    StackError,
    StackInfo,
    StackPhase,
    StackSummary,
    classify,
    parse_dump,
)

log = logging.getLogger("gpu_watchdog.stacks")

MAX_OUTPUT_BYTES = 4 << 20
PIPE_GRACE_S = 5.0
"""How long past its deadline a killed py-spy's pipes are read before giving up on them."""


@dataclass(frozen=True, slots=True)
class DumpResult:
    rc: int | None
    stdout: bytes
    stderr: str
    cpu_s: float
    wall_s: float
    error: str | None = None


def find_py_spy(spec: str) -> str | None:
    if spec != "auto":
        return spec if os.path.isfile(spec) and os.access(spec, os.X_OK) else None
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def run_py_spy(binary: str, pid: int, *, nonblocking: bool, timeout_s: float) -> DumpResult:
    """One ``py-spy dump --json``; the child's own CPU time from ``wait4``. Never raises. Its output
    and errors are read from two pipes with ``poll`` up to the deadline, then it is killed: no timer
    thread and no temporary file per dump (they were ~15 % of the sampler's own CPU a dump)."""
    argv = [binary, "dump", "--json", "--pid", str(pid)]
    if nonblocking:
        argv.append("--nonblocking")
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
    except OSError as e:
        return DumpResult(None, b"", "", 0.0, time.monotonic() - t0, f"cannot run {binary}: {e}")
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        out, err = _read_until(
            proc.pid, proc.stdout.fileno(), proc.stderr.fileno(), t0 + timeout_s, MAX_OUTPUT_BYTES + 1
        )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    cpu = usage.ru_utime + usage.ru_stime
    error = None
    if proc.returncode and proc.returncode < 0:
        error = f"py-spy killed after {timeout_s:.0f} s" if wall >= timeout_s else "py-spy killed"
    return DumpResult(proc.returncode, out, err.decode("utf-8", "replace"), cpu, wall, error)


def _read_until(pid: int, out_fd: int, err_fd: int, deadline: float, out_limit: int) -> tuple[bytes, bytes]:
    """``out_fd`` (up to ``out_limit`` bytes) and ``err_fd`` (8 KiB kept, the rest drained) until both
    end; ``pid`` is killed at ``deadline`` or once its output passes ``out_limit``."""
    poller = select.poll()
    for fd in (out_fd, err_fd):
        poller.register(fd, select.POLLIN)
    open_fds, out, err = {out_fd, err_fd}, bytearray(), bytearray()
    killed = False
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0 and not killed:
            _kill(pid)  # its pipes close as it dies: read on to their end
            killed = True
        if left < -PIPE_GRACE_S:  # something it started holds them open: stop reading
            break
        for fd, _ in poller.poll(1000 * (max(0.0, left) if not killed else min(1.0, PIPE_GRACE_S))):
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
            elif fd == out_fd:
                out += chunk
                if len(out) >= out_limit and not killed:
                    _kill(pid)
                    killed = True
            elif len(err) < 8192:
                err += chunk
    return bytes(out[:out_limit]), bytes(err[:8192])


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def _denied(stderr: str) -> bool:
    s = stderr.lower()
    return "permission denied" in s or "operation not permitted" in s or ("ptrace" in s and "denied" in s)


@dataclass
class _Job:
    ranks: dict[int, RankStack] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    world_size: int | None = None
    last_request: float | None = None
    in_flight: bool = False


Runner = Callable[[str, int], DumpResult]


class StackSampler:
    """Thread-safe: the loop calls :meth:`request` / :meth:`summary`; dumps run on a pool."""

    def __init__(
        self,
        config: StacksConfig | None = None,
        *,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        config = StacksConfig() if config is None else config
        self.config = config
        self.clock = clock
        self.monotonic = monotonic
        self.binary = find_py_spy(config.py_spy) if config.enabled else None
        self._runner = runner
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._spend: deque[tuple[float, float]] = deque()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.state = (
            DISABLED
            if not config.enabled
            else (AVAILABLE if (self.binary is not None or runner is not None) else PY_SPY_MISSING)
        )
        self.detail: str | None = (
            None if self.state != PY_SPY_MISSING else f"py-spy not found ({config.py_spy})"
        )
        self.dumps_total = 0
        self.failures_total = 0
        self.skipped_budget_total = 0
        self.cpu_s_total = 0.0
        self.wall_s_total = 0.0
        self.last_dump_wall_s: float | None = None

    # -- the loop's side ----------------------------------------------------------------------------
    def request(
        self,
        now: float,
        job: str,
        pids: Mapping[int, int],
        *,
        urgent: bool = False,
        blind: bool = False,
        world_size: int | None = None,
    ) -> bool:
        """Schedule a dump of every rank of ``job`` if due; True when one was started."""
        if self.state in (DISABLED, PY_SPY_MISSING, PTRACE_DENIED) or not pids:
            return False
        cfg = self.config
        with self._lock:
            j = self._jobs.setdefault(job, _Job())
            j.world_size = world_size
            for r in set(j.ranks) - set(pids):
                j.ranks.pop(r, None)
            for r, pid in pids.items():
                if j.pids.get(r) not in (None, pid):
                    j.ranks.pop(r, None)  # a new process: its old stack says nothing
            j.pids = dict(pids)
            if j.in_flight:
                return False
            # a job whose steps advance is only suspicious when the loop says so; a job without
            # progress files also when its last dump found a rank waiting or an unchanged stack
            suspicious = urgent or (blind and self._suspicious(j))
            interval = (
                cfg.suspect_interval_s
                if suspicious
                else (cfg.blind_interval_s if blind else cfg.healthy_interval_s)
            )
            if j.last_request is not None and now - j.last_request < interval - 1e-6:
                return False
            spent = self._spent_locked(self.monotonic())
            limit = cfg.budget_cpu_s_per_min * (1.0 if suspicious else 0.5)
            if spent >= limit:
                self.skipped_budget_total += 1
                return False
            j.last_request = now
            j.in_flight = True
            targets = dict(pids)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max(1, cfg.max_parallel), thread_name_prefix="stack-sampler"
            )
        self._pool.submit(self._sample_job, job, targets, limit)
        return True

    def summary(self, job: str) -> StackSummary | None:
        with self._lock:
            j = self._jobs.get(job)
            if j is None or (not j.ranks and not j.errors):
                return None
            return StackSummary(dict(j.ranks), j.world_size, dict(j.errors), self.state)

    def forget(self, keep: set[str]) -> None:
        """Drop the records of jobs no longer seen."""
        with self._lock:
            for job in set(self._jobs) - keep:
                if not self._jobs[job].in_flight:
                    del self._jobs[job]

    def status(self) -> dict[str, Any]:
        with self._lock:
            spent = self._spent_locked(self.monotonic())
        return {
            "state": self.state,
            "detail": self.detail,
            "py_spy": self.binary,
            "nonblocking": self.config.nonblocking,
            "cpu_s_last_min": round(spent, 4),
            "budget_cpu_s_per_min": self.config.budget_cpu_s_per_min,
            "dumps_total": self.dumps_total,
            "failures_total": self.failures_total,
            "skipped_budget_total": self.skipped_budget_total,
            "cpu_s_total": round(self.cpu_s_total, 4),
            "mean_dump_wall_s": round(self.wall_s_total / self.dumps_total, 4) if self.dumps_total else None,
        }

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """For tests and benchmarks: wait until no dump is in flight."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if not any(j.in_flight for j in self._jobs.values()):
                    return True
            time.sleep(0.01)
        return False

    # -- internals -------------------------------------------------------------------------------
    @staticmethod
    def _suspicious(j: _Job) -> bool:
        waiting = (StackPhase.COLLECTIVE, StackPhase.CHECKPOINT)
        return any(s.info.phase in waiting or s.samples > 1 for s in j.ranks.values())

    def _spent_locked(self, mono: float) -> float:
        while self._spend and mono - self._spend[0][0] > 60.0:
            self._spend.popleft()
        return sum(c for _, c in self._spend)

    def _dump(self, pid: int) -> DumpResult:
        if self._runner is not None:
            return self._runner(self.binary or "py-spy", pid)
        assert self.binary is not None
        return run_py_spy(
            self.binary, pid, nonblocking=self.config.nonblocking, timeout_s=self.config.timeout_s
        )

    def _sample_job(self, job: str, pids: Mapping[int, int], limit: float | None = None) -> None:
        try:
            for rank, pid in sorted(pids.items()):
                if self.state == PTRACE_DENIED:
                    break
                if limit is not None:
                    with self._lock:
                        over = self._spent_locked(self.monotonic()) >= limit
                        if over:
                            self.skipped_budget_total += 1
                    if over:  # the rest of this round waits for the next one
                        break
                res = self._dump(pid)
                at = self.clock()
                self._record(job, rank, pid, res, at)
        except Exception:  # never let a dump take the sampler down
            log.exception("stack sampling of %s failed", job)
        finally:
            with self._lock:
                j = self._jobs.get(job)
                if j is not None:
                    j.in_flight = False

    def _record(self, job: str, rank: int, pid: int, res: DumpResult, at: float) -> None:
        info: StackInfo | None = None
        error = res.error
        if error is None and res.rc == 0:
            try:
                info = classify(parse_dump(res.stdout))
            except StackError as e:
                error = str(e)
        elif error is None:
            first = res.stderr.strip().splitlines()[0] if res.stderr.strip() else f"exit {res.rc}"
            error = first[:300]
        with self._lock:
            self._spend.append((self.monotonic(), res.cpu_s))
            self.dumps_total += 1
            self.cpu_s_total += res.cpu_s
            self.wall_s_total += res.wall_s
            self.last_dump_wall_s = res.wall_s
            j = self._jobs.get(job)
            if info is None:
                self.failures_total += 1
                if res.rc not in (None, 0) and _denied(res.stderr) and self.state == AVAILABLE:
                    self.state, self.detail = PTRACE_DENIED, f"ptrace denied for pid {pid}: {error}"
                    log.warning("stack sampling off: %s", self.detail)
                elif res.rc is None and self.state == AVAILABLE and "cannot run" in (error or ""):
                    self.state, self.detail = PY_SPY_MISSING, error
                if j is not None:
                    j.errors[rank] = error or "failed"
                return
            if j is None or j.pids.get(rank) != pid:
                return
            j.errors.pop(rank, None)
            old = j.ranks.get(rank)
            if old is not None and old.pid == pid and old.info.fingerprint == info.fingerprint:
                j.ranks[rank] = RankStack(rank, pid, info, at, old.same_since, old.samples + 1)
            else:
                j.ranks[rank] = RankStack(rank, pid, info, at, at, 1)


__all__ = [
    "AVAILABLE",
    "DISABLED",
    "PTRACE_DENIED",
    "PY_SPY_MISSING",
    "DumpResult",
    "StackSampler",
    "StackSummary",
    "find_py_spy",
    "run_py_spy",
]
