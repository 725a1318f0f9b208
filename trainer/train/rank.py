"""What one rank knows of itself and says to the watchdog: its launcher environment (:class:`RankEnv`), its
device (:func:`resolve_device`), and :class:`ProgressReporter` - the contract's progress writer with a
per-rank history and a flusher thread, so a rank blocked in a collective still shows its true last step.
The errors an operator must fix are :class:`TrainError`."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ft_trainer.train.settings import Settings
from gpu_triage.contract import MIN_INTERVAL_S, ProgressWriter

__all__ = ["ProgressReporter", "RankEnv", "TrainError", "resolve_device"]

log = logging.getLogger("ft_trainer.train")


class TrainError(RuntimeError):
    """A problem the operator must fix (world size, checkpoint); reported without a traceback."""


@dataclass(frozen=True)
class RankEnv:
    """What the launcher (torchrun, deepspeed, or our test helper) tells each process."""

    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RankEnv:
        try:
            rank = int(env.get("RANK", "0"))
            local = int(env.get("LOCAL_RANK", "0"))
            world = int(env.get("WORLD_SIZE", "1"))
        except ValueError as exc:
            raise TrainError(f"RANK/LOCAL_RANK/WORLD_SIZE must be integers: {exc}") from None
        if not (0 <= rank < world and local >= 0):
            raise TrainError(f"RANK {rank}, LOCAL_RANK {local}, WORLD_SIZE {world}: inconsistent")
        return cls(rank, local, world)


def resolve_device(settings: Settings, env: Mapping[str, str]) -> str:
    """``cuda`` or ``cpu``: the configured device, or (auto) cuda when torch sees a GPU and
    ``DS_ACCELERATOR`` is not ``cpu``."""
    if settings.train.device != "auto":
        return settings.train.device
    if env.get("DS_ACCELERATOR", "").lower() == "cpu":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class ProgressReporter:
    """The progress writer, plus a per-rank history (every record written, one JSON per line) and a
    flusher thread.

    ``ProgressWriter.step`` writes at most once a second and keeps later steps pending; a rank that then
    blocks in a collective would leave its file behind its real step. The flusher writes a pending
    record once the second has passed, so a hung rank's file shows its true last step (within
    ``interval_s``). A lock serialises the two threads' writes."""

    def __init__(
        self, writer: ProgressWriter | None, history: Path | None, interval_s: float = MIN_INTERVAL_S
    ) -> None:
        self.writer = writer
        self.history = None
        self.current = "init"
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last_write_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if writer is not None and history is not None:
            try:
                history.parent.mkdir(parents=True, exist_ok=True)
                self.history = open(history, "a", encoding="utf-8")  # noqa: SIM115 (kept for the run)
            except OSError as exc:
                log.warning("cannot write the progress history %s: %s", history, exc)

    def start_flusher(self) -> None:
        if self.writer is not None and self._thread is None:
            self._thread = threading.Thread(target=self._flush_loop, name="progress-flush", daemon=True)
            self._thread.start()

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.interval_s / 2):
            with self._lock:
                if time.monotonic() - self._last_write_s >= self.interval_s:
                    self._log(self.writer.flush() if self.writer is not None else False)

    def _log(self, wrote: bool) -> None:
        if not wrote or self.writer is None:
            return
        self._last_write_s = time.monotonic()
        if self.history is not None:
            self.history.write(json.dumps(self.writer.record) + "\n")
            self.history.flush()

    def phase(self, phase: str, lease_s: float | None = None) -> None:
        self.current = phase
        if self.writer is not None:
            with self._lock:
                self._log(self.writer.phase(phase, lease_s=lease_s))

    def step(self, step: int, epoch: int, tokens: int) -> None:
        if self.writer is not None:
            with self._lock:
                self._log(self.writer.step(step, epoch=epoch, tokens=tokens))

    def flush(self) -> None:
        if self.writer is not None:
            with self._lock:
                self._log(self.writer.flush())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            if self.history is not None:
                self.history.close()
                self.history = None
