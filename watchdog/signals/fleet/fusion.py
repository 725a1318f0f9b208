"""Local evidence + other nodes' facts -> what the whole job's world says (pure, time passed in).

The rule (docs/cluster.md, "The rule"):

- **Remote facts never stand alone.** They only *complete* this node's own evidence (the K6 stack
  proof, the K2 frozen-steps-and-spin proof) or *veto* it. A kill still needs this node's own ranks
  frozen and its own second signal; each node kills only its own ranks.
- **Complete** (stacks): every rank of the world has a fresh stack - this node's from its sampler,
  every other rank from exactly one other node's fresh facts - every one unchanged for at least
  ``frozen_s``, none inside a save or an eval, most of them in a collective. The ranks outside the
  largest group of call sites are the *odd* ones, named with their node: the rank that did not
  arrive.
- **Complete** (steps, K2): every other rank is in ``train`` with a step, frozen since a known time,
  and its GPU in the spin band.
- **Veto**: a fresh fact of another node that explains the wait - a rank's stack inside a save or
  an eval, the node's ranks writing, the node's own verdict ``checkpoint``. A veto removes the hung
  class (the verdict is alert-worthy at most), like a save seen on this node.
- **Unknown**: no answer from Prometheus, an answer older than ``stale_after_s``, a node whose facts
  are older than ``stale_after_s``, a rank of the world that no node reports freshly, a rank that two
  nodes claim. Then nothing is completed and nothing vetoed: the verdict is this node's own
  judgment (as without ``[cluster]``), and the evidence says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpu_triage.signals.fleet.facts import JobFacts
from gpu_triage.signals.fleet.remote import RemoteFacts
from gpu_triage.signals.stacks.evidence import StackFacts

SAVE_OR_EVAL = frozenset({"checkpoint", "eval"})
MAX_NAMED = 16


class FleetState(StrEnum):
    UNKNOWN = "unknown"
    """Remote facts missing, stale or unanswered: per-node judgment."""
    INCOMPLETE = "incomplete"
    """Fresh facts for every rank, but they do not complete the proof (a rank still moves)."""
    COMPLETE = "complete"
    VETO = "veto"


@dataclass(frozen=True, slots=True)
class FusionConfig:
    """Derived from the sections (``DetectorConfig.fusion()``), which hold the defaults."""

    stale_after_s: float
    """A node's facts (and Prometheus's answer) older than this are unknown ([cluster] stale_after_s)."""
    frozen_s: float
    """A stack unchanged this long is frozen ([stacks] frozen_s)."""
    fresh_s: float
    """A stack taken longer ago than this is no fact ([stacks] fresh_s)."""


@dataclass(frozen=True, slots=True)
class FleetEvidence:
    state: FleetState
    reason: str
    nodes: tuple[str, ...] = ()
    """The other nodes whose fresh facts were used."""
    stale_nodes: tuple[str, ...] = ()
    veto: str | None = None
    stacks_complete: bool = False
    odd: tuple[tuple[str, int], ...] = ()
    """(node, rank) of the ranks outside the world's largest group of call sites."""
    groups: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()
    frozen_since: float | None = None
    """The latest time any rank of the world froze (stacks)."""
    remote_frozen_since: float | None = None
    """K2: the latest last-progress time of the other nodes' train ranks (None: not all frozen-able)."""
    remote_spin_since: float | None = None
    """K2: since when every other node's rank's GPU has spun (None: not all spinning)."""
    age_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def odd_ranks(self) -> tuple[int, ...]:
        return tuple(r for _, r in self.odd)

    def named_odd(self) -> str:
        return ", ".join(f"{node} rank {rank}" for node, rank in self.odd[:MAX_NAMED])

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "state": str(self.state),
            "reason": self.reason,
            "nodes": list(self.nodes),
            "stale_nodes": list(self.stale_nodes),
            "stacks_complete": self.stacks_complete,
            "odd": [{"node": n, "rank": r} for n, r in self.odd[:MAX_NAMED]],
            "groups": [
                {"where": k, "ranks": [f"{n}/{r}" for n, r in members[:MAX_NAMED]], "count": len(members)}
                for k, members in self.groups[:MAX_NAMED]
            ],
            "frozen_since": self.frozen_since,
            "age_s": None if self.age_s is None else round(self.age_s, 1),
        }
        if self.veto:
            doc["veto"] = self.veto
        if self.state is FleetState.UNKNOWN:
            doc["fallback"] = "per-node judgment: other nodes' facts are unknown"
        return doc


def _unknown(reason: str, **kw: Any) -> FleetEvidence:
    return FleetEvidence(FleetState.UNKNOWN, reason, **kw)


def _ranks_text(ranks: Sequence[int]) -> str:
    shown = ",".join(map(str, ranks[:MAX_NAMED]))
    return shown + (f" (+{len(ranks) - MAX_NAMED})" if len(ranks) > MAX_NAMED else "")


