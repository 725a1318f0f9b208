"""Drain this node through Slurm when its hardware is at fault (``[actions] drain``; docs/actions.md).

What drains (:func:`drain_requests`, pure):

- **a hang blamed on the node**: a job's ``deadlock_confirmed`` with ``blame`` ``node`` and an unhealthy
  hardware finding on one of its GPUs (an Xid 79 under a frozen collective, a GPU lost): the reason
  names the first such finding, ``gpu-watchdog: GPU 3 Xid 79``;
- **a hardware fault without a hang**: an unhealthy finding in the node's health whose operator action
  (the Xid catalog's) is ``drain_node`` - fallen off the bus, uncorrectable ECC, a row-remap failure.
  The job on that GPU is left alone: it may still finish or checkpoint; the scheduler places nothing
  new here.

A lost *other* node of a multi-node job blames the node too, but that node is not this one: nothing is
drained here for it.

How: ``scontrol update NodeName=<node> State=DRAIN Reason="gpu-watchdog: GPU 3 Xid 79"`` (an argument
vector, never a shell), on the engine's kill worker (one ordered thread, so a drain decided with a hang
runs before that job's requeue), ``scontrol`` from ``actions.slurm_bin_dir`` or ``PATH``, the node's
Slurm name ``actions.slurm_node_name`` (empty: the daemon's ``node``). Only with ``actions.drain = true``
and the mode ``alert`` or ``kill`` (observe records ``drain/not_armed``); ``dry_run`` records the
command without running it. Each fault drains once (its key - GPU, kind, Xid, first sighting - is kept
in ``actions.drained``), so an operator's ``scontrol update NodeName=X State=RESUME`` is not undone by
the same fault still in the log; a new fault drains again; a drain that failed is tried again
``DRAIN_RETRY_S`` later.
"""

from __future__ import annotations

import queue
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_triage.actions.config import ActionsConfig
from gpu_triage.actions.kill_targets import CommandRunner
from gpu_triage.actions.records import KvState, Records
from gpu_triage.actions.slurm_cancel import find_slurm_binary
from gpu_triage.model.actions import Action, Result
from gpu_triage.model.health import Blame, HardwareFinding, NodeHealth, OperatorAction
from gpu_triage.model.names import printable
from gpu_triage.model.snapshot import JobStatus
from gpu_triage.model.states import Mode, Verdict

KV_DRAINED = "actions.drained"
MAX_DRAINED_KEYS = 200
DRAIN_RETRY_S = 60.0
"""A drain that failed (slurmctld restarting, scontrol timing out) is tried again this much later."""
REASON_PREFIX = "gpu-watchdog: "
MAX_REASON_CHARS = 120
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True, slots=True)
class DrainRequest:
    """One reason to drain this node."""

    key: str
    """What makes it the same fault next cycle (drained once per key)."""
    reason: str
    """Slurm's drain reason, ``gpu-watchdog: GPU 3 Xid 79``."""
    cause: str
    """``hang`` (a job's hang blamed on the node) or ``fault`` (a finding whose action is drain_node)."""
    job: str | None = None


def finding_key(f: HardwareFinding) -> str:
    return f"{f.gpu}|{f.kind}|{f.xid}|{round(f.first_seen, 1)}"


def reason_text(f: HardwareFinding) -> str:
    """``gpu-watchdog: GPU 3 Xid 79`` (or ``... GPU 3 gpu_lost``, ``... node fabric``): printable, bounded."""
    where = f"GPU {f.gpu}" if f.gpu is not None else "node"
    what = f"Xid {f.xid}" if f.xid is not None else str(f.kind)
    text = printable(f"{REASON_PREFIX}{where} {what}", MAX_REASON_CHARS)
    return text.replace('"', "'")


def drain_requests(jobs: Sequence[JobStatus], health: NodeHealth) -> list[DrainRequest]:
    """Why this node should be drained this cycle (pure; module docstring)."""
    out: dict[str, DrainRequest] = {}
    for job in jobs:
        if (
            job.blame is not Blame.NODE
            or job.verdict is not Verdict.DEADLOCK_CONFIRMED
            or not job.kill_worthy
        ):
            continue
        hw = job.evidence.hardware if job.evidence is not None else ()
        faults = [h for h in hw if h.is_fault and h.blame is Blame.NODE]
        if faults:
            f = faults[0]
            out.setdefault(finding_key(f), DrainRequest(finding_key(f), reason_text(f), "hang", job.job))
    every = [f for g in health.gpus for f in g.findings] + list(health.findings)
    for f in every:
        if f.is_fault and f.action is OperatorAction.DRAIN_NODE:
            out.setdefault(finding_key(f), DrainRequest(finding_key(f), reason_text(f), "fault"))
    return list(out.values())


