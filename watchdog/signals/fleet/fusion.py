"""Local evidence + other nodes' facts -> what the whole job's world says (pure, time passed in).

The rule (docs/cluster.md, "The rule"):

- **Remote facts never stand alone.** They only *complete* this node's own evidence (the K6 stack
  proof, the K2 frozen-steps-and-spin proof, the node-lost proof) or *veto* it. A kill still needs
  this node's own ranks frozen and its own second signal; each node kills only its own ranks.
- **Complete** (stacks, frozen): every rank of the world has a fresh stack - this node's from its
  sampler, every other rank from exactly one other node's fresh facts - every one unchanged for at
  least ``frozen_s``, none inside a save or an eval, most of them in a collective. The ranks outside
  the largest group of call sites are the *odd* ones, named with their node: the rank that did not
  arrive.
- **Complete** (stacks, split - the epoch-end deadlock across nodes): every rank of the world frozen,
  some waiting in a collective *inside* a save or an eval, every other one inside a training step
  (its collective, forward, backward, the optimizer step). The ranks of the smaller side are the odd
  ones (the ranks in the odd phase), named with their node.
- **Complete** (steps, K2): every other rank is in ``train`` with a step, frozen since a known time,
  and its GPU in the spin band.
- **Node lost**: ranks of the world that no node reports freshly, a node of the job silent (its
  facts vanished - its target down - or stale) for at least ``node_lost_after_s``, and every rank the
  other nodes report frozen: the silent node is named (``lost``). The hang rule still needs every
  rank *here* frozen in a collective and this node's own second signal.
- **Veto**: only a positive sign of a healthy save or eval in progress on a fresh node - its ranks
  writing or reading, a rank inside a save or an eval *outside any collective* (doing the save's
  work), the node's own verdict ``checkpoint`` unless all it rests on is ranks waiting in a save's
  collective (no writes, no announced save, no rank doing the save's work). Ranks that merely wait
  in a save's collective are no veto: that is how the split deadlock looks from their node. A veto
  removes the hung class (the verdict is alert-worthy at most), like a save seen on this node.
- **Unknown**: no answer from Prometheus, an answer older than ``stale_after_s``, a rank of the world
  that no node reports freshly (a node silent for less than ``node_lost_after_s``, or none silent), a
  rank that two nodes claim. Then nothing is completed and nothing vetoed: the verdict is this
  node's own judgment (as without ``[cluster]``), and the evidence says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpu_triage.signals.fleet.facts import SAVE_OR_EVAL, NodeJobFacts
from gpu_triage.signals.fleet.remote import JobSummary, RemoteFacts
from gpu_triage.signals.stacks.dumps import STEP_PHASES, group_key
from gpu_triage.signals.stacks.stack_facts import StackFacts

MAX_NAMED = 16
STEP = frozenset(str(p) for p in STEP_PHASES)

NodeRank = tuple[str, int]


class FleetState(StrEnum):
    UNKNOWN = "unknown"
    """Remote facts missing, stale or unanswered: per-node judgment."""
    INCOMPLETE = "incomplete"
    """Fresh facts for every rank, but they do not complete the proof (a rank still moves)."""
    COMPLETE = "complete"
    VETO = "veto"
    NODE_LOST = "node_lost"
    """A node of the job silent past ``node_lost_after_s``, every rank the others report frozen."""


@dataclass(frozen=True, slots=True)
class FusionConfig:
    """Derived from the sections (``DetectorConfig.fusion()``), which hold the defaults."""

    stale_after_s: float
    """A node's facts (and Prometheus's answer) older than this are unknown ([cluster] stale_after_s)."""
    frozen_s: float
    """A stack unchanged this long is frozen ([stacks] frozen_s)."""
    fresh_s: float
    """A stack taken longer ago than this is no fact ([stacks] fresh_s)."""
    min_samples: int
    """This node's stacks must span this many dumps to count as frozen ([stacks] min_samples)."""
    node_lost_after_s: float
    """A node of the job silent this long (since its last facts) is lost ([cluster] node_lost_after_s)."""