def fuse(
    now: float,
    *,
    own_node: str,
    world_size: int | None,
    local_ranks: Sequence[int],
    local_stacks: StackFacts | None,
    remote: RemoteFacts | None,
    cfg: FusionConfig,
) -> FleetEvidence:
    """What the world's facts say about one job (see the module's rule)."""
    if remote is None:
        return _unknown("no answer from Prometheus yet")
    age = now - remote.asked_at
    if not remote.asked:
        return _unknown(f"other nodes' facts {remote.error or 'not asked for'}")
    if remote.error is not None:
        return _unknown(f"Prometheus: {remote.error}", age_s=age)
    if age > cfg.stale_after_s:
        return _unknown(f"Prometheus's last answer is {age:.0f} s old", age_s=age)
    fresh = [n for n in remote.nodes if now - n.time <= cfg.stale_after_s]
    stale = [n.node for n in remote.nodes if now - n.time > cfg.stale_after_s]
    names = tuple(n.node for n in fresh)
    common: dict[str, Any] = {"nodes": names, "stale_nodes": tuple(stale), "age_s": age}
    # a veto from any fresh node's fact, whatever the rest says
    vetoes = []
    for n in fresh:
        if n.writing:
            vetoes.append(f"{n.node}: its ranks are writing")
        if n.verdict == "checkpoint":
            vetoes.append(f"{n.node}: its verdict is checkpoint")
        for r in n.ranks:
            if r.stack_phase in SAVE_OR_EVAL and _stack_fresh(now, r.stack_sampled_at, cfg):
                what = "a checkpoint save" if r.stack_phase == "checkpoint" else "an eval"
                vetoes.append(f"{n.node} rank {r.rank}'s stack is inside {what}")
    if vetoes:
        return FleetEvidence(FleetState.VETO, "; ".join(vetoes[:4]), veto="; ".join(vetoes[:4]), **common)
    if world_size is None:
        return _unknown("the job's world size is unknown", **common)
    # every rank of the world reported exactly once
    owner: dict[int, str] = {r: own_node for r in local_ranks}
    conflicts: list[int] = []
    for n in fresh:
        for r in n.ranks:
            if r.rank in owner and owner[r.rank] != n.node:
                conflicts.append(r.rank)
            owner[r.rank] = n.node
    if conflicts:
        return _unknown(f"rank(s) {_ranks_text(sorted(set(conflicts)))} reported by two nodes", **common)
    missing = sorted(set(range(world_size)) - set(owner))
    if missing:
        where = f"; stale: {', '.join(stale[:MAX_NAMED])}" if stale else ""
        return _unknown(f"no fresh facts for rank(s) {_ranks_text(missing)}{where}", **common)
    stacks = _stacks(now, own_node, world_size, local_ranks, local_stacks, fresh, cfg)
    k2 = _steps(fresh)
    state = FleetState.COMPLETE if stacks.get("complete") or k2[0] is not None else FleetState.INCOMPLETE
    reason = str(stacks.get("reason") or "")
    if state is FleetState.COMPLETE:
        reason = "every rank of the world reported" + (
            ": frozen in collectives" if stacks.get("complete") else ": steps frozen, GPUs spinning"
        )
    return FleetEvidence(
        state,
        reason,
        stacks_complete=bool(stacks.get("complete")),
        odd=stacks.get("odd", ()),
        groups=stacks.get("groups", ()),
        frozen_since=stacks.get("frozen_since"),
        remote_frozen_since=k2[0],
        remote_spin_since=k2[1],
        **common,
    )


def _stack_fresh(now: float, sampled_at: float | None, cfg: FusionConfig) -> bool:
    return sampled_at is not None and now - sampled_at <= cfg.fresh_s


def _stacks(
    now: float,
    own_node: str,
    world_size: int,
    local_ranks: Sequence[int],
    sf: StackFacts | None,
    fresh: Sequence[JobFacts],
    cfg: FusionConfig,
) -> dict[str, Any]:
    if sf is None:
        return {"reason": "no stacks sampled on this node"}
    if not sf.frozen or sf.unsampled or set(sf.pattern.sampled) != set(local_ranks):
        return {"reason": "this node's ranks' stacks are not all frozen in collectives"}
    members: dict[str, list[tuple[str, int]]] = {}
    collective = 0
    since: list[float] = []
    for g in sf.pattern.groups:
        for local in g.ranks:
            members.setdefault(g.key, []).append((own_node, local))
            if g.key.startswith("collective"):
                collective += 1
    if sf.frozen_since is not None:
        since.append(sf.frozen_since)
    for n in fresh:
        for r in n.ranks:
            if not _stack_fresh(now, r.stack_sampled_at, cfg) or r.stack_phase is None:
                return {"reason": f"{n.node} rank {r.rank}: no fresh stack"}
            if r.stack_frozen_s() < cfg.frozen_s:
                return {"reason": f"{n.node} rank {r.rank}'s stack changed {r.stack_frozen_s():.0f} s ago"}
            members.setdefault(r.stack_where or r.stack_phase, []).append((n.node, r.rank))
            collective += r.stack_phase == "collective"
            if r.stack_same_since is not None:
                since.append(r.stack_same_since)
    if collective * 2 < world_size:
        return {"reason": f"only {collective} of {world_size} ranks wait in a collective"}
    groups = tuple(
        (k, tuple(sorted(v, key=lambda nr: nr[1])))
        for k, v in sorted(members.items(), key=lambda kv: (-len(kv[1]), min(r for _, r in kv[1])))
    )
    odd: tuple[tuple[str, int], ...] = ()
    if len(groups) > 1 and len(groups[0][1]) > len(groups[1][1]):
        odd = tuple(sorted((m for _, ms in groups[1:] for m in ms), key=lambda nr: nr[1]))
    return {"complete": True, "groups": groups, "odd": odd, "frozen_since": max(since) if since else None}


def _steps(fresh: Sequence[JobFacts]) -> tuple[float | None, float | None]:
    """K2 completion: (latest last progress, latest spin start) over the other nodes' ranks, or
    (None, None) unless every one is a train rank with a step, a progress time and a spinning GPU."""
    actives: list[float] = []
    spins: list[float] = []
    for n in fresh:
        for r in n.ranks:
            active = r.active_since()
            if r.phase != "train" or r.step is None or active is None or r.spin_since is None:
                return None, None
            actives.append(active)
            spins.append(r.spin_since)
    if not actives:
        return None, None
    return max(actives), max(spins)


__all__ = ["FleetEvidence", "FleetState", "FusionConfig", "fuse"]
