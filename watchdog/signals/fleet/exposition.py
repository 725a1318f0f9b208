"""The ``gpu_watchdog_fleet_*`` series: each node's facts about each job, for the other nodes.

Every series carries ``training_job`` (the job's name, the same on every node: docs/cluster.md) and
``fleet_node`` (``[daemon] node``; not ``node``, the scrape target's label); per-rank series add
``rank`` (the global rank). Series from all nodes
therefore join by ``training_job`` and ``rank`` in PromQL, and :mod:`gpu_triage.signals.fleet.remote`
reads one job's facts back with one selector. Times are epoch seconds; a fact this node does not have
is left out (no series), never exported as a made-up number.

==============================================================  =====================================
series                                                          value
==============================================================  =====================================
``fleet_facts_timestamp_seconds{training_job,fleet_node}``            when the node took these facts
``fleet_world_size{training_job,fleet_node}``                         the job's world size (when known)
``fleet_verdict{training_job,fleet_node,verdict}``                    1 (only the node's current verdict)
``fleet_verdict_onset_timestamp_seconds{training_job,fleet_node}``    the node verdict's onset
``fleet_kill_worthy{training_job,fleet_node}``                        1 when the node's verdict is kill-worthy
``fleet_io_active{training_job,fleet_node,io}``                       1 while the node's ranks write / read
``fleet_rank_stack_since_timestamp_seconds{...,rank,phase,where,collective}``  since when unchanged
``fleet_rank_stack_sampled_timestamp_seconds{...,rank}``        when the latest stack was taken
``fleet_rank_step{...,rank}``                                   the rank's optimizer step
``fleet_rank_step_changed_timestamp_seconds{...,rank}``         when it last changed
``fleet_rank_phase_since_timestamp_seconds{...,rank,phase}``    since when in its progress phase
``fleet_rank_spin_since_timestamp_seconds{...,rank}``           since when its GPU spins (absent: not)
==============================================================  =====================================

A rank's stack is *frozen* for ``stack_sampled - stack_since`` seconds. Its ``phase`` label says
where it is (``collective``: a training step's collective; ``checkpoint``/``eval``: inside a save or
an eval; ``forward``...), its ``collective`` label the collective it blocks in whatever the phase
(empty: none). A rank in ``phase="checkpoint"`` with a ``collective`` waits for the others inside the
save; with none it does the save's own work (serialising, writing). Writes are measured per node
(``io_active``), not per rank: a node's writes are attributed to its ranks outside any collective (the
ones that can be writing), and to the node as a whole when every rank of it waits in a collective;
either way a writing node is a healthy save in progress for the job-wide rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpu_triage.signals.fleet.facts import JOB_LABEL, NODE_LABEL, PREFIX, NodeJobFacts

METRIC_NAMES: dict[str, str] = {
    PREFIX + name: "gauge"
    for name in (
        "facts_timestamp_seconds",
        "world_size",
        "verdict",
        "verdict_onset_timestamp_seconds",
        "kill_worthy",
        "io_active",
        "rank_stack_since_timestamp_seconds",
        "rank_stack_sampled_timestamp_seconds",
        "rank_step",
        "rank_step_changed_timestamp_seconds",
        "rank_phase_since_timestamp_seconds",
        "rank_spin_since_timestamp_seconds",
    )
}


def _ok(value: float | int | None) -> float | None:
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def fleet_metrics(facts: Iterable[NodeJobFacts]) -> Iterator[Metric]:
    """The fleet families for one snapshot's job facts (pure)."""

    def g(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, doc, labels=[JOB_LABEL, NODE_LABEL, *labels])

    at = g("facts_timestamp_seconds", "When this node took its facts about the job (epoch seconds).")
    world = g("world_size", "The job's world size as this node knows it.")
    verdict = g("verdict", "This node's verdict about the job (1 for the current one).", "verdict")
    onset = g("verdict_onset_timestamp_seconds", "When the signature behind this node's verdict began.")
    kill = g("kill_worthy", "1 when this node's verdict about the job is kill-worthy.")
    io = g("io_active", "1 while this node's ranks of the job write (io=write) or read (io=read).", "io")
    stack = g(
        "rank_stack_since_timestamp_seconds",
        "Since when the rank's Python stack has not changed; phase, where (call site) and the collective"
        " it blocks in (empty: none) in labels.",
        "rank",
        "phase",
        "where",
        "collective",
    )
    sampled = g("rank_stack_sampled_timestamp_seconds", "When the rank's latest stack was taken.", "rank")
    step = g("rank_step", "The rank's optimizer step (progress files).", "rank")
    changed = g("rank_step_changed_timestamp_seconds", "When the rank's step last changed.", "rank")
    phase = g(
        "rank_phase_since_timestamp_seconds", "Since when the rank is in its progress phase.", "rank", "phase"
    )
    spin = g("rank_spin_since_timestamp_seconds", "Since when the rank's GPU sits in the spin band.", "rank")
    for f in facts:
        base = [f.job, f.node]
        at.add_metric(base, f.time)
        if f.world_size is not None:
            world.add_metric(base, float(f.world_size))
        verdict.add_metric([*base, f.verdict], 1.0)
        if (o := _ok(f.onset)) is not None:
            onset.add_metric(base, o)
        kill.add_metric(base, 1.0 if f.kill_worthy else 0.0)
        io.add_metric([*base, "write"], 1.0 if f.writing else 0.0)
        io.add_metric([*base, "read"], 1.0 if f.reading else 0.0)
        for r in f.ranks:
            rl = [*base, str(r.rank)]
            since, taken = _ok(r.stack_same_since), _ok(r.stack_sampled_at)
            if r.stack_phase is not None and since is not None and taken is not None:
                stack.add_metric([*rl, r.stack_phase, r.stack_where or "", r.stack_collective or ""], since)
                sampled.add_metric(rl, taken)
            if r.step is not None:
                step.add_metric(rl, float(r.step))
            if (c := _ok(r.step_changed_at)) is not None:
                changed.add_metric(rl, c)
            if r.phase is not None and (p := _ok(r.phase_since)) is not None:
                phase.add_metric([*rl, r.phase], p)
            if (s := _ok(r.spin_since)) is not None:
                spin.add_metric(rl, s)
    yield from (at, world, verdict, onset, kill, io, stack, sampled, step, changed, phase, spin)


__all__ = ["METRIC_NAMES", "fleet_metrics"]
