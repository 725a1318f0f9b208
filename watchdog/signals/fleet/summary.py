"""One job's world as the recording rules of ``gpu-watchdog-job`` compute it (pure parsing; the query is
the client's): the answer stays the same size whatever the job's size.

Reading every node's raw facts (:func:`~gpu_triage.signals.fleet.remote.job_query`) grows with the job:
a 2,048-rank job answers 5,600 series, and with every node asking, Prometheus sends the square of the
node count. The rules (``deploy/prometheus/gpu-watchdog.rules.yml``) compute each job's aggregates once
per evaluation: one series per *group* of ranks whose stacks wait at the same place (call site, phase,
collective) with its count, the least time any of them has been frozen, the latest time one froze, the
oldest sample; the ranks reported and the reports (a rank two nodes claim counts twice); the world size;
the oldest node's facts; the K2 counts; the odd ranks (at most 16). :func:`summary_query` reads those
for one job, among them - each bounded to a few series - the job's oldest nodes (the silent ones) and
the positive signs of a healthy save (nodes writing or reading, ranks doing a save's work, ``checkpoint``
verdicts, announced saves), each recorded by the rules too, so the query touches recorded series only.
:func:`job_summary` turns the answer into a :class:`JobSummary`, which
:func:`gpu_triage.signals.fleet.fusion.fuse` judges like the raw facts.

The aggregates include this node's own ranks as Prometheus last scraped them; this node's sampler
must agree (its ranks frozen) on top, so a scrape's delay can only make the rule wait, never complete
early.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

from gpu_triage.signals.fleet.facts import JOB_LABEL, NODE_LABEL, PREFIX
from gpu_triage.signals.fleet.remote import MAX_RANK, JobSummary, Sample, StackGroup

MAX_NAMED = 16
"""Silent nodes, odd ranks and signs of a save read per answer (the rest are counted, not named)."""
MAX_NAMED_SERIES = 256
"""Series naming a node read per answer (the rules record at most 16 + 4 x 5 per job)."""
MAX_GROUPS = 4096
"""More stack groups than this in one answer is refused (a job whose ranks all wait apart)."""
RULES_PRESENT = f"training_job:{PREFIX}world_size:max"
"""The series whose presence says the rules run (else the daemon reads the raw facts)."""

_GROUP = "training_job_where:" + PREFIX
_JOB = "training_job:" + PREFIX
_NODE = "training_job_fleet_node:" + PREFIX


LAST_FACTS = f"training_job_fleet_node:{PREFIX}last_facts:timestamp_seconds"
"""One series per node of the job: the one family of the rules the query leaves out."""


def summary_query(job: str) -> str:
    """The job's recorded aggregates: a few series per job plus one per group of ranks waiting at the
    same place - never one per node or per rank (the rules record what is named, a few each)."""
    names = f'__name__=~"training_job(_[a-z_]+)?:{PREFIX}.+",__name__!="{LAST_FACTS}"'
    return f"{{{names},{JOB_LABEL}={json.dumps(job)}}}"


def _num(s: Sample) -> float | None:
    return s.value if math.isfinite(s.value) else None


def _int_label(labels: dict[str, str], key: str) -> int | None:
    text = labels.get(key, "")
    if not text.isdigit() or len(text) > 8 or int(text) > MAX_RANK:
        return None
    return int(text)


def job_summary(
    job: str, samples: Iterable[Sample], *, now: float, stale_after_s: float
) -> JobSummary | None:
    """The answer of :func:`summary_query` -> the job's summary; None when the rules do not run
    (no :data:`RULES_PRESENT` series for the job). Samples of other jobs or with bad labels are skipped.
    Of the job's oldest nodes, those whose last facts are older than ``stale_after_s`` are silent."""
    groups: dict[tuple[str, str, bool], dict[str, float]] = {}
    job_values: dict[str, float] = {}
    odd: list[tuple[str, int]] = []
    oldest: list[tuple[str, float]] = []
    writing: list[str] = []
    reading: list[str] = []
    save_work: list[tuple[str, int, str]] = []
    checkpoint: list[str] = []
    announced: list[tuple[str, int, str]] = []
    n_named = 0  # the named series (nodes, ranks) an answer may hold, bounded whatever it holds
    for s in samples:
        labels = s.labels
        name = labels.get("__name__", "")
        value = _num(s)
        if labels.get(JOB_LABEL) != job or value is None:
            continue
        node = labels.get(NODE_LABEL, "")[:253]
        if node and not name.startswith(_GROUP):
            n_named += 1
            if n_named > MAX_NAMED_SERIES:
                continue
        if name.startswith(_GROUP):
            key = (
                labels.get("where", "")[:160],
                labels.get("phase", "")[:32],
                bool(labels.get("collective")),
            )
            groups.setdefault(key, {})[name[len(_GROUP) :]] = value
        elif name.startswith(_JOB + "odd_rank"):
            rank = _int_label(labels, "rank")
            if rank is not None and node and len(odd) < MAX_NAMED:
                odd.append((node, rank))
        elif name.startswith(_JOB + "save_work_rank") or name.startswith(_JOB + "announced_rank"):
            rank = _int_label(labels, "rank")
            if rank is not None and node:
                named = save_work if "save_work" in name else announced
                named.append((node, rank, labels.get("phase", "")[:32]))
        elif name.startswith(_JOB):
            job_values[name[len(_JOB) :]] = value
        elif name == _NODE + "oldest_facts:timestamp_seconds" and node:
            oldest.append((node, value))
        elif name == _NODE + "io_active:first" and node:
            (writing if labels.get("io") == "write" else reading).append(node)
        elif name == _NODE + "checkpoint_verdict:first" and node:
            checkpoint.append(node)
    if "world_size:max" not in job_values:
        return None
    if len(groups) > MAX_GROUPS:
        groups = dict(list(groups.items())[:MAX_GROUPS])
    out_groups = []
    for (where, phase, collective), v in sorted(groups.items()):
        count = int(v.get("stack_ranks:count", 0))
        if count <= 0:
            continue
        out_groups.append(
            StackGroup(
                where,
                phase,
                collective,
                count,
                v.get("stack_frozen:min_seconds", 0.0),
                v.get("stack_since:max_timestamp_seconds"),
                v.get("stack_sampled:min_timestamp_seconds"),
            )
        )
    world = job_values.get("world_size:max")
    actives = [
        t
        for t in (
            job_values.get(k)
            for k in ("step_changed:max_timestamp_seconds", "train_since:max_timestamp_seconds")
        )
        if t is not None
    ]
    return JobSummary(
        nodes=int(job_values.get("nodes:count", 0)),
        world_size=int(world) if world is not None and 0 < world <= MAX_RANK else None,
        oldest_facts=job_values.get("facts:min_timestamp_seconds"),
        ranks_reported=int(job_values.get("ranks_reported:count", 0)),
        rank_reports=int(job_values.get("rank_reports:count", 0)),
        groups=tuple(out_groups),
        odd=tuple(sorted(odd, key=lambda nr: nr[1])),
        silent=tuple(sorted((n, t) for n, t in oldest if now - t > stale_after_s)),
        writing=tuple(sorted(set(writing))),
        reading=tuple(sorted(set(reading))),
        save_work=tuple(sorted(save_work)),
        checkpoint_nodes=tuple(sorted(set(checkpoint))),
        announced=tuple(sorted(announced)),
        train_ranks=int(job_values.get("train_ranks:count", 0)),
        spinning_ranks=int(job_values.get("spinning_ranks:count", 0)),
        spin_since_max=job_values.get("spin_since:max_timestamp_seconds"),
        active_since_max=max(actives) if actives else None,
    )


__all__ = ["MAX_NAMED", "RULES_PRESENT", "JobSummary", "StackGroup", "job_summary", "summary_query"]
