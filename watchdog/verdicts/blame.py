"""Whom a verdict blames, from the node's health (pure; docs/detector.md "Blame").

The detector hands each job's GPUs and the cycle's :class:`~gpu_triage.model.health.NodeHealth` to
:func:`judge`, which picks the hardware findings that concern the job (:class:`Hardware`). Three rules
follow from them:

- **a hang on a faulty GPU is the node's**: a proven hang (K1-K6, as always) with an *unhealthy*
  finding that blames the node or the fabric on one of the job's GPUs (or node-wide) is
  ``deadlock_confirmed`` at once - no ``confirm_after_s`` window: the hardware is the second, independent
  witness - with ``blame`` ``node`` (``network`` for a fabric fault) (:func:`escalate`);
- **a GPU lost** (NVML ``GPU_IS_LOST``, "fallen off the bus") under a job whose train ranks are frozen past
  their budget is that hang, even though the lost GPU reads nothing the power rules could use;
- **a degraded signal never makes a kill**: a throttled job GPU (thermal, hardware slowdown, power
  brake) draws little power while it still works, which is the spin band's signature, so the power
  half of every hang rule is withdrawn while it lasts (:func:`without_spin`); correctable ECC and a
  PCIe width drop are context only. Progress files (K1) and stacks (K6) still prove a hang.

A hang on a healthy node blames the job, as before. A node of the job lost (the cross-node rule's cause
``node <name> lost``) blames the node too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_triage.model.findings import Finding, Signal, context, hang
from gpu_triage.model.health import Blame, FaultKind, HardwareFinding, HealthLevel, NodeHealth
from gpu_triage.model.states import DEADLOCK_VERDICTS, Verdict
from gpu_triage.verdicts.facts import Decision, JobFacts

#: Kinds that say the GPU is gone: no reading of it can show a hang, the frozen steps must.
LOST_KINDS = frozenset({FaultKind.GPU_LOST, FaultKind.FALLEN_OFF_BUS})
#: Degraded kinds that lower a working GPU's power into the spin band.
THROTTLE_KINDS = frozenset(
    {FaultKind.THROTTLE_THERMAL, FaultKind.THROTTLE_HW_SLOWDOWN, FaultKind.THROTTLE_POWER_BRAKE}
)
#: Blames that put a hang on the hardware (never counted against the job).
HARDWARE_BLAMES = frozenset({Blame.NODE, Blame.NETWORK})
#: Verdicts that are no problem: they blame nobody (``job``, the default), whatever the hardware says.
UNBLAMED = frozenset({Verdict.HEALTHY, Verdict.CHECKPOINT, Verdict.DONE})

_NODE_LOST = re.compile(r"^node (\S[^:]{0,1000}?) lost\b")


@dataclass(frozen=True, slots=True)
class Hardware:
    """The hardware findings that concern one job this cycle."""

    findings: tuple[HardwareFinding, ...] = ()
    """Every non-healthy finding on the job's GPUs and node-wide, unhealthy ones first."""
    faults: tuple[HardwareFinding, ...] = ()
    """Unhealthy findings blaming the node or the fabric: a hang with one of them is the hardware's."""
    lost: tuple[HardwareFinding, ...] = ()
    """A job GPU lost or fallen off the bus."""
    throttled: tuple[int, ...] = ()
    """Job GPUs throttled this cycle (their power band proves nothing)."""


def judge(gpus: Iterable[int], health: NodeHealth) -> Hardware:
    """The findings of ``health`` that concern a job on ``gpus``."""
    wanted = set(gpus)
    found = [f for g in health.gpus if g.gpu in wanted for f in g.findings]
    found.extend(health.findings)
    found = [f for f in found if f.level is not HealthLevel.HEALTHY]
    found.sort(key=lambda f: (not f.is_fault, f.gpu if f.gpu is not None else -1))
    faults = tuple(f for f in found if f.is_fault and f.blame in HARDWARE_BLAMES)
    lost = tuple(f for f in found if f.kind in LOST_KINDS and f.gpu in wanted)
    throttled = tuple(
        sorted({f.gpu for f in found if f.kind in THROTTLE_KINDS and f.gpu is not None and f.gpu in wanted})
    )
    return Hardware(findings=tuple(found), faults=faults, lost=lost, throttled=throttled)


def node_lost(cause: str | None) -> str | None:
    """The node named by the cross-node rule's cause ``node <name> lost`` (None: not that cause)."""
    m = _NODE_LOST.match(cause or "")
    return m.group(1) if m else None