@dataclass(frozen=True, slots=True)
class FleetEvidence:
    state: FleetState
    reason: str
    nodes: tuple[str, ...] = ()
    """The other nodes whose fresh facts were used."""
    stale_nodes: tuple[str, ...] = ()
    """Nodes of the job whose facts are stale or vanished (silent)."""
    veto: str | None = None
    stacks_complete: bool = False
    odd: tuple[NodeRank, ...] = ()
    """(node, rank) of the ranks outside the world's largest group of call sites (frozen), or of the
    smaller side of a split."""
    groups: tuple[tuple[str, tuple[NodeRank, ...]], ...] = ()
    frozen_since: float | None = None
    """The latest time any rank of the world froze (stacks)."""
    remote_frozen_since: float | None = None
    """K2: the latest last-progress time of the other nodes' train ranks (None: not all frozen-able)."""
    remote_spin_since: float | None = None
    """K2: since when every other node's rank's GPU has spun (None: not all spinning)."""
    age_s: float | None = None
    split: bool = False
    """The complete world is split: ``split_ranks`` wait in a save's or an eval's collective, every
    other rank (``step_ranks``) is frozen inside a training step."""
    split_ranks: tuple[NodeRank, ...] = ()
    step_ranks: tuple[NodeRank, ...] = ()
    lost: tuple[tuple[str, float], ...] = ()
    """(node, its last facts time) of the nodes lost (state ``node_lost``)."""
    source: str = "facts"
    """``facts``: every node's raw facts; ``rules``: the job's aggregates from the recording rules."""
    node_count: int | None = None
    """How many nodes report on the job (the aggregates name none)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def odd_ranks(self) -> tuple[int, ...]:
        return tuple(r for _, r in self.odd)

    def named_odd(self) -> str:
        return ", ".join(f"{node} rank {rank}" for node, rank in self.odd[:MAX_NAMED])

    def lost_since(self) -> float | None:
        """When the first lost node went silent (its last facts)."""
        return min((t for _, t in self.lost), default=None)

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
        if self.split:
            doc["split"] = {
                "phase_ranks": [{"node": n, "rank": r} for n, r in self.split_ranks[:MAX_NAMED]],
                "step_ranks": [{"node": n, "rank": r} for n, r in self.step_ranks[:MAX_NAMED]],
            }
        if self.source != "facts":
            doc["source"] = self.source
        if self.lost:
            doc["lost"] = [{"node": n, "last_facts": t} for n, t in self.lost[:MAX_NAMED]]
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
    if remote.summary is not None:
        return _fuse_summary(now, own_node, world_size, local_ranks, local_stacks, remote.summary, cfg, age)
    fresh = [n for n in remote.nodes if now - n.time <= cfg.stale_after_s]
    names = tuple(n.node for n in fresh)
    silent = {n.node: n.time for n in remote.nodes if now - n.time > cfg.stale_after_s}
    for node, t in remote.last_seen:
        if node != own_node and node not in names and now - t > cfg.stale_after_s:
            silent[node] = max(t, silent.get(node, t))
    stale = tuple(sorted(silent))
    common: dict[str, Any] = {"nodes": names, "stale_nodes": stale, "age_s": age}
    # a veto from any fresh node's positive sign of a healthy save or eval, whatever the rest says
    vetoes = [v for n in fresh for v in _vetoes(now, n, cfg)]
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
        return _silent(now, missing, silent, fresh, cfg, common)
    stacks = _stacks(now, own_node, world_size, local_ranks, local_stacks, fresh, cfg)
    k2 = _steps(fresh)
    state, reason = _world_state(stacks, k2, "")
    return FleetEvidence(
        state,
        reason,
        stacks_complete=bool(stacks.get("complete")),
        odd=stacks.get("odd", ()),
        groups=stacks.get("groups", ()),
        frozen_since=stacks.get("frozen_since"),
        remote_frozen_since=k2[0],
        remote_spin_since=k2[1],
        split=bool(stacks.get("split")),
        split_ranks=stacks.get("split_ranks", ()),
        step_ranks=stacks.get("step_ranks", ()),
        **common,
    )


def _vetoes(now: float, n: NodeJobFacts, cfg: FusionConfig) -> list[str]:
    """A fresh node's positive signs of a healthy save or eval in progress (never a rank that merely
    waits inside a save's collective)."""
    out = []
    if n.writing:
        out.append(f"{n.node}: its ranks are writing")
    if n.reading:
        out.append(f"{n.node}: its ranks are reading")
    for r in n.ranks:
        if r.in_phase_io() and _stack_fresh(now, r.stack_sampled_at, cfg):
            what = "a checkpoint save" if r.stack_phase == "checkpoint" else "an eval"
            out.append(f"{n.node} rank {r.rank}'s stack is inside {what}, outside any collective")
    if n.verdict == "checkpoint" and not _only_waits_in_save(now, n, cfg):
        out.append(f"{n.node}: its verdict is checkpoint")
    return out


