"""The trainer's side of the progress contract: each rank tells the watchdog what it is doing.

Contract (see DESIGN "Trainer <-> watchdog"): each rank writes one JSON object, atomically (a temp file
in the same directory, then rename), to ``$GPU_WATCHDOG_PROGRESS_DIR/<job>/rank-<rank>.json`` (default
directory ``/run/gpu-watchdog/progress``), at most once a second and at every phase change::

    {"job": "qwen3-32b-ft", "rank": 3, "local_rank": 3, "world_size": 16, "pid": 12345, "host": "node-a",
     "step": 1200, "epoch": 1, "tokens": 157286400, "phase": "train", "lease_until": null,
     "time": 1764681234.5}

``step`` is the optimizer step, ``tokens`` the tokens this rank consumed in the run, ``phase`` one of
:data:`PHASES`. A phase other than ``train`` carries ``lease_until`` (epoch seconds): the trainer's
promise of when it will be back - keep it short, derived from measured durations (a lease held by
some ranks never excuses frozen steps on the others).

Usage::

    progress = ProgressWriter.from_env("qwen3-32b-ft")    # RANK, LOCAL_RANK, WORLD_SIZE
    progress.phase("init", lease_s=600)
    progress.phase("train")
    for step in ...:
        progress.step(step, epoch=epoch, tokens=tokens)    # written at most once a second
    progress.phase("checkpoint", lease_s=measured_save_s * 2)
    progress.phase("train")
    progress.phase("done", lease_s=60)

The writer never raises or blocks because the directory is missing or unwritable: it logs once and
carries on (retrying at the next write). No fsync: the directory is a tmpfs under /run and only the
watchdog on the same node reads it; rename alone makes each file whole. Programming errors (an unknown
phase, a non-train phase without a lease) do raise ``ValueError``.

This module imports nothing from ``watchdog`` (and nothing heavy): the daemon's tests use it to write
the files exactly as the trainer does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV_DIR = "GPU_WATCHDOG_PROGRESS_DIR"
ENV_JOB = "GPU_WATCHDOG_JOB"
DEFAULT_DIR = Path("/run/gpu-watchdog/progress")
PHASES = ("init", "train", "eval", "checkpoint", "epoch_end", "done")
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
"""The contract's fields, in the order they are written."""
MIN_INTERVAL_S = 1.0
_DIR_MODE = 0o2775  # setgid: job directories keep the progress directory's group (gpu-train)
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
    if not job or job.startswith(".") or len(job) > 200 or not all(c.isalnum() or c in "-_." for c in job):
        raise ValueError(f"job name {job!r}: use letters, digits, '-', '_' and '.' (not first), at most 200")
    return job


class ProgressWriter:
    """Writes one rank's progress file. Cheap to call every step; see the module docstring."""

    def __init__(
        self,
        job: str,
        rank: int,
        local_rank: int,
        world_size: int,
        *,
        directory: Path | str | None = None,
        clock: Callable[[], float] = time.time,
        min_interval_s: float = MIN_INTERVAL_S,
        pid: int | None = None,
        host: str | None = None,
    ) -> None:
        """``directory`` defaults to ``$GPU_WATCHDOG_PROGRESS_DIR`` or ``/run/gpu-watchdog/progress``;
        ``clock`` returns epoch seconds (injected in tests)."""
        if not (0 <= rank < world_size and local_rank >= 0):
            raise ValueError(f"rank {rank}, local_rank {local_rank}, world_size {world_size}: inconsistent")
        self.job = check_job_name(job)
        self.directory = Path(directory) if directory is not None else progress_dir()
        self.path = rank_file(self.directory, job, rank)
        self._clock = clock
        self._min_interval_s = min_interval_s
        self._record: dict[str, Any] = {
            "job": job,
            "rank": rank,
            "local_rank": local_rank,
            "world_size": world_size,
            "pid": os.getpid() if pid is None else pid,
            "host": socket.gethostname() if host is None else host,
            "step": 0,
            "epoch": 0,
            "tokens": 0,
            "phase": "init",
            "lease_until": None,
            "time": 0.0,
        }
        self._last_write_s: float | None = None
        self._dirty = False
        self._failing = False
        self.writes_total = 0
        self.failures_total = 0

    @classmethod
    def from_env(
        cls,
        job: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> ProgressWriter:
        """Rank facts from the launcher's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, set by
        torchrun and deepspeed); ``job`` defaults to ``$GPU_WATCHDOG_JOB``; the directory to
        ``$GPU_WATCHDOG_PROGRESS_DIR``."""
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
        return dict(self._record)

    def step(self, step: int, *, epoch: int | None = None, tokens: int | None = None) -> bool:
        """Report the optimizer step (and epoch, tokens consumed). Written if at least
        ``min_interval_s`` has passed since the last write, else kept for the next one.
        Returns whether the file was written."""
        self._record["step"] = int(step)
        if epoch is not None:
            self._record["epoch"] = int(epoch)
        if tokens is not None:
            self._record["tokens"] = int(tokens)
        self._dirty = True
        now_s = self._clock()
        if self._last_write_s is not None and now_s - self._last_write_s < self._min_interval_s:
            return False
        return self._write(now_s)

    def phase(self, phase: str, *, lease_s: float | None = None) -> bool:
        """Enter ``phase`` (always written, even within the rate limit). Every phase but ``train`` needs
        ``lease_s``: how long, from now, until the rank is back (``lease_until = now + lease_s``).
        Calling again with the same phase renews the lease. Returns whether the file was written."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")
        if phase == "train":
            if lease_s is not None:
                raise ValueError("the train phase carries no lease: steps advancing are its proof of life")
        elif lease_s is None or not lease_s > 0:
            raise ValueError(f"phase {phase!r} needs lease_s > 0 (when will this rank be back?)")
        now_s = self._clock()
        self._record["phase"] = phase
        self._record["lease_until"] = None if lease_s is None else round(now_s + lease_s, 3)
        self._dirty = True
        return self._write(now_s)

    def flush(self) -> bool:
        """Write now if anything changed since the last write (e.g. before a blocking call)."""
        if not self._dirty:
            return False
        return self._write(self._clock())

    def _write(self, now_s: float) -> bool:
        self._last_write_s = now_s  # also rate-limits retries into a broken directory
        self._record["time"] = round(now_s, 3)
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
        return True
