"""``gpu-watchdog cluster --prometheus URL``: the job-wide view from the facts Prometheus already holds.

Instead of polling every daemon (``gpu-watchdog cluster URL...``, fine for ten nodes), one query
reads every node's ``gpu_watchdog_fleet_*`` facts (:mod:`gpu_triage.signals.fleet.exposition`) and
:func:`analyse` - pure - pools them per training job: each node's verdict and how fresh its facts
are, the job-wide verdict (``hung`` when any node holds kill-worthy evidence), the rank that stopped
first (the earliest last step change, else the stack unchanged longest), the lagging rank (lowest
step), the ranks whose stacks wait somewhere other than the majority's (named with their node), and
ranks of the world no node reports.

Exit codes as ``cluster``: 0 ok; 1 a deadlock verdict on any node; 2 Prometheus unreachable or an
answer that is not one.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from gpu_triage.signals.fleet.facts import (
    JOB_LABEL,
    NODE_LABEL,
    PREFIX,
    SAVE_OR_EVAL,
    NodeJobFacts,
    RankFacts,
)
from gpu_triage.signals.fleet.remote import LAST_SEEN, LOOKBACK_S, Sample, remote_facts

EXIT_OK, EXIT_DEADLOCK, EXIT_UNREACHABLE = 0, 1, 2
HUNG = frozenset({"deadlock_suspected", "deadlock_confirmed"})
#: Worst first: the job-wide verdict when no node is kill-worthy.
SEVERITY = (
    "deadlock_confirmed",
    "deadlock_suspected",
    "stalled_checkpoint",
    "stalled",
    "telemetry_lost",
    "data_starvation",
    "suspended",
    "slow",
    "checkpoint",
    "healthy",
)
MAX_NAMED = 16


SILENT_S = 60.0
"""A node whose facts about a job are older than this is silent (``[cluster] node_lost_after_s``)."""


def fleet_query(job: str | None = None) -> str:
    """Every fleet series (of one job), and each node's last facts time over the lookback (a node
    whose target is down has no current series)."""
    sel = f",{JOB_LABEL}={json.dumps(job)}" if job else ""
    last = (
        f"max by ({JOB_LABEL}, {NODE_LABEL}) "
        f"(max_over_time({PREFIX}facts_timestamp_seconds{{{sel[1:]}}}[{LOOKBACK_S}s]))"
    )
    return f'{{__name__=~"{PREFIX}.+"{sel}}} or label_replace({last}, "__name__", "{LAST_SEEN}", "", "")'


@dataclass(frozen=True, slots=True)
class RankAt:
    node: str
    rank: int
    value: float | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class JobWide:
    job: str
    verdict: str
    nodes: tuple[NodeJobFacts, ...]
    world_size: int | None
    missing: tuple[int, ...]
    first_stopped: RankAt | None
    lagging: RankAt | None
    lag_steps: int | None
    odd: tuple[RankAt, ...]
    groups: tuple[tuple[str, int], ...]
    silent: tuple[tuple[str, float], ...] = ()
    """(node, its last facts) of the job's nodes silent for more than :data:`SILENT_S`."""
    split: bool = False
    """Ranks wait in a collective inside a save or an eval while others are in a training step."""

    def cause(self) -> str | None:
        """The job-wide cause the facts show: a node lost (or silent), or the split."""
        if self.silent:
            names = ", ".join(n for n, _ in self.silent[:MAX_NAMED])
            return f"node {names} lost" if self.verdict == "hung" else f"node {names} silent"
        if self.split:
            return "split: ranks in a save's or an eval's collective, the others in a training step"
        return None

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "job": self.job,
            "verdict": self.verdict,
            "world_size": self.world_size,
            "nodes": [
                {
                    "node": n.node,
                    "verdict": n.verdict,
                    "kill_worthy": n.kill_worthy,
                    "onset": n.onset,
                    "facts_age_s": round(now - n.time, 1),
                    "ranks": [r.rank for r in n.ranks],
                }
                for n in self.nodes
            ],
            "missing_ranks": list(self.missing),
            "first_stopped": _rank_json(self.first_stopped),
            "lagging": _rank_json(self.lagging),
            "lag_steps": self.lag_steps,
            "odd": [_rank_json(r) for r in self.odd],
            "stack_groups": [{"where": w, "ranks": c} for w, c in self.groups],
            "silent_nodes": [{"node": n, "last_facts": t} for n, t in self.silent[:MAX_NAMED]],
            "split": self.split,
            "cause": self.cause(),
        }