def _only_waits_in_save(now: float, n: NodeJobFacts, cfg: FusionConfig) -> bool:
    """The node's ``checkpoint`` verdict rests on nothing but ranks waiting in a save's (or an eval's)
    collective: no writes, no announced save or eval (a lease), no rank doing the save's work."""
    waiting = [
        r for r in n.ranks if r.stack_phase in SAVE_OR_EVAL and _stack_fresh(now, r.stack_sampled_at, cfg)
    ]
    return (
        bool(waiting)
        and all(r.stack_collective for r in waiting)
        and not n.writing
        and not any(r.phase in SAVE_OR_EVAL for r in n.ranks)
    )


def _silent(
    now: float,
    missing: Sequence[int],
    silent: dict[str, float],
    fresh: Sequence[NodeJobFacts],
    cfg: FusionConfig,
    common: dict[str, Any],
) -> FleetEvidence:
    """Ranks of the world that no node reports freshly: a node lost, or unknown."""
    base = f"no fresh facts for rank(s) {_ranks_text(missing)}"
    if not silent:
        return _unknown(base, **common)
    where = f"{base}; stale: {', '.join(sorted(silent)[:MAX_NAMED])}"
    lost = tuple(sorted((n, t) for n, t in silent.items() if now - t >= cfg.node_lost_after_s))
    if not lost:
        quiet = min(now - t for t in silent.values())
        return _unknown(
            f"{where} (silent for {quiet:.0f} s; lost after {cfg.node_lost_after_s:.0f} s)", **common
        )
    for n in fresh:  # the job moves elsewhere: a node whose daemon alone stopped
        for r in n.ranks:
            if not _stack_fresh(now, r.stack_sampled_at, cfg) or r.stack_phase is None:
                return FleetEvidence(
                    FleetState.INCOMPLETE, f"{where}; {n.node} rank {r.rank}: no fresh stack", **common
                )
            if r.stack_frozen_s() < cfg.frozen_s:
                moved = f"{n.node} rank {r.rank}'s stack changed {r.stack_frozen_s():.0f} s ago"
                return FleetEvidence(FleetState.INCOMPLETE, f"{where}; {moved}", **common)
    names = ", ".join(n for n, _ in lost[:MAX_NAMED])
    quiet = max(now - t for _, t in lost)
    reason = f"node {names} lost: no facts for {quiet:.0f} s (ranks {_ranks_text(missing)} unreported)"
    if fresh:
        reason += "; every rank the other nodes report is frozen"
    return FleetEvidence(FleetState.NODE_LOST, reason, lost=lost, **common)


def _stack_fresh(now: float, sampled_at: float | None, cfg: FusionConfig) -> bool:
    return sampled_at is not None and now - sampled_at <= cfg.fresh_s


@dataclass(frozen=True, slots=True)
class _At:
    """One rank of the world, frozen: where its stack waits."""

    node: str
    rank: int
    key: str
    phase: str
    collective: bool
    since: float | None


def _local_frozen(sf: StackFacts | None, local_ranks: Sequence[int], cfg: FusionConfig) -> str | None:
    """Why this node's own ranks do not let the world complete (None: every one sampled and frozen)."""
    if sf is None:
        return "no stacks sampled on this node"
    if sf.unsampled or set(sf.pattern.sampled) != set(local_ranks):
        return "this node's ranks' stacks are not all sampled"
    for rank in local_ranks:
        s = sf.summary.ranks[rank]
        if s.samples < cfg.min_samples or s.frozen_s() < cfg.frozen_s:
            return "this node's ranks' stacks are not all frozen"
    return None


