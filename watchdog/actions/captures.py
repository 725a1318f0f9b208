"""Evidence capture scheduling: the capture rung of an episode, run on one worker thread, at most one
bundle per job every ``CAPTURE_MIN_INTERVAL_S`` (persisted in ``actions.last_capture``), and the
bundle indexed in the event store when it comes back."""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
from collections.abc import Callable, Sequence
from pathlib import Path

from gpu_triage.actions.episode import Episode
from gpu_triage.actions.evidence import (
    FLIGHT_RECORDER_WAIT_S,
    PY_SPY_PARALLEL,
    Bundle,
    CaptureRequest,
    EvidenceCapture,
    RankTarget,
    prune_bundles,
    reserve_bundle,
)
from gpu_triage.actions.records import KV_CAPTURES, KvState, Records
from gpu_triage.actions.worker import CaptureDone, OrderedWorker, WorkerResult
from gpu_triage.journal.eventstore import EventStore, StoreError
from gpu_triage.model.actions import Action, CaptureState, Result
from gpu_triage.model.jsonable import jsonable
from gpu_triage.model.snapshot import GpuStatus, JobStatus
from gpu_triage.model.states import Mode
from gpu_triage.signals.rank_process import RankProcess

log = logging.getLogger("gpu_triage.actions.engine")

CAPTURE_MIN_INTERVAL_S = 300.0


def rank_targets(job: JobStatus, procs: Sequence[RankProcess]) -> tuple[RankTarget, ...]:
    """The job's live rank processes that the inspector tied to it by proof (a rank environment, a GPU
    context, a launcher parent, a progress file whose claim checked out). Never a pid taken from a
    progress file on trust: with no proven process there is nothing to signal."""
    return tuple(RankTarget(p.rank, p.pid, p.gpu) for p in procs if p.alive and p.proof)


