"""Other nodes' facts about one job, read back from Prometheus (pure parsing; the query is the client's).

:func:`job_query` is the one selector the daemon sends per job; :func:`remote_facts` turns its
answer into one :class:`~gpu_triage.signals.fleet.facts.NodeJobFacts` per other node. What the answer cannot
be trusted for is said, never guessed: a sample with a bad label is skipped and counted, and the
caller (:mod:`gpu_triage.signals.fleet.fusion`) decides staleness and completeness with the time passed in.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpu_triage.signals.fleet.facts import JOB_LABEL, NODE_LABEL, PREFIX, NodeJobFacts, RankFacts

MAX_RANK = 1 << 20
"""A rank label above this is refused (no job has a million ranks)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant query's answer."""

    labels: dict[str, str]
    value: float
    timestamp: float
    """The sample's time as Prometheus evaluated it (epoch seconds)."""


LAST_SEEN = PREFIX + "last_facts_timestamp_seconds"
"""The name :func:`job_query` gives each node's latest facts time over the lookback (not exported
by any daemon: computed by the query, so a node whose series vanished - its target down - is still
seen, with the time it went silent)."""
LOOKBACK_S = 900
"""How far back :func:`job_query` looks for nodes of the job that went silent."""


def job_query(job: str) -> str:
    """Every fleet series of one job, from every node (``training_job`` quoted safely), and each
    node's latest facts time over the last :data:`LOOKBACK_S` (as :data:`LAST_SEEN`): a node whose
    daemon, scrape or whole machine stopped has no current series but still a last time."""
    sel = f"{JOB_LABEL}={json.dumps(job)}"
    last = (
        f"max by ({JOB_LABEL}, {NODE_LABEL}) "
        f"(max_over_time({PREFIX}facts_timestamp_seconds{{{sel}}}[{LOOKBACK_S}s]))"
    )
    return f'{{__name__=~"{PREFIX}.+",{sel}}} or label_replace({last}, "__name__", "{LAST_SEEN}", "", "")'


@dataclass(frozen=True, slots=True)
class StackGroup:
    """Ranks whose stacks wait at the same place, across the world."""

    where: str
    phase: str
    collective: bool
    count: int
    frozen_min_s: float
    """The least time any of them has been unchanged (as each node last sampled it)."""
    since_max: float | None
    sampled_min: float | None


@dataclass(frozen=True, slots=True)
class JobSummary:
    """What the rules say about one job's whole world (this node's ranks included)."""

    nodes: int
    world_size: int | None
    oldest_facts: float | None
    ranks_reported: int
    rank_reports: int
    groups: tuple[StackGroup, ...]
    odd: tuple[tuple[str, int], ...]
    silent: tuple[tuple[str, float], ...]
    """(node, its last facts) of the nodes of the job silent past ``stale_after_s``."""
    writing: tuple[str, ...]
    reading: tuple[str, ...]
    save_work: tuple[tuple[str, int, str], ...]
    """(node, rank, phase) of ranks inside a save or an eval in no collective."""
    checkpoint_nodes: tuple[str, ...]
    announced: tuple[tuple[str, int, str], ...]
    """(node, rank, phase) of ranks that announced a save or an eval (progress files)."""
    train_ranks: int = 0
    spinning_ranks: int = 0
    spin_since_max: float | None = None
    active_since_max: float | None = None


@dataclass(frozen=True, slots=True)
class RemoteFacts:
    """What Prometheus answered about one job, at one time."""

    job: str
    asked_at: float
    """When the answer came (epoch seconds)."""
    nodes: tuple[NodeJobFacts, ...] = ()
    """One per other node that exported facts for the job."""
    error: str | None = None
    """Why there is no answer (Prometheus unreachable, too slow, too large, malformed)."""
    skipped: int = 0
    """Samples refused (a label that is no rank, a node with conflicting facts...)."""
    query_s: float = 0.0
    bytes: int = 0
    asked: bool = True
    """False: no query was sent (the job has not been suspicious since the daemon started)."""
    last_seen: tuple[tuple[str, float], ...] = ()
    """(node, its latest facts time) for every other node that reported on the job within the query's
    lookback, whether its series are current or vanished (a node gone silent)."""
    summary: JobSummary | None = None
    """The job's world as the recording rules compute it (``[cluster] job_rules``): then ``nodes`` is
    empty and the rule judges the aggregates (:mod:`gpu_triage.signals.fleet.summary`)."""


