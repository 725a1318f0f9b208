"""How well the loop is doing: consecutive failed cycles (the last good snapshot republished with the
count, so /healthz turns 503 ``failing``), and what failed in a cycle without stopping it
(Snapshot.input_errors: progress files, jobs the detector could not judge, verdicts not recorded,
the store on memory, the actions), each logged once per error rather than every cycle."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpu_triage import __version__
from gpu_triage.model.names import printable
from gpu_triage.model.snapshot import Snapshot
from gpu_triage.model.states import Mode

if TYPE_CHECKING:
    from gpu_triage.daemon.loop import Daemon

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


def cycle_failed(d: Daemon, error: Exception | None) -> None:
    """Count consecutive failed cycles; the last good snapshot is republished with the count so
    /healthz turns 503 ``failing``. Logged with its traceback when the error changes, not each time."""
    if error is None:
        if d.failed_cycles:
            log.warning("cycle %d succeeded after %d failed cycle(s)", d.cycle_no, d.failed_cycles)
        d.failed_cycles, d._last_cycle_error = 0, None
        return
    d.failed_cycles += 1
    d.stats.failed += 1
    failed_total = float(d.stats.failed)
    text = f"{type(error).__name__}: {error}"[:300]
    if text != d._last_cycle_error:
        log.error(
            "cycle %d failed (%d in a row): %s",
            d.cycle_no,
            d.failed_cycles,
            printable(text),
            exc_info=error,
        )
        d._event("daemon", {"event": "cycle_failed", "cycle": d.cycle_no, "error": text})
        d._last_cycle_error = text
    latest = d.snapshots.latest()
    if latest is not None:  # visible at once in /healthz (degraded) and the failed-cycle counter
        counters = {
            **latest.counters,
            "failed_cycles_total": failed_total,
            "degraded_cycles_total": float(d.degraded_cycles) + failed_total,
        }
        d.snapshots.publish(replace(latest, failed_cycles=d.failed_cycles, counters=counters))
    elif d.failed_cycles >= 3:  # never a good cycle: say "failing", not "starting" forever
        d.snapshots.publish(
            Snapshot(
                node=d.node,
                source=d.source.name,
                mode=d.mode,
                armed=d.mode is not Mode.OBSERVE,
                cycle=d.cycle_no,
                time=d.started_at,
                period_s=d.config.daemon.period_s,
                started_at=d.started_at,
                version=__version__,
                failed_cycles=d.failed_cycles,
            )
        )


def actions_ran(d: Daemon, error: Exception | None) -> None:
    """The action engine's cycle: an error is kept for input_errors and logged when it changes."""
    if error is None:
        d._actions_error = None
        return
    text = f"{type(error).__name__}: {error}"[:300]
    if text != d._actions_error:
        log.error("actions failed", exc_info=error)
    d._actions_error = text


def input_errors(d: Daemon) -> tuple[dict[str, Any], ...]:
    """What failed this cycle without stopping it (Snapshot.input_errors)."""
    out = list(d._progress_errors)
    job_errors = dict(d.detector.job_errors)
    for job, error in sorted(job_errors.items()):
        if d._logged_job_errors.get(job) != error:  # once per job and error, not every cycle
            log.error(
                "detector could not judge job %s (last verdict kept, never a kill): %s",
                printable(job, 200),
                printable(error),
            )
    d._logged_job_errors = job_errors
    out += [{"kind": "job", "where": j, "error": e} for j, e in sorted(job_errors.items())]
    out += [{"kind": "persist", "where": j, "error": e} for j, e in sorted(d._persist_errors.items())]
    if d.store is not None and getattr(d.store, "memory_only", False):
        out.append({"kind": "store", "where": str(d.store.path), "error": d.store.memory_reason})
    if d._actions_error is not None:
        out.append({"kind": "actions", "where": "actions", "error": d._actions_error})
    return tuple(out)
