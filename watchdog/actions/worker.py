"""The engine's worker threads (:class:`OrderedWorker`) and the typed results they hand back to the
loop thread (:data:`WorkerResult`)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_triage.actions.evidence_bundle import Bundle, CaptureRequest
from gpu_triage.actions.kill_targets import KillOutcome, KillPlan

log = logging.getLogger("gpu_triage.actions.engine")


class OrderedWorker:
    """One daemon thread running submitted callables in order."""

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._busy = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            self._busy += 1
        self._tasks.put(task)

    @property
    def busy(self) -> int:
        with self._lock:
            return self._busy

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            try:
                task()
            except Exception:
                log.exception("action worker task failed")
            finally:
                with self._lock:
                    self._busy -= 1

    def close(self, timeout_s: float) -> None:
        self._tasks.put(None)
        self._thread.join(timeout_s)


@dataclass(frozen=True, slots=True)
class HookRun:
    """The kill hook ran (or was refused or dry-run) in place of SIGTERM."""

    plan: KillPlan
    info: dict[str, Any]
    """The record's details; ``info["result"]`` is ``ok``, ``error`` or ``dry_run``."""


@dataclass(frozen=True, slots=True)
class HookSurvivors:
    """The SIGKILL rung after the kill hook: which processes of its plan are still alive."""

    survivors: Sequence[int]


@dataclass(frozen=True, slots=True)
class CaptureDone:
    job: str
    request: CaptureRequest
    bundle: Bundle | Exception


@dataclass(frozen=True, slots=True)
class TermDone:
    job: str
    outcome: KillOutcome | HookRun | Exception


@dataclass(frozen=True, slots=True)
class KillDone:
    job: str
    outcome: KillOutcome | HookSurvivors | Exception


WorkerResult = CaptureDone | TermDone | KillDone
"""A worker's result, handled on the loop thread."""

__all__ = ["CaptureDone", "HookRun", "HookSurvivors", "KillDone", "OrderedWorker", "TermDone", "WorkerResult"]
