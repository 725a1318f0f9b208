"""The plain-loop integration: a few lines in any training loop, no framework needed.

::

    from gpu_triage.integrations import Progress

    with Progress.from_env("my-job") as progress:      # RANK/LOCAL_RANK/WORLD_SIZE from torchrun
        progress.train()
        for step, batch in enumerate(loader, 1):
            ...                                         # forward, backward, optimizer step
            progress.step(step, epoch=epoch, tokens=tokens_seen)
            if step % 500 == 0:
                with progress.checkpoint():             # on every rank: the save is collective
                    save(...)
        with progress.eval():
            evaluate(...)
    # leaving the block writes "done"

Each phase block announces a lease derived from the measured durations of the same phase
(:class:`~gpu_triage.contract.LeaseEstimator`), measures this one, and returns to the phase it
interrupted. A background :class:`~gpu_triage.contract.Flusher` keeps the file current while the loop
sits in a long collective: the last step is written, the file is rewritten every ``heartbeat_s``, and a
phase's lease is renewed while it lasts - up to ``keep_alive_factor`` times the lease, so a rank hung in
a save still loses its lease.

``lease_scope="job"`` (the default) promises that *every* rank enters every collective phase block
(save, eval, epoch end), the ranks that only wait included: the watchdog then reads one rank in
``checkpoint`` while another is frozen in ``train`` as a hang. Pass ``lease_scope="rank"`` when only some
ranks announce a phase (rank 0 evaluating alone).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpu_triage.contract import (
    ENV_JOB,
    PHASES,
    Flusher,
    LeaseEstimator,
    LeasePolicy,
    ProgressWriter,
    progress_dir,
)

__all__ = ["Progress"]


class Progress:
    """One rank's progress session: a writer, its flusher and the measured-duration leases."""

    def __init__(
        self,
        writer: ProgressWriter,
        *,
        policy: LeasePolicy | None = None,
        flusher: bool = True,
        heartbeat_s: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.writer = writer
        self.leases = LeaseEstimator(policy)
        self._monotonic = monotonic
        self._stack: list[tuple[str, float, str]] = []
        """Open phase blocks: (phase, start on the monotonic clock, the phase to return to)."""
        self._closed = False
        self.flusher = Flusher(writer, interval_s=writer.min_interval_s, heartbeat_s=heartbeat_s)
        self.enter("init")
        if flusher:
            self.flusher.start()

    @classmethod
    def from_env(
        cls,
        job: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        lease_scope: str | None = "job",
        directory: Path | str | None = None,
        policy: LeasePolicy | None = None,
        flusher: bool = True,
        **writer_kwargs: Any,
    ) -> Progress:
        """Rank facts from ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` (torchrun, deepspeed, accelerate
        launch); the job from ``job`` or ``$GPU_WATCHDOG_JOB``; the directory from
        ``$GPU_WATCHDOG_PROGRESS_DIR`` (default ``/run/gpu-watchdog/progress``)."""
        writer = ProgressWriter.from_env(
            job,
            env=env,
            lease_scope=lease_scope,
            **({"directory": directory} if directory is not None else {}),
            **writer_kwargs,
        )
        return cls(writer, policy=policy, flusher=flusher)

    @classmethod
    def for_rank(
        cls,
        job: str | None,
        rank: int,
        local_rank: int,
        world_size: int,
        *,
        env: Mapping[str, str] | None = None,
        lease_scope: str | None = "job",
        directory: Path | str | None = None,
        policy: LeasePolicy | None = None,
        flusher: bool = True,
        **writer_kwargs: Any,
    ) -> Progress:
        """Rank facts from a framework (a Lightning trainer, an accelerate ``Accelerator``)."""
        env = os.environ if env is None else env
        job = job or env.get(ENV_JOB)
        if not job:
            raise ValueError(f"no job name: pass one or set {ENV_JOB}")
        writer = ProgressWriter(
            job,
            rank,
            local_rank,
            world_size,
            directory=directory if directory is not None else progress_dir(env),
            lease_scope=lease_scope,
            **writer_kwargs,
        )
        return cls(writer, policy=policy, flusher=flusher)

    # -- state ------------------------------------------------------------------------------------
    @property
    def phase_now(self) -> str:
        return self.writer.current_phase

    @property
    def path(self) -> Path:
        return self.writer.path

    # -- phases -----------------------------------------------------------------------------------
    def enter(self, phase: str) -> None:
        """Announce ``phase`` now (``train``: no lease; any other: a lease from measured durations)."""
        if phase == "train":
            self.writer.phase("train")
        else:
            self.writer.phase(
                phase, lease_s=self.leases.lease_s(phase), keep_alive_s=self.leases.keep_alive_s(phase)
            )

    def train(self, step: int | None = None, *, epoch: int | None = None, tokens: int | None = None) -> None:
        """Training (again): steps advancing are the proof of life. ``step`` (a resume's position) goes
        into the same write."""
        if step is not None:
            self.writer.step(step, epoch=epoch, tokens=tokens, write=False)
        self.writer.phase("train")

    def step(self, step: int, *, epoch: int | None = None, tokens: int | None = None) -> None:
        """After each optimizer step (written at most once a second; the flusher writes the rest)."""
        self.writer.step(step, epoch=epoch, tokens=tokens)

    def begin(self, phase: str) -> None:
        """Open a phase (for frameworks whose hooks come as a start and an end); :meth:`end` closes it."""
        if phase not in PHASES or phase == "train":
            raise ValueError(f"begin: {phase!r} is not a leased phase ({', '.join(PHASES)})")
        self.writer.flush()  # the last step lands before we block
        self._stack.append((phase, self._monotonic(), self.phase_now))
        self.enter(phase)

    def end(self, phase: str | None = None, *, then: str | None = None) -> float | None:
        """Close the innermost open phase (``phase`` names it, as a check; a mismatch closes nothing),
        learn its duration, and return to the phase it interrupted - or, with ``then``, go straight on
        into that leased phase (an evaluation followed by a save), writing no ``train`` in between.
        Returns the duration."""
        if not self._stack or (phase is not None and self._stack[-1][0] != phase):
            return None
        if then is not None and (then not in PHASES or then == "train"):
            raise ValueError(f"end: then={then!r} is not a leased phase ({', '.join(PHASES)})")
        name, start, back_to = self._stack.pop()
        now = self._monotonic()
        duration_s = max(0.0, now - start)
        self.leases.observe(name, duration_s)
        if then is not None:
            self._stack.append((then, now, back_to))
            self.enter(then)
        else:
            self.enter(back_to)  # a fresh lease when that phase is a leased one
        return duration_s

    def in_phase(self, phase: str) -> bool:
        return any(entry[0] == phase for entry in self._stack)

    @contextlib.contextmanager
    def phase(self, phase: str) -> Iterator[Progress]:
        """``with progress.phase("eval"): ...`` - see :meth:`checkpoint`."""
        self.begin(phase)
        try:
            yield self
        finally:
            self.end(phase)

    def checkpoint(self) -> contextlib.AbstractContextManager[Progress]:
        """``with progress.checkpoint(): save(...)`` on every rank."""
        return self.phase("checkpoint")

    def eval(self) -> contextlib.AbstractContextManager[Progress]:
        return self.phase("eval")

    def epoch_end(self) -> contextlib.AbstractContextManager[Progress]:
        """End-of-epoch collectives (statistics, a barrier, re-sharding the data)."""
        return self.phase("epoch_end")

    def done(self, step: int | None = None, *, epoch: int | None = None, tokens: int | None = None) -> None:
        """The run is over (the process may still tear down): ``done`` with its lease."""
        if step is not None:
            self.writer.step(step, epoch=epoch, tokens=tokens, write=False)
        self._stack.clear()
        self.enter("done")

    def close(self, *, done: bool = True) -> None:
        """Stop the flusher; with ``done``, announce the end first. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if done:
            self.done()
        self.flusher.stop()
        self.writer.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: object, *_exc: object) -> None:
        # On an exception the process is about to die: its pid vanishing says more than "done".
        self.close(done=exc_type is None)
