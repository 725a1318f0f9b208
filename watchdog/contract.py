"""The progress contract, in one place: the fields, the phases, the file layout, the writer.

Each rank of a training job tells the watchdog on its node what it is doing by writing one JSON object,
atomically (a temp file in the same directory, then rename), to
``$GPU_WATCHDOG_PROGRESS_DIR/<job>/rank-<rank>.json`` (default directory ``/run/gpu-watchdog/progress``),
at most once a second and at every phase change::

    {"job": "qwen3-32b-ft", "rank": 3, "local_rank": 3, "world_size": 16, "pid": 12345, "host": "node-a",
     "step": 1200, "epoch": 1, "tokens": 157286400, "phase": "train", "lease_until": null,
     "time": 1764681234.5, "lease_scope": "job"}

``step`` is the optimizer step, ``tokens`` the tokens this rank consumed in the run, ``phase`` one of
:data:`PHASES`. A phase other than ``train`` carries ``lease_until`` (epoch seconds): the trainer's
promise of when it will be back - short, derived from measured durations (:class:`LeaseEstimator`).
The optional ``lease_scope`` (:data:`LEASE_SCOPES`) is ``"job"`` when the writer announces every
collective phase (save, eval, epoch end) on *every* rank, the waiting ranks included, so one rank in
``checkpoint`` while another sits frozen in ``train`` is a contradiction (a hang), not a save; ``"rank"``
(or absent) when only the ranks doing the work announce it.

The optional ``step_time`` and ``phase_time`` (epoch seconds, written by this writer) say when ``step``
last changed and when ``phase`` was entered. ``time`` is when the file was written - and a flusher
rewrites it every ``heartbeat_s`` while the rank is blocked - so a reader that starts during a hang (a
restarted watchdog) can only date the frozen step right from ``step_time``. Readers that do not know
them ignore them; without them a reader falls back to ``time``.

Who uses this module: the daemon's reader (``gpu_triage.signals.progress``) takes its field names, phases and
limits from here; this project's trainer (``ft_trainer.train``) and the
framework integrations (``gpu_triage.integrations``) write through :class:`ProgressWriter`.

It imports nothing but the standard library: the base install (no dependencies) puts it into any
training environment, and importing it never loads the daemon's dependencies (numpy, psutil, ...).

The writer never raises or blocks because the directory is missing or unwritable: it logs once and
carries on (retrying at the next write). No fsync: the directory is a tmpfs under /run and only the
watchdog on the same node reads it; rename alone makes each file whole. Programming errors (an unknown
phase, a non-train phase without a lease) raise ``ValueError``. A process forked from the writer's
(a DataLoader worker) never writes: only the process that created the writer speaks for its rank.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV_DIR = "GPU_WATCHDOG_PROGRESS_DIR"
ENV_JOB = "GPU_WATCHDOG_JOB"
DEFAULT_DIR = Path("/run/gpu-watchdog/progress")
PHASES = ("init", "train", "eval", "checkpoint", "epoch_end", "done")
"""Every phase but ``train`` carries a lease."""
FIELDS = (
    "job",
    "rank",
    "local_rank",
    "world_size",
    "pid",
    "host",
    "step",
    "epoch",
    "tokens",
    "phase",
    "lease_until",
    "time",
)
"""The contract's required fields, in the order they are written."""
OPTIONAL_FIELDS = ("lease_scope", "step_time", "phase_time")
"""Fields a reader accepts when present (written after the required ones)."""
LEASE_SCOPES = ("job", "rank")
MIN_INTERVAL_S = 1.0
"""A writer writes at most once per this many seconds (phase changes excepted)."""
STALE_AFTER_S = 600.0
"""A file not written for this long, without a live lease, is stale."""
MAX_FILE_BYTES = 64 * 1024
"""A reader refuses bigger files (the directory is writable by every training user)."""
MAX_JOB_NAME = 200
_DIR_MODE = 0o2755
"""setgid: job directories keep the progress directory's group (gpu-train), which may read them; only
the job's owner may write: another training user can neither plant nor replace a rank file there."""
_FILE_MODE = 0o644