def _fuse_summary(
    now: float,
    own_node: str,
    world_size: int | None,
    local_ranks: Sequence[int],
    sf: StackFacts | None,
    sm: JobSummary,
    cfg: FusionConfig,
    age: float,
) -> FleetEvidence:
    """The same rule over the recording rules' aggregates (this node's ranks included in them)."""
    silent = {n: t for n, t in sm.silent if n != own_node}
    common: dict[str, Any] = {
        "stale_nodes": tuple(sorted(silent)),
        "age_s": age,
        "source": "rules",
        "node_count": sm.nodes,
    }
    vetoes = [f"{n}: its ranks are writing" for n in sm.writing if n != own_node]
    vetoes += [f"{n}: its ranks are reading" for n in sm.reading if n != own_node]
    vetoes += [
        f"{n} rank {r}'s stack is inside {'a checkpoint save' if p == 'checkpoint' else 'an eval'}, "
        "outside any collective"
        for n, r, p in sm.save_work
        if n != own_node
    ]
    announced = {n for n, _, _ in sm.announced}
    waits_in_save = any(g.phase in SAVE_OR_EVAL and g.collective for g in sm.groups)
    vetoes += [
        f"{n}: its verdict is checkpoint"
        for n in sm.checkpoint_nodes
        if n != own_node and (n in announced or not waits_in_save)
    ]
    if vetoes:
        return FleetEvidence(FleetState.VETO, "; ".join(vetoes[:4]), veto="; ".join(vetoes[:4]), **common)
    world = world_size if world_size is not None else sm.world_size
    if world is None:
        return _unknown("the job's world size is unknown", **common)
    if sm.rank_reports > sm.ranks_reported:
        return _unknown(f"{sm.rank_reports - sm.ranks_reported} rank(s) reported by two nodes", **common)
    missing = world - sm.ranks_reported
    frozen = _groups_frozen(now, sm, cfg)
    if missing > 0:
        base = f"no fresh facts for {missing} of {world} ranks"
        if not silent:
            return _unknown(base, **common)
        where = f"{base}; stale: {', '.join(sorted(silent)[:MAX_NAMED])}"
        lost = tuple(sorted((n, t) for n, t in silent.items() if now - t >= cfg.node_lost_after_s))
        if not lost:
            quiet = min(now - t for t in silent.values())
            return _unknown(
                f"{where} (silent for {quiet:.0f} s; lost after {cfg.node_lost_after_s:.0f} s)", **common
            )
        if frozen is not None:
            return FleetEvidence(FleetState.INCOMPLETE, f"{where}; {frozen}", **common)
        names = ", ".join(n for n, _ in lost[:MAX_NAMED])
        quiet = max(now - t for _, t in lost)
        reason = f"node {names} lost: no facts for {quiet:.0f} s ({missing} ranks unreported)"
        return FleetEvidence(
            FleetState.NODE_LOST, reason + "; every rank reported is frozen", lost=lost, **common
        )
    if silent:  # a wedged daemon: its ranks counted, its facts old
        return _unknown(f"facts of {', '.join(sorted(silent)[:MAX_NAMED])} are stale", **common)
    k2: tuple[float | None, float | None] = (None, None)
    if sm.train_ranks == sm.spinning_ranks == world and sm.active_since_max is not None:
        k2 = (sm.active_since_max, sm.spin_since_max)
    why = _local_frozen(sf, local_ranks, cfg) or frozen
    stacked = sum(g.count for g in sm.groups)
    if why is None and stacked != world:
        why = f"{stacked} of {world} ranks have a fresh stack"
    stacks: dict[str, Any] = {"reason": why}
    if why is None:
        since = [g.since_max for g in sm.groups if g.since_max is not None]
        done = {"complete": True, "odd": sm.odd, "frozen_since": max(since) if since else None}
        if not any(g.phase in SAVE_OR_EVAL for g in sm.groups):
            collective = sum(g.count for g in sm.groups if g.phase == "collective")
            if collective * 2 >= world:
                stacks = done
            else:
                stacks = {"reason": f"only {collective} of {world} ranks wait in a collective"}
        elif all((g.phase in SAVE_OR_EVAL and g.collective) or g.phase in STEP for g in sm.groups) and any(
            g.phase in STEP for g in sm.groups
        ):
            stacks = {**done, "split": True}
        else:
            stacks = {
                "reason": "ranks inside a save or an eval, but not the others all frozen in a training step"
            }
    state, reason = _world_state(stacks, k2, f" (recording rules, {sm.nodes} nodes)")
    return FleetEvidence(
        state,
        reason,
        stacks_complete=bool(stacks.get("complete")),
        odd=stacks.get("odd", ()),
        frozen_since=stacks.get("frozen_since"),
        remote_frozen_since=k2[0],
        remote_spin_since=k2[1],
        split=bool(stacks.get("split")),
        **common,
    )


