"""How well the loop is doing: consecutive failed cycles (the last good snapshot republished with the
count, so /healthz turns 503 ``failing``), and what failed in a cycle without stopping it
(Snapshot.input_errors: progress files, jobs the detector could not judge, verdicts not recorded,
the store on memory, the actions, a signal that raised), each logged once per error rather than every
cycle.

:class:`HealthBook` owns the counts (:class:`CycleStats`, failed and degraded cycles) and the errors
it has logged; the daemon reports each cycle's outcome to it and reads its counters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_triage.journal.eventstore import EventStore
from gpu_triage.model.names import printable
from gpu_triage.model.snapshot import Snapshot
from gpu_triage.serving.publish import SnapshotHolder

log = logging.getLogger("gpu_watchdog")


@dataclass
class CycleStats:
    cycles: int = 0
    missed: int = 0
    """Ticks skipped because a cycle overran its period."""
    worst_lateness_s: float = 0.0
    last_duration_s: float = 0.0
    failed: int = 0
    """Cycles that raised (nothing published)."""


class HealthBook:
    """Failed and degraded cycles, and the errors of a cycle that went on."""

    def __init__(self) -> None:
        self.stats = CycleStats()
        self.failed_cycles = 0
        """Failed cycles in a row (0 after a good one)."""
        self.degraded_cycles = 0
        """Cycles in which a job could not be judged or recorded, or the actions or a signal failed."""
        self._last_cycle_error: str | None = None
        self._actions_error: str | None = None
        self._logged_job_errors: dict[str, str] = {}

    def cycle_failed(
        self,
        error: Exception | None,
        *,
        cycle_no: int,
        snapshots: SnapshotHolder,
        first_failing: Callable[[int], Snapshot],
        event: Callable[[str, dict[str, Any]], None],
    ) -> None:
        """Count consecutive failed cycles; the last good snapshot is republished with the count so
        /healthz turns 503 ``failing`` (``first_failing(failed_cycles)``: what to publish when no cycle
        ever succeeded). Logged with its traceback when the error changes, not each time."""
        if error is None:
            if self.failed_cycles:
                log.warning("cycle %d succeeded after %d failed cycle(s)", cycle_no, self.failed_cycles)
            self.failed_cycles, self._last_cycle_error = 0, None
            return
        self.failed_cycles += 1
        self.stats.failed += 1
        failed_total = float(self.stats.failed)
        text = f"{type(error).__name__}: {error}"[:300]
        if text != self._last_cycle_error:
            log.error(
                "cycle %d failed (%d in a row): %s",
                cycle_no,
                self.failed_cycles,
                printable(text),
                exc_info=error,
            )
            event("daemon", {"event": "cycle_failed", "cycle": cycle_no, "error": text})
            self._last_cycle_error = text
        latest = snapshots.latest()
        if latest is not None:  # visible at once in /healthz (degraded) and the failed-cycle counter
            counters = {
                **latest.counters,
                "failed_cycles_total": failed_total,
                "degraded_cycles_total": float(self.degraded_cycles) + failed_total,
            }
            snapshots.publish(replace(latest, failed_cycles=self.failed_cycles, counters=counters))
        elif self.failed_cycles >= 3:  # never a good cycle: say "failing", not "starting" forever
            snapshots.publish(first_failing(self.failed_cycles))

    def actions_ran(self, error: Exception | None) -> None:
        """The action engine's cycle: an error is kept for input_errors and logged when it changes."""
        if error is None:
            self._actions_error = None
            return
        text = f"{type(error).__name__}: {error}"[:300]
        if text != self._actions_error:
            log.error("actions failed", exc_info=error)
        self._actions_error = text

    def input_errors(
        self,
        *,
        progress_errors: tuple[dict[str, Any], ...],
        job_errors: Mapping[str, str],
        persist_errors: Mapping[str, str],
        signal_errors: Mapping[str, str],
        store: EventStore | None,
    ) -> tuple[dict[str, Any], ...]:
        """What failed this cycle without stopping it (Snapshot.input_errors); a cycle with one that
        is not the users' own (a progress file) counts as degraded."""
        if not (progress_errors or job_errors or persist_errors or signal_errors or self._actions_error):
            if self._logged_job_errors:
                self._logged_job_errors = {}
            if store is None or not getattr(store, "memory_only", False):
                return ()  # the usual cycle: nothing failed (10 times a second)
        out = list(progress_errors)
        job_errors = dict(job_errors)
        for job, error in sorted(job_errors.items()):
            if self._logged_job_errors.get(job) != error:  # once per job and error, not every cycle
                log.error(
                    "detector could not judge job %s (last verdict kept, never a kill): %s",
                    printable(job, 200),
                    printable(error),
                )
        self._logged_job_errors = job_errors
        out += [{"kind": "job", "where": j, "error": e} for j, e in sorted(job_errors.items())]
        out += [{"kind": "persist", "where": j, "error": e} for j, e in sorted(persist_errors.items())]
        if store is not None and getattr(store, "memory_only", False):
            out.append({"kind": "store", "where": str(store.path), "error": store.memory_reason})
        if self._actions_error is not None:
            out.append({"kind": "actions", "where": "actions", "error": self._actions_error})
        out += [{"kind": "signal", "where": n, "error": e} for n, e in sorted(signal_errors.items())]
        if any(e["kind"] in DEGRADING for e in out):
            self.degraded_cycles += 1
        return tuple(out)


DEGRADING = ("job", "persist", "actions", "signal")
"""Input error kinds that count a cycle as degraded."""