def progress_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$GPU_WATCHDOG_PROGRESS_DIR`` or the default ``/run/gpu-watchdog/progress``."""
    env = os.environ if env is None else env
    value = env.get(ENV_DIR, "").strip()
    return Path(value) if value else DEFAULT_DIR


def rank_file(directory: Path, job: str, rank: int) -> Path:
    return directory / job / f"rank-{rank}.json"


def check_job_name(job: str) -> str:
    """A job name is one path component: letters, digits, ``-``, ``_``, ``.``; not starting with ``.``."""
    if (
        not job
        or job.startswith(".")
        or len(job) > MAX_JOB_NAME
        or not all(c.isalnum() or c in "-_." for c in job)
    ):
        raise ValueError(
            f"job name {job!r}: use letters, digits, '-', '_' and '.' (not first), at most {MAX_JOB_NAME}"
        )
    return job


def check_lease_scope(scope: str | None) -> str | None:
    if scope is not None and scope not in LEASE_SCOPES:
        raise ValueError(f"lease_scope {scope!r}: one of {', '.join(LEASE_SCOPES)} (or None)")
    return scope


# ------------------------------------------------------------------------------------------- leases


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How a lease follows from measured durations: ``factor x longest seen + slack_s``, clamped to
    ``[min_s, max_s]``; ``first_s[phase]`` before anything was measured. ``keep_alive_factor``: the
    background flusher may renew a lease while its phase lasts, up to this many times the announced
    lease in total (a rank hung inside a save still loses its lease, later)."""

    factor: float = 2.0
    slack_s: float = 30.0
    min_s: float = 30.0
    max_s: float = 7200.0
    keep_alive_factor: float = 2.0
    first_s: Mapping[str, float] = field(
        default_factory=lambda: {
            "init": 900.0,
            "eval": 600.0,
            "checkpoint": 600.0,
            "epoch_end": 120.0,
            "done": 120.0,
        }
    )

    def __post_init__(self) -> None:
        if not (self.factor >= 1 and self.slack_s >= 0 and 0 < self.min_s <= self.max_s):
            raise ValueError(f"lease policy: need factor >= 1, slack_s >= 0, 0 < min_s <= max_s: {self}")
        if self.keep_alive_factor < 1:
            raise ValueError(f"lease policy: keep_alive_factor must be >= 1, got {self.keep_alive_factor}")
        unknown = [p for p in self.first_s if p not in PHASES or p == "train"]
        if unknown:
            raise ValueError(f"lease policy first_s: not a leased phase: {', '.join(unknown)}")


class LeaseEstimator:
    """Leases from measured durations: after each phase, :meth:`observe` its duration; :meth:`lease_s`
    is then ``factor x the longest seen + slack`` (clamped), so one slow save raises the next lease at
    once and a lease never shrinks below what the job has already needed."""

    def __init__(self, policy: LeasePolicy | None = None) -> None:
        self.policy = policy or LeasePolicy()
        self._longest_s: dict[str, float] = {}
        self.observed: dict[str, int] = {}

    def observe(self, phase: str, duration_s: float) -> None:
        if phase not in PHASES or phase == "train":
            raise ValueError(f"observe: {phase!r} is not a leased phase")
        if duration_s >= 0:
            self._longest_s[phase] = max(self._longest_s.get(phase, 0.0), duration_s)
            self.observed[phase] = self.observed.get(phase, 0) + 1

    def longest_s(self, phase: str) -> float | None:
        return self._longest_s.get(phase)

    def lease_s(self, phase: str) -> float:
        p = self.policy
        longest = self._longest_s.get(phase)
        if longest is None:
            return min(p.max_s, max(p.min_s, p.first_s.get(phase, p.min_s)))
        return min(p.max_s, max(p.min_s, p.factor * longest + p.slack_s))

    def keep_alive_s(self, phase: str) -> float:
        """How long, in total from the phase's start, the flusher may keep its lease alive."""
        return min(self.policy.max_s, self.policy.keep_alive_factor * self.lease_s(phase))


# ------------------------------------------------------------------------------------------- writer