def _groups_frozen(now: float, sm: JobSummary, cfg: FusionConfig) -> str | None:
    """Why the reported ranks' stacks are not all fresh and frozen (None: they are)."""
    for g in sm.groups:
        if g.sampled_min is None or now - g.sampled_min > cfg.fresh_s:
            return f"{g.count} rank(s) at {g.where}: no fresh stack"
        if g.frozen_min_s < cfg.frozen_s:
            return f"a rank at {g.where}: its stack changed {g.frozen_min_s:.0f} s ago"
    return None


def _stacks(
    now: float,
    own_node: str,
    world_size: int,
    local_ranks: Sequence[int],
    sf: StackFacts | None,
    fresh: Sequence[NodeJobFacts],
    cfg: FusionConfig,
) -> dict[str, Any]:
    why = _local_frozen(sf, local_ranks, cfg)
    if why is not None or sf is None:
        return {"reason": why}
    world: list[_At] = []
    for rank in local_ranks:
        s = sf.summary.ranks[rank]
        info = s.info
        world.append(
            _At(own_node, rank, group_key(info), str(info.phase), info.collective is not None, s.same_since)
        )
    for n in fresh:
        for r in n.ranks:
            if not _stack_fresh(now, r.stack_sampled_at, cfg) or r.stack_phase is None:
                return {"reason": f"{n.node} rank {r.rank}: no fresh stack"}
            if r.stack_frozen_s() < cfg.frozen_s:
                return {"reason": f"{n.node} rank {r.rank}'s stack changed {r.stack_frozen_s():.0f} s ago"}
            key = r.stack_where or r.stack_phase
            world.append(
                _At(n.node, r.rank, key, r.stack_phase, bool(r.stack_collective), r.stack_same_since)
            )
    members: dict[str, list[NodeRank]] = {}
    for a in world:
        members.setdefault(a.key, []).append((a.node, a.rank))
    groups = tuple(
        (k, tuple(sorted(v, key=lambda nr: nr[1])))
        for k, v in sorted(members.items(), key=lambda kv: (-len(kv[1]), min(r for _, r in kv[1])))
    )
    since = [a.since for a in world if a.since is not None]
    done = {"complete": True, "groups": groups, "frozen_since": max(since) if since else None}
    if not any(a.phase in SAVE_OR_EVAL for a in world):
        collective = sum(a.phase == "collective" for a in world)
        if collective * 2 < world_size:
            return {"reason": f"only {collective} of {world_size} ranks wait in a collective"}
        odd: tuple[NodeRank, ...] = ()
        if len(groups) > 1 and len(groups[0][1]) > len(groups[1][1]):
            odd = tuple(sorted((m for _, ms in groups[1:] for m in ms), key=lambda nr: nr[1]))
        return {**done, "odd": odd}
    phase = tuple(
        sorted(
            ((a.node, a.rank) for a in world if a.phase in SAVE_OR_EVAL and a.collective),
            key=lambda nr: nr[1],
        )
    )
    step = tuple(sorted(((a.node, a.rank) for a in world if a.phase in STEP), key=lambda nr: nr[1]))
    if not phase or not step or len(phase) + len(step) != len(world):
        return {"reason": "ranks inside a save or an eval, but not the others all frozen in a training step"}
    odd = step if len(step) < len(phase) else phase
    return {**done, "odd": odd, "split": True, "split_ranks": phase, "step_ranks": step}


def _world_state(
    stacks: Mapping[str, Any], k2: tuple[float | None, float | None], source: str
) -> tuple[FleetState, str]:
    """Whether the whole world's facts complete a hang rule (the stacks' K6, or K2's frozen steps), and
    why: the same words from the raw facts and from the recording rules' aggregates (``source``)."""
    state = FleetState.COMPLETE if stacks.get("complete") or k2[0] is not None else FleetState.INCOMPLETE
    if state is not FleetState.COMPLETE:
        return state, str(stacks.get("reason") or "")
    how = "steps frozen, GPUs spinning"
    if stacks.get("split"):
        how = "split between a save's or an eval's collective and a training step"
    elif stacks.get("complete"):
        how = "frozen in collectives"
    return state, f"every rank of the world reported{source}: {how}"


def _steps(fresh: Sequence[NodeJobFacts]) -> tuple[float | None, float | None]:
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