class CaptureScheduler:
    """Starts captures on its worker thread and turns their bundles into records."""

    def __init__(
        self,
        *,
        capturer: EvidenceCapture,
        store: EventStore,
        kv: KvState,
        results: queue.SimpleQueue[WorkerResult],
        state_dir: Path,
        node: str,
        timeout_s: float,
        py_spy: str | None,
        nvidia_smi: str | None,
        ras_address: tuple[str, int],
        max_bundles: int,
        retention_s: float | None,
        clock: Callable[[], float],
    ) -> None:
        self.capturer = capturer
        self.store = store
        self.state_dir = state_dir
        self.node = node
        self.timeout_s = timeout_s
        self.py_spy = py_spy
        self.nvidia_smi = nvidia_smi
        self.ras_address = ras_address
        self.max_bundles = max_bundles
        self.retention_s = retention_s
        self.clock = clock
        self._kv = kv
        self._results = results
        captures = kv.get(KV_CAPTURES, {})
        self._last_capture: dict[str, float] = {
            str(k): float(v)
            for k, v in (captures.items() if isinstance(captures, dict) else ())
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        """The capture rate limit, persisted: a restart does not allow a second bundle for one hang."""
        self.worker = OrderedWorker("evidence-capture")

    def capture(
        self,
        ep: Episode,
        job: JobStatus,
        now: float,
        mode: Mode,
        procs: Sequence[RankProcess],
        gpus: Sequence[GpuStatus],
        progress_dir: Path | None,
        records: Records,
    ) -> None:
        """The capture rung: reserve a bundle directory and queue the capture."""
        last = self._last_capture.get(job.job)
        if last is not None and now - last < CAPTURE_MIN_INTERVAL_S:
            ep.capture_state = CaptureState.SKIPPED
            records.add(
                now,
                Action.CAPTURE,
                Result.SKIPPED,
                job=job.job,
                reason=f"a bundle was captured {now - last:.0f} s ago",
            )
            return
        targets = rank_targets(job, procs)
        try:
            path = reserve_bundle(self.state_dir, job.job, now)
        except OSError as e:
            ep.capture_state = CaptureState.SKIPPED
            records.add(now, Action.CAPTURE, Result.ERROR, job=job.job, error=f"evidence directory: {e}")
            return
        status = {
            "time": now,
            "node": self.node,
            "mode": str(mode),
            "signature": ep.signature,
            "sightings": ep.sightings,
            "job": jsonable(dataclasses.asdict(job)),
            "processes": [jsonable(dataclasses.asdict(p)) for p in procs],
            "gpus": [jsonable(dataclasses.asdict(g)) for g in gpus],
        }
        request = CaptureRequest(
            job=job.job,
            node=self.node,
            verdict=str(job.verdict),
            path=path,
            ranks=targets,
            status=status,
            progress_dir=progress_dir,
            timeout_s=self.timeout_s,
            py_spy=self.py_spy,
            nvidia_smi=self.nvidia_smi,
            ras_host=self.ras_address[0],
            ras_port=self.ras_address[1],
        )
        ep.capture_state, ep.capture_path, ep.capture_started = CaptureState.RUNNING, str(path), now
        rounds = math.ceil(max(1, len(targets)) / PY_SPY_PARALLEL)
        ep.capture_budget_s = self.timeout_s * (rounds + 3) + FLIGHT_RECORDER_WAIT_S + 5.0
        self._last_capture[job.job] = now
        cutoff = now - CAPTURE_MIN_INTERVAL_S
        self._last_capture = {k: t for k, t in self._last_capture.items() if t >= cutoff or k == job.job}
        self._kv.set(KV_CAPTURES, self._last_capture, now)
        self.worker.submit(lambda: self._run(job.job, request))
        records.add(
            now,
            Action.CAPTURE,
            Result.STARTED,
            job=job.job,
            verdict=str(job.verdict),
            path=str(path),
            pids=[t.pid for t in targets],
        )

    def prune(self) -> list[Path]:
        """Apply ``evidence.max_bundles`` and ``evidence.retention_days`` to the evidence directory."""
        doomed = prune_bundles(
            self.state_dir,
            max(1, self.max_bundles),
            max_age_s=self.retention_s,
            now=self.clock(),
        )
        if doomed:
            log.info("evidence retention: removed %d old bundle(s)", len(doomed))
        return doomed

    def _run(self, job: str, request: CaptureRequest) -> None:
        try:
            self.prune()
            bundle: Bundle | Exception = self.capturer.capture(request)
        except Exception as e:
            log.exception("evidence capture for %s failed", job)
            bundle = e
        self._results.put(CaptureDone(job, request, bundle))

    def done(self, result: CaptureDone, ep: Episode | None, now: float, records: Records) -> None:
        """A capture came back: mark the episode, index the bundle, record it."""
        job, request, bundle = result.job, result.request, result.bundle
        if ep is not None and ep.capture_path == str(request.path):
            ep.capture_state = CaptureState.DONE
        if isinstance(bundle, Exception):
            records.add(
                now,
                Action.CAPTURE,
                Result.ERROR,
                job=job,
                path=str(request.path),
                error=f"{type(bundle).__name__}: {bundle}",
            )
            return
        items = [
            {k: v for k, v in i.to_dict().items() if k in ("name", "status", "rank", "pid", "file", "error")}
            for i in bundle.items
        ]
        payload = {
            "path": str(bundle.path),
            "job": job,
            "node": self.node,
            "verdict": request.verdict,
            "items": items,
            "ok_items": bundle.ok_items,
            "duration_s": round(bundle.duration_s, 3),
        }
        try:
            self.store.append("evidence", payload, time_s=now, job=job)
        except StoreError as e:
            log.warning("cannot index the evidence bundle %s: %s", bundle.path, e)
        records.add(
            now,
            Action.CAPTURE,
            Result.OK,
            job=job,
            path=str(bundle.path),
            ok_items=bundle.ok_items,
            items=len(items),
            duration_s=round(bundle.duration_s, 3),
        )


__all__ = ["CAPTURE_MIN_INTERVAL_S", "CaptureScheduler", "rank_targets"]