def blame_for(verdict: Verdict, hw: Hardware, cause: str | None) -> Blame:
    """Whom ``verdict`` blames: the worst hardware blame among the unhealthy findings (node, then
    network), ``unknown`` when only an uncatalogued finding speaks, ``node`` for a lost node of the
    job, else ``job``. A verdict that is no problem (healthy, checkpoint, done) blames nobody: ``job``."""
    if verdict in UNBLAMED:
        return Blame.JOB
    blames = {f.blame for f in hw.findings if f.is_fault}
    if Blame.NODE in blames or hw.lost:
        return Blame.NODE
    if Blame.NETWORK in blames:
        return Blame.NETWORK
    if node_lost(cause) is not None:
        return Blame.NODE
    if Blame.UNKNOWN in blames or any(f.blame is Blame.UNKNOWN for f in hw.findings):
        return Blame.UNKNOWN
    return Blame.JOB


def without_spin(f: JobFacts, hw: Hardware) -> JobFacts:
    """``f`` with the power half of the hang rules withdrawn while a job GPU is throttled: a throttled
    GPU at full utilisation and low power is working slowly, not waiting."""
    if not hw.throttled:
        return f
    return dataclasses.replace(f, spin_all=False, spin_strong=False, spin_since=None, majority_since=None)


def findings(hw: Hardware, *, lost_proves: bool) -> list[Finding]:
    """The hardware's statements in the job's findings: faults and degraded signals as context, a lost
    GPU as hang evidence when it makes the hang (``lost_proves``), a throttle as what withdrew the spin
    band."""
    out: list[Finding] = []
    for h in hw.findings:
        gpus = (h.gpu,) if h.gpu is not None else ()
        where = f"GPU {h.gpu}" if h.gpu is not None else "node"
        text = f"{where}: {h.detail} (blame {h.blame}, action {h.action})"
        if h.kind in LOST_KINDS and lost_proves:
            out.append(hang(Signal.GPU_LOST, text, h.first_seen or None, gpus=gpus))
        elif h.is_fault:
            out.append(context(Signal.HARDWARE_FAULT, text, h.first_seen or None, gpus=gpus))
        elif h.kind in THROTTLE_KINDS:
            out.append(
                context(
                    Signal.GPU_THROTTLED,
                    f"{text}: the spin band proves nothing",
                    h.first_seen or None,
                    gpus=gpus,
                )
            )
        else:
            out.append(context(Signal.HARDWARE_DEGRADED, text, h.first_seen or None, gpus=gpus))
    return out


def fault_text(hw: Hardware) -> str:
    """``gpu 3 xid 79`` / ``gpu 1 gpu_lost``: what a signal or a drain reason names."""
    f = (hw.faults or hw.lost)[0]
    what = f"xid {f.xid}" if f.xid is not None else str(f.kind)
    return f"gpu {f.gpu} {what}" if f.gpu is not None else what


def escalate(decision: Decision, hw: Hardware, f: JobFacts, *, frozen_after_s: float) -> Decision:
    """The hardware's part in the verdict: a proven hang with a hardware fault under it is confirmed at
    once; a lost job GPU under frozen train ranks is that hang. Anything else is left as it is."""
    if decision.kill_worthy and decision.verdict in DEADLOCK_VERDICTS and (hw.faults or hw.lost):
        signal = f"{Signal.HARDWARE_FAULT}:{fault_text(hw)}"
        return dataclasses.replace(
            decision, verdict=Verdict.DEADLOCK_CONFIRMED, signals=(*decision.signals, signal)
        )
    if (
        hw.lost
        and not decision.kill_worthy
        and decision.verdict in (Verdict.STALLED, Verdict.TELEMETRY_LOST, Verdict.SLOW, Verdict.CANNOT_JUDGE)
        and f.train
        and f.frozen_since is not None
        and f.frozen_s >= frozen_after_s
    ):
        return Decision(
            Verdict.DEADLOCK_CONFIRMED,
            f.frozen_since,
            None,
            (str(Signal.STEPS_FROZEN), f"{Signal.GPU_LOST}:{fault_text(hw)}"),
            kill_worthy=True,
        )
    return decision


__all__ = [
    "HARDWARE_BLAMES",
    "LOST_KINDS",
    "THROTTLE_KINDS",
    "Hardware",
    "blame_for",
    "escalate",
    "fault_text",
    "findings",
    "judge",
    "node_lost",
    "without_spin",
]