def _rank_json(r: RankAt | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {"node": r.node, "rank": r.rank, "value": r.value, "detail": r.detail}


def _job_verdict(nodes: Sequence[NodeJobFacts]) -> str:
    if any(n.kill_worthy for n in nodes):
        return "hung"
    order = {v: i for i, v in enumerate(SEVERITY)}
    return min((n.verdict for n in nodes), key=lambda v: order.get(v, len(order)), default="unknown")


def analyse(samples: Iterable[Sample], now: float) -> tuple[JobWide, ...]:
    """Every job's job-wide view from one answer (pure)."""
    by_job: dict[str, list[Sample]] = {}
    for s in samples:
        job = s.labels.get(JOB_LABEL)
        if job:
            by_job.setdefault(job, []).append(s)
    out = []
    for job, ss in sorted(by_job.items()):
        remote = remote_facts(job, ss, own_node="", asked_at=now)
        nodes = tuple(n for n in remote.nodes if now - n.time <= SILENT_S)
        silent = tuple((n, t) for n, t in remote.last_seen if now - t > SILENT_S)
        ranks: list[tuple[str, RankFacts]] = [(n.node, r) for n in nodes for r in n.ranks]
        worlds = [n.world_size for n in nodes if n.world_size is not None]
        world = max(worlds) if worlds else None
        missing = tuple(sorted(set(range(world)) - {r.rank for _, r in ranks})) if world else ()
        stepped = [(n, r) for n, r in ranks if r.step is not None]
        changed = [(n, r) for n, r in stepped if r.step_changed_at is not None]
        stacked = [(n, r) for n, r in ranks if r.stack_same_since is not None]
        lagging, lag = None, None
        if stepped:
            n, r = min(stepped, key=lambda nr: (nr[1].step or 0, nr[1].rank))
            top = max(x.step or 0 for _, x in stepped)
            lag = top - (r.step or 0)
            lagging = RankAt(n, r.rank, float(r.step or 0), f"{lag} behind") if lag > 0 else None
        members: dict[str, list[tuple[str, int]]] = {}
        for n, r in stacked:
            members.setdefault(r.stack_where or r.stack_phase or "?", []).append((n, r.rank))
        groups = sorted(members.items(), key=lambda kv: (-len(kv[1]), min(x for _, x in kv[1])))
        odd: tuple[RankAt, ...] = ()
        if len(groups) > 1 and len(groups[0][1]) > len(groups[1][1]):
            odd = tuple(
                RankAt(n, r, None, w) for w, ms in groups[1:] for n, r in sorted(ms, key=lambda m: m[1])
            )
        first = None
        if changed:
            n, r = min(changed, key=lambda nr: nr[1].step_changed_at or 0.0)
            first = RankAt(n, r.rank, r.step_changed_at, f"step {r.step}")
        elif stacked:
            # Without steps, "stopped since" is when each node's sampler first saw the stack unchanged:
            # nodes sample on their own schedules, so across nodes those times say little. The ranks
            # that wait somewhere other than the majority are the ones that did not arrive.
            odd_keys = {(o.node, o.rank) for o in odd}
            pool = [(n, r) for n, r in stacked if (n, r.rank) in odd_keys] or stacked
            n, r = min(pool, key=lambda nr: (nr[1].stack_same_since or 0.0, nr[1].rank))
            first = RankAt(n, r.rank, r.stack_same_since, r.stack_where or "")
        out.append(
            JobWide(
                job=job,
                verdict=_job_verdict(nodes),
                nodes=nodes,
                world_size=world,
                missing=missing,
                first_stopped=first,
                lagging=lagging,
                lag_steps=lag,
                odd=odd,
                groups=tuple((w, len(ms)) for w, ms in groups),
                silent=silent,
                split=_split(r for _, r in stacked),
            )
        )
    return tuple(out)


def _split(ranks: Iterable[RankFacts]) -> bool:
    phases = [(r.stack_phase, bool(r.stack_collective)) for r in ranks]
    in_phase = any(p in SAVE_OR_EVAL and c for p, c in phases)
    in_step = any(p in {"collective", "forward", "backward", "optimizer"} for p, _ in phases)
    return in_phase and in_step


def exit_code(jobs: Sequence[JobWide]) -> int:
    return EXIT_DEADLOCK if any(n.verdict in HUNG for j in jobs for n in j.nodes) else EXIT_OK


def render(jobs: Sequence[JobWide], now: float) -> str:
    if not jobs:
        return "no gpu_watchdog_fleet_* facts in Prometheus (daemons of this version scraped?)\n"
    lines = []
    for j in jobs:
        world = f", world {j.world_size}" if j.world_size else ""
        lines.append(f"job {j.job}: {j.verdict} ({len(j.nodes)} node(s){world})")
        for n in j.nodes:
            kw = ", kill-worthy" if n.kill_worthy else ""
            ranks = ",".join(str(r.rank) for r in n.ranks[:MAX_NAMED])
            lines.append(f"  {n.node}: {n.verdict}{kw} (facts {now - n.time:.0f} s old; ranks {ranks})")
        for name, t in j.silent[:MAX_NAMED]:
            lines.append(f"  {name}: silent (no facts for {now - t:.0f} s)")
        if (cause := j.cause()) is not None:
            lines.append(f"  cause: {cause}")
        if j.missing:
            lines.append(f"  ranks no node reports: {','.join(map(str, j.missing[:MAX_NAMED]))}")
        if j.first_stopped is not None:
            f = j.first_stopped
            when = time.strftime("%H:%M:%S", time.gmtime(f.value)) if f.value else "?"
            lines.append(f"  stopped first: {f.node} rank {f.rank} at {when} UTC ({f.detail})")
        if j.lagging is not None:
            lines.append(f"  lagging: {j.lagging.node} rank {j.lagging.rank} ({j.lagging.detail})")
        if j.odd:
            named = "; ".join(f"{r.node} rank {r.rank} ({r.detail})" for r in j.odd[:MAX_NAMED])
            lines.append(f"  waiting elsewhere than the majority: {named}")
    return "\n".join(lines) + "\n"


def run(url: str, *, job: str | None, as_json: bool, timeout_s: float, out: TextIO = sys.stdout) -> int:
    from gpu_triage.signals.fleet.prom_client import PromClient, PromError

    client = PromClient(url, timeout_s=timeout_s)
    try:
        result = client.query(fleet_query(job))
    except PromError as e:
        print(f"gpu-watchdog cluster: {url}: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    finally:
        client.close()
    now = time.time()
    jobs = analyse(result.samples, now)
    if as_json:
        out.write(json.dumps({"prometheus": url, "time": now, "jobs": [j.to_json(now) for j in jobs]}) + "\n")
    else:
        out.write(render(jobs, now))
    return exit_code(jobs)


__all__ = ["JobWide", "analyse", "fleet_query", "render", "run"]