def drain_argv(scontrol: str, node: str, reason: str) -> tuple[str, ...]:
    return (scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")


@dataclass(frozen=True, slots=True)
class DrainDone:
    request: DrainRequest
    argv: tuple[str, ...]
    ok: bool
    details: dict[str, Any]


class NodeDrainer:
    """Decides on the loop thread (:meth:`on_cycle`), runs ``scontrol`` through ``submit`` (a worker)
    and records the outcome on a later cycle."""

    def __init__(
        self,
        *,
        actions: ActionsConfig,
        runner: CommandRunner,
        kv: KvState,
        node: str,
        submit: Callable[[Callable[[], None]], None],
    ) -> None:
        self.actions = actions
        self.runner = runner
        self.node = actions.slurm_node_name or node
        self._kv = kv
        self._submit = submit
        self._done: queue.SimpleQueue[DrainDone] = queue.SimpleQueue()
        saved = kv.get(KV_DRAINED, [])
        self._drained: list[str] = [k for k in saved if isinstance(k, str)] if isinstance(saved, list) else []
        self._noted: set[str] = set()
        self._retry_at: dict[str, float] = {}

    def on_cycle(
        self, now: float, mode: Mode, jobs: Sequence[JobStatus], health: NodeHealth, records: Records
    ) -> None:
        self.collect(now, records)
        for req in drain_requests(jobs, health):
            if req.key in self._drained or now < self._retry_at.get(req.key, now):
                continue
            if not self.actions.drain:
                self._note(req, "off", now, records, Result.SKIPPED, why="actions.drain is false")
                continue
            if mode is Mode.OBSERVE:
                self._note(req, "observe", now, records, Result.NOT_ARMED, mode=str(mode))
                continue
            self._remember(req.key, now)
            scontrol = find_slurm_binary("scontrol", self.actions.slurm_bin_dir)
            if scontrol is None:
                where = self.actions.slurm_bin_dir or "PATH"
                self._record(records, now, req, Result.ERROR, error=f"scontrol not found in {where}")
                continue
            if not NODE_NAME.fullmatch(self.node):
                self._record(
                    records,
                    now,
                    req,
                    Result.ERROR,
                    error=f"not a Slurm node name: {printable(self.node, 80)}",
                )
                continue
            argv = drain_argv(scontrol, self.node, req.reason)
            if self.actions.dry_run:
                self._record(records, now, req, Result.DRY_RUN, argv=list(argv))
                continue
            self._submit(lambda req=req, argv=argv: self._run(req, argv))  # type: ignore[misc]
            self._record(records, now, req, Result.STARTED, argv=list(argv))

    def collect(self, now: float, records: Records) -> None:
        """Record the drains the worker finished."""
        while True:
            try:
                done = self._done.get_nowait()
            except queue.Empty:
                return
            result = Result.OK if done.ok else Result.ERROR
            if not done.ok:  # not drained: the same fault tries again after DRAIN_RETRY_S
                self._retry_at[done.request.key] = now + DRAIN_RETRY_S
                self._drained = [k for k in self._drained if k != done.request.key]
                self._kv.set(KV_DRAINED, self._drained, now)
                done.details["retry_in_s"] = DRAIN_RETRY_S
            self._record(records, now, done.request, result, argv=list(done.argv), **done.details)

    def _run(self, req: DrainRequest, argv: tuple[str, ...]) -> None:
        try:
            r = self.runner.run(argv, timeout_s=self.actions.capture_timeout_s)
            details: dict[str, Any] = {"returncode": r.returncode, "stderr": r.stderr[-2000:]}
            if r.error:
                details["error"] = r.error
            self._done.put(DrainDone(req, argv, r.ok, details))
        except Exception as e:  # never lost: the loop records it
            self._done.put(DrainDone(req, argv, False, {"error": f"{type(e).__name__}: {e}"[:300]}))

    def _note(
        self, req: DrainRequest, state: str, now: float, records: Records, result: Result, **details: Any
    ) -> None:
        """Say once per fault (and reason) what would have drained."""
        tag = f"{state}|{req.key}"
        if tag not in self._noted:
            self._noted.add(tag)
            self._record(records, now, req, result, **details)

    def _remember(self, key: str, now: float) -> None:
        self._drained = [*self._drained, key][-MAX_DRAINED_KEYS:]
        self._kv.set(KV_DRAINED, self._drained, now)

    def _record(
        self, records: Records, now: float, req: DrainRequest, result: Result, **details: Any
    ) -> None:
        extra = {"job": req.job} if req.job is not None else {}
        records.add(
            now,
            Action.DRAIN,
            result,
            slurm_node=self.node,
            reason=req.reason,
            cause=req.cause,
            **extra,
            **details,
        )


__all__ = [
    "KV_DRAINED",
    "DrainDone",
    "DrainRequest",
    "NodeDrainer",
    "drain_argv",
    "drain_requests",
    "finding_key",
    "reason_text",
]