@dataclass
class _Node:
    time: float | None = None
    world: int | None = None
    verdict: str = "unknown"
    onset: float | None = None
    kill_worthy: bool = False
    writing: bool = False
    reading: bool = False
    ranks: dict[int, dict[str, object]] = field(default_factory=dict)


def _rank(labels: dict[str, str]) -> int | None:
    text = labels.get("rank", "")
    if not text.isdigit() or len(text) > 8:
        return None
    value = int(text)
    return value if value <= MAX_RANK else None


def remote_facts(
    job: str,
    samples: Iterable[Sample],
    *,
    own_node: str,
    asked_at: float,
    query_s: float = 0.0,
    size: int = 0,
) -> RemoteFacts:
    """Samples of :func:`job_query` -> the other nodes' facts (this node's own series are left out)."""
    nodes: dict[str, _Node] = {}
    seen: dict[str, float] = {}
    skipped = 0
    for s in samples:
        labels = s.labels
        name = labels.get("__name__", "")
        node = labels.get(NODE_LABEL, "")
        if (
            labels.get(JOB_LABEL) != job
            or not node
            or not name.startswith(PREFIX)
            or not math.isfinite(s.value)
        ):
            skipped += 1
            continue
        if node == own_node:
            continue
        if name == LAST_SEEN:
            seen[node[:253]] = max(s.value, seen.get(node[:253], s.value))
            continue
        n = nodes.setdefault(node, _Node())
        key = name[len(PREFIX) :]
        if not key.startswith("rank_"):
            if key == "facts_timestamp_seconds":
                n.time = s.value
            elif key == "world_size" and 0 < s.value <= MAX_RANK:
                n.world = int(s.value)
            elif key == "verdict" and s.value == 1.0:
                n.verdict = labels.get("verdict", "unknown")[:64]
            elif key == "verdict_onset_timestamp_seconds":
                n.onset = s.value
            elif key == "kill_worthy":
                n.kill_worthy = s.value == 1.0
            elif key == "io_active":
                if labels.get("io") == "write":
                    n.writing = s.value == 1.0
                elif labels.get("io") == "read":
                    n.reading = s.value == 1.0
            continue
        rank = _rank(labels)
        if rank is None:
            skipped += 1
            continue
        r = n.ranks.setdefault(rank, {})
        if key == "rank_stack_since_timestamp_seconds":
            r["stack_phase"] = labels.get("phase", "other")[:32]
            r["stack_where"] = labels.get("where", "")[:160]
            r["stack_same_since"] = s.value
            r["stack_collective"] = labels.get("collective", "")[:64] or None
        elif key == "rank_stack_sampled_timestamp_seconds":
            r["stack_sampled_at"] = s.value
        elif key == "rank_step" and 0 <= s.value < 2**53:
            r["step"] = int(s.value)
        elif key == "rank_step_changed_timestamp_seconds":
            r["step_changed_at"] = s.value
        elif key == "rank_phase_since_timestamp_seconds":
            r["phase"] = labels.get("phase", "")[:32]
            r["phase_since"] = s.value
        elif key == "rank_spin_since_timestamp_seconds":
            r["spin_since"] = s.value
    out = []
    for node, n in sorted(nodes.items()):
        if n.time is None:  # no facts time: cannot tell fresh from stale
            skipped += 1
            continue
        ranks = []
        for rank, values in sorted(n.ranks.items()):
            rf = RankFacts(rank=rank)
            ranks.append(replace(rf, **values))  # type: ignore[arg-type]
        out.append(
            NodeJobFacts(
                job=job,
                node=node[:253],
                time=n.time,
                world_size=n.world,
                verdict=n.verdict,
                onset=n.onset,
                kill_worthy=n.kill_worthy,
                writing=n.writing,
                reading=n.reading,
                ranks=tuple(ranks),
            )
        )
    for f in out:  # a node's current facts are seen too (an answer without the lookback part)
        seen[f.node] = max(f.time, seen.get(f.node, f.time))
    return RemoteFacts(
        job, asked_at, tuple(out), None, skipped, query_s, size, last_seen=tuple(sorted(seen.items()))
    )


__all__ = [
    "LAST_SEEN",
    "LOOKBACK_S",
    "JobSummary",
    "RemoteFacts",
    "Sample",
    "StackGroup",
    "job_query",
    "remote_facts",
]