class ProgressWriter:
    """Writes one rank's progress file. Cheap to call every step; thread-safe (a flusher thread may
    write beside the training thread). See the module docstring.

    Usage::

        progress = ProgressWriter.from_env("qwen3-32b-ft", lease_scope="job")  # RANK, LOCAL_RANK, ...
        progress.phase("init", lease_s=600)
        progress.phase("train")
        for step in ...:
            progress.step(step, epoch=epoch, tokens=tokens)    # written at most once a second
        progress.phase("checkpoint", lease_s=measured_save_s * 2)
        progress.phase("train")
        progress.phase("done", lease_s=60)
    """

    def __init__(
        self,
        job: str,
        rank: int,
        local_rank: int,
        world_size: int,
        *,
        directory: Path | str | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
        min_interval_s: float = MIN_INTERVAL_S,
        pid: int | None = None,
        host: str | None = None,
        lease_scope: str | None = None,
    ) -> None:
        """``directory`` defaults to ``$GPU_WATCHDOG_PROGRESS_DIR`` or ``/run/gpu-watchdog/progress``;
        ``clock`` returns epoch seconds (the values written; injected in tests); ``monotonic`` measures
        the rate limit, the heartbeat and lease renewals (default ``time.monotonic``, or ``clock`` when
        only ``clock`` is injected), so a step of the wall clock never stops or floods writes;
        ``lease_scope`` (``"job"``, ``"rank"`` or
        None: not written) says whether every rank announces every collective phase."""
        if not (0 <= rank < world_size and local_rank >= 0):
            raise ValueError(f"rank {rank}, local_rank {local_rank}, world_size {world_size}: inconsistent")
        self.job = check_job_name(job)
        self.directory = Path(directory) if directory is not None else progress_dir()
        self.path = rank_file(self.directory, job, rank)
        self._clock = clock
        if monotonic is None:
            monotonic = time.monotonic if clock is time.time else clock
        self._mono = monotonic
        self._min_interval_s = min_interval_s
        self._owner_pid = os.getpid()
        self._record: dict[str, Any] = {
            "job": job,
            "rank": rank,
            "local_rank": local_rank,
            "world_size": world_size,
            "pid": self._owner_pid if pid is None else pid,
            "host": os.uname().nodename if host is None else host,
            "step": 0,
            "epoch": 0,
            "tokens": 0,
            "phase": "init",
            "lease_until": None,
            "time": 0.0,
        }
        if check_lease_scope(lease_scope) is not None:
            self._record["lease_scope"] = lease_scope
        self._record["step_time"] = None  # set when the step changes (or at the first write)
        self._record["phase_time"] = None
        self._lock = threading.RLock()
        self._last_write_s: float | None = None
        self._dirty = False
        self._failing = False
        self._lease_s: float | None = None
        self._keep_alive_until_s: float | None = None
        self._lease_until_m: float | None = None
        """The lease's end on the monotonic clock (renewals are timed on it, not on the wall clock)."""
        self.writes_total = 0
        self.failures_total = 0
        self.renewals_total = 0
        self.on_write: Callable[[dict[str, Any]], None] | None = None
        """Called with a copy of each record written (the trainer keeps a history with it)."""

    @classmethod
    def from_env(
        cls,
        job: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> ProgressWriter:
        """Rank facts from the launcher's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, set by
        torchrun, deepspeed and accelerate); ``job`` defaults to ``$GPU_WATCHDOG_JOB``; the directory
        to ``$GPU_WATCHDOG_PROGRESS_DIR``."""
        env = os.environ if env is None else env
        job = job or env.get(ENV_JOB)
        if not job:
            raise ValueError(f"no job name: pass one or set {ENV_JOB}")
        kwargs.setdefault("directory", progress_dir(env))
        return cls(
            job,
            int(env.get("RANK", "0")),
            int(env.get("LOCAL_RANK", "0")),
            int(env.get("WORLD_SIZE", "1")),
            **kwargs,
        )

    @property
    def record(self) -> dict[str, Any]:
        """A copy of what the file holds (or will hold at the next write)."""
        with self._lock:
            return dict(self._record)

    @property
    def current_phase(self) -> str:
        return str(self._record["phase"])

    @property
    def min_interval_s(self) -> float:
        return self._min_interval_s

    def _mine(self) -> bool:
        return os.getpid() == self._owner_pid

    def step(
        self, step: int, *, epoch: int | None = None, tokens: int | None = None, write: bool = True
    ) -> bool:
        """Report the optimizer step (and epoch, tokens consumed). Written if at least
        ``min_interval_s`` has passed since the last write, else kept for the next one (or for a
        flusher); ``write=False`` only records it (a phase change about to follow writes it).
        Returns whether the file was written."""
        if not self._mine():
            return False
        with self._lock:
            if int(step) != self._record["step"] or self._record["step_time"] is None:
                self._record["step_time"] = round(self._clock(), 3)
            self._record["step"] = int(step)
            if epoch is not None:
                self._record["epoch"] = int(epoch)
            if tokens is not None:
                self._record["tokens"] = int(tokens)
            self._dirty = True
            if not write:
                return False
            if self._last_write_s is not None and self._mono() - self._last_write_s < self._min_interval_s:
                return False
            return self._write(self._clock())

    def phase(self, phase: str, *, lease_s: float | None = None, keep_alive_s: float | None = None) -> bool:
        """Enter ``phase`` (always written, even within the rate limit). Every phase but ``train`` needs
        ``lease_s``: how long, from now, until the rank is back (``lease_until = now + lease_s``).
        ``keep_alive_s`` (>= ``lease_s``): how long in total a flusher may renew the lease while the
        phase lasts (:meth:`tick`); None: never renewed. Calling again with the same phase renews the
        lease. Returns whether the file was written."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")
        if phase == "train":
            if lease_s is not None or keep_alive_s is not None:
                raise ValueError("the train phase carries no lease: steps advancing are its proof of life")
        elif lease_s is None or not lease_s > 0:
            raise ValueError(f"phase {phase!r} needs lease_s > 0 (when will this rank be back?)")
        if keep_alive_s is not None and lease_s is not None and keep_alive_s < lease_s:
            raise ValueError(f"keep_alive_s {keep_alive_s} is shorter than the lease {lease_s}")
        if not self._mine():
            return False
        with self._lock:
            now_s = self._clock()
            if phase != self._record["phase"] or self._record["phase_time"] is None:
                self._record["phase_time"] = round(now_s, 3)
            self._record["phase"] = phase
            self._record["lease_until"] = None if lease_s is None else round(now_s + lease_s, 3)
            self._lease_s = lease_s
            mono = self._mono()
            self._lease_until_m = None if lease_s is None else mono + lease_s
            self._keep_alive_until_s = None if keep_alive_s is None else mono + keep_alive_s
            self._dirty = True
            return self._write(now_s)

    def flush(self) -> bool:
        """Write now if anything changed since the last write (e.g. before a blocking call)."""
        if not self._mine():
            return False
        with self._lock:
            if not self._dirty:
                return False
            return self._write(self._clock())

    def tick(self, *, heartbeat_s: float | None = None) -> bool:
        """What a flusher thread calls while the training thread may be blocked: write a pending step
        once the rate limit allows, renew a lease that is half spent (within its ``keep_alive_s``), and
        rewrite the file every ``heartbeat_s`` so it never looks silent. Returns whether it wrote."""
        if not self._mine():
            return False
        with self._lock:
            now_s, mono = self._clock(), self._mono()
            since = None if self._last_write_s is None else mono - self._last_write_s
            until_m = self._lease_until_m
            if (
                self._record["lease_until"] is not None
                and until_m is not None
                and self._lease_s is not None
                and self._keep_alive_until_s is not None
                and until_m < self._keep_alive_until_s
                and until_m - mono < self._lease_s / 2
            ):
                self._lease_until_m = min(mono + self._lease_s, self._keep_alive_until_s)
                self._record["lease_until"] = round(now_s + (self._lease_until_m - mono), 3)
                self.renewals_total += 1
                return self._write(now_s)
            if since is not None and since < self._min_interval_s:
                return False
            if self._dirty or (heartbeat_s is not None and (since is None or since >= heartbeat_s)):
                return self._write(now_s)
            return False

    def _write(self, now_s: float) -> bool:
        self._last_write_s = self._mono()  # also rate-limits retries into a broken directory
        self._record["time"] = round(now_s, 3)
        for key in ("step_time", "phase_time"):
            if self._record[key] is None:
                self._record[key] = self._record["time"]
        data = json.dumps(self._record, separators=(", ", ": ")).encode() + b"\n"
        tmp = self.path.with_name(f".{self.path.name}.{self._record['pid']}.tmp")
        try:
            self.path.parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _FILE_MODE)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as e:
            self.failures_total += 1
            if not self._failing:
                log.warning(
                    "cannot write progress file %s (%s); training continues without watchdog progress "
                    "(set %s to a writable directory)",
                    self.path,
                    e,
                    ENV_DIR,
                )
                self._failing = True
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        if self._failing:
            log.info("progress file %s written again", self.path)
            self._failing = False
        self._dirty = False
        self.writes_total += 1
        if self.on_write is not None:
            try:
                self.on_write(dict(self._record))
            except Exception:  # a history sink must never break training
                log.exception("progress on_write hook failed")
        return True


class Flusher:
    """A daemon thread that calls :meth:`ProgressWriter.tick` every ``interval_s / 2``: while the
    training thread sits in a long collective (which releases the GIL), the file still gets its last
    step, its heartbeat and its lease renewals. ``stop()`` ends it within one period; a forked child
    (a DataLoader worker) has no flusher and its writer refuses to write."""

    def __init__(
        self,
        writer: ProgressWriter,
        *,
        interval_s: float = MIN_INTERVAL_S,
        heartbeat_s: float = 30.0,
    ) -> None:
        if not interval_s > 0 or not heartbeat_s > 0:
            raise ValueError("flusher: interval_s and heartbeat_s must be > 0")
        self.writer = writer
        self.interval_s = interval_s
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Flusher:
        if not self.running:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="gpu-watchdog-progress", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s / 2):
            try:
                self.writer.tick(heartbeat_s=self.heartbeat_s)
            except Exception:  # never let the flusher die silently mid-run
                log.exception("progress flusher: tick failed")

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def __enter__(self) -> Flusher:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
