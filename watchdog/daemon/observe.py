"""One cycle's observation of the jobs on this node, as the detector reads it: the progress files,
the rank processes (checked against what the files claim), their fusion into JobViews, then what
each registered signal contributes (stacks, NCCL RAS, the other nodes' facts, ...; see
:mod:`gpu_triage.signals.signal`) and the ranks the kill ladder signalled; and this node's facts
about each judged job, exported for the other nodes.

:class:`Observer` owns what it reads with (progress reader, process inspector, the signals) and what
it saw last (the process view, untrusted files, progress-file errors, this node's fleet facts);
the daemon asks it, never reaches into it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

from gpu_triage.classify.tracker import GpuTracker
from gpu_triage.daemon.config import Config
from gpu_triage.model.names import printable
from gpu_triage.model.samples import GpuSample, TelemetrySource
from gpu_triage.model.snapshot import GpuStatus, JobStatus
from gpu_triage.model.states import ENDED_VERDICTS, Verdict
from gpu_triage.signals.fleet.facts import NodeJobFacts, local_facts, spin_since_by_gpu
from gpu_triage.signals.pods import PodResolver
from gpu_triage.signals.processes import ProcessInspector, ProcessView, SessionScope
from gpu_triage.signals.progress import ProgressReader, ProgressView
from gpu_triage.signals.ranks import ProgressClaim, RankProcess
from gpu_triage.signals.registry import signal_kinds
from gpu_triage.signals.signal import NODE_FIELDS, Contribution, JobSight, Signal, SignalEnv, SignalKind
from gpu_triage.verdicts.fusion import job_views
from gpu_triage.verdicts.settings import DetectorConfig
from gpu_triage.verdicts.views import GpuView, JobView

log = logging.getLogger("gpu_watchdog")

_CALM = frozenset({Verdict.HEALTHY, Verdict.CHECKPOINT, *ENDED_VERDICTS})
"""Verdicts that need no urgent look (an ended job is not sampled in a hurry)."""

CONTRIBUTE_DEADLINE_S = 0.5
"""A signal's :meth:`~gpu_triage.signals.signal.Signal.contribute` longer than this is logged: it
must start slow work off the cycle thread, never wait for it."""

Signalled = Callable[[str, float], frozenset[int]]


def make_reader(config: Config) -> ProgressReader:
    """The progress-file reader of ``[progress]``."""
    import socket

    p = config.progress
    return ProgressReader(p.dir, stale_after_s=p.stale_after_s, host=socket.gethostname())


class SignalSet:
    """The registered signals (:mod:`gpu_triage.signals.registry`), built once from the config: run
    in order each process period, reported, rebuilt when their section changes, closed."""

    def __init__(self, config: Config, env: SignalEnv, kinds: Iterable[SignalKind] | None = None) -> None:
        self.env = env
        self.kinds = tuple(signal_kinds() if kinds is None else kinds)
        self.signals: dict[str, Signal] = {
            k.name: k.build(getattr(config, k.section), env) for k in self.kinds
        }
        self.errors: dict[str, str] = {}
        """Signals whose last contribute raised (name -> error): input_errors ``signal``."""
        self.node_errors: dict[str, str] = {}
        """Signals whose last ``node_facts`` raised or set a field it may not (name -> error)."""
        self.slow: dict[str, float] = {}
        """Signals whose last contribute took longer than CONTRIBUTE_DEADLINE_S (name -> seconds)."""
        self._node_level = self._with_node_facts()

    def _with_node_facts(self) -> frozenset[str]:
        """The signals that have ``node_facts`` (asked every cycle: the others are not looked at)."""
        return frozenset(n for n, s in self.signals.items() if getattr(s, "node_facts", None) is not None)

    def __getitem__(self, name: str) -> Signal:
        return self.signals[name]

    def contribute(self, now: float, sights: Sequence[JobSight]) -> dict[str, dict[str, object]]:
        """Every signal's facts about each job (job -> JobView field -> value); a signal that raises
        contributes nothing this cycle and is reported, never blinding the others."""
        facts: dict[str, dict[str, object]] = {s.job: {} for s in sights}
        errors: dict[str, str] = {}
        for kind in self.kinds:
            seen = [replace(s, facts=dict(facts[s.job])) for s in sights] if kind.reads else list(sights)
            t0 = time.perf_counter()
            try:
                got: Mapping[str, Contribution] = self.signals[kind.name].contribute(now, seen)
            except Exception as e:
                errors[kind.name] = f"{type(e).__name__}: {e}"[:300]
                if self.errors.get(kind.name) != errors[kind.name]:
                    log.error("signal %s failed; its facts are missing this cycle", kind.name, exc_info=e)
                continue
            finally:
                took = time.perf_counter() - t0
                if took > CONTRIBUTE_DEADLINE_S:
                    if kind.name not in self.slow:
                        log.warning(
                            "signal %s took %.3f s in the cycle (deadline %.1f s)",
                            kind.name,
                            took,
                            CONTRIBUTE_DEADLINE_S,
                        )
                    self.slow[kind.name] = took
                else:
                    self.slow.pop(kind.name, None)
            keys = {key for c in got.values() for key in c}
            if not keys <= SIGNAL_FIELDS:  # a bug in that signal: its facts are dropped, never half-applied
                wrong = sorted(keys - SIGNAL_FIELDS)
                errors[kind.name] = f"contributed {wrong}: not facts a signal may set on a job"
                if self.errors.get(kind.name) != errors[kind.name]:
                    log.error("signal %s %s", kind.name, errors[kind.name])
                continue
            for job, contribution in got.items():
                if job in facts:
                    facts[job].update(contribution)
        self.errors = errors
        return facts

    def start(self) -> None:
        """The daemon starts: each signal with a ``start`` opens what it holds open while serving."""
        for kind in self.kinds:
            start = getattr(self.signals[kind.name], "start", None)
            if start is not None:
                start()

    def node_facts(self, now: float) -> dict[str, object]:
        """Every cycle: the node-level facts of the signals that have ``node_facts`` (Snapshot field ->
        value, only :data:`~gpu_triage.signals.signal.NODE_FIELDS`); one that raises is reported and
        contributes nothing, as in :meth:`contribute`."""
        out: dict[str, object] = {}
        errors: dict[str, str] = {}
        for kind in self.kinds:
            if kind.name not in self._node_level:
                continue
            node_facts = getattr(self.signals[kind.name], "node_facts", None)
            if node_facts is None:
                continue
            try:
                got = dict(node_facts(now))
            except Exception as e:
                errors[kind.name] = f"{type(e).__name__}: {e}"[:300]
                if self.node_errors.get(kind.name) != errors[kind.name]:
                    log.error(
                        "signal %s failed; its node facts are missing this cycle", kind.name, exc_info=e
                    )
                continue
            wrong = sorted(set(got) - NODE_FIELDS)
            if wrong:
                errors[kind.name] = f"node facts {wrong}: not fields a signal may set"
                continue
            out.update(got)
        self.node_errors = errors
        return out

    def status(self) -> dict[str, Any]:
        """Each signal's status at its ``status_path`` (``{"stacks": {..., "nccl_ras": {...}}, ...}``)."""
        tree: dict[str, Any] = {}
        for kind in self.kinds:
            node = tree
            for key in kind.status_path[:-1]:
                node = node.setdefault(key, {})
            leaf = node.setdefault(kind.status_path[-1], {})
            leaf.update(self.signals[kind.name].status())
        return tree

    def reload(self, old: Config, new: Config) -> None:
        """A signal whose section changed reloads (the signal decides: adjusted, or a fresh one)."""
        for kind in self.kinds:
            settings = getattr(new, kind.section)
            if settings != getattr(old, kind.section):
                self.signals[kind.name] = self.signals[kind.name].reload(settings, self.env)
        self._node_level = self._with_node_facts()

    def close(self) -> None:
        for kind in self.kinds:
            try:
                self.signals[kind.name].close()
            except Exception:
                log.exception("closing signal %s", kind.name)


def process_scope(source: TelemetrySource) -> SessionScope | None:
    """The processes the daemon may judge: every process of the node (None), except on a simulated
    source, whose GPUs host only its simulated job - the session its ``job_session`` names, checked
    now by the kernel (no job attached: no process at all). Raises ValueError when that pid leads no
    session."""
    if source.name != "sim":
        return None
    session = getattr(source, "job_session", None)
    return SessionScope.nothing() if session is None else SessionScope.of_leader(int(session))


class Observer:
    """Reads the jobs each process period; keeps what it saw last for the snapshot."""

    def __init__(
        self, config: Config, gpus: GpuTracker, env: SignalEnv, scope: SessionScope | None = None
    ) -> None:
        """``scope``: judge only the processes it holds (a simulated source's job: :func:`process_scope`);
        None: every process of the node."""
        self.progress = make_reader(config)
        self.inspector = ProcessInspector(scope=scope)
        self.pods = PodResolver()
        """The Kubernetes pod of each rank (gpu_triage.signals.pods); none outside one."""
        self.signals = SignalSet(config, env)
        self.node = env.node
        self._gpus = gpus
        self.process_view: ProcessView | None = None
        self.untrusted: tuple[dict[str, Any], ...] = ()
        """Progress files and processes not believed (Snapshot.untrusted_progress_files)."""
        self.progress_errors: tuple[dict[str, Any], ...] = ()
        """Progress files not read this cycle (input_errors ``progress_file``)."""
        self.fleet_facts: tuple[NodeJobFacts, ...] = ()
        """This node's facts about each judged job (Snapshot.fleet)."""

    @property
    def processes(self) -> Mapping[str, tuple[RankProcess, ...]]:
        """The rank processes of each job, as last inspected."""
        return self.process_view.jobs if self.process_view is not None else {}

    def reload(self, old: Config, new: Config) -> None:
        self.signals.reload(old, new)
        if new.progress != old.progress:
            self.progress = make_reader(new)

    def close(self) -> None:
        self.signals.close()
        self.inspector.close()

    def observe(
        self,
        now: float,
        samples: Sequence[GpuSample],
        statuses: Sequence[GpuStatus],
        *,
        wall: float | None,
        verdicts: Mapping[str, Verdict],
        signalled: Signalled | None,
    ) -> tuple[list[GpuView], list[JobView]]:
        """What the detector reads this cycle: a view of each GPU and of each job. ``verdicts``: each
        job's last verdict; ``signalled``: the pids of a job the kill ladder signalled, if armed."""
        view = self.progress.read(now, wall_s=wall)
        self.progress_errors = tuple(
            {"kind": "progress_file", "where": printable(str(e.path)), "error": printable(e.error)}
            for e in view.errors
        )
        gpu_pids = {s.gpu: list(s.pids) for s in samples if s.pids}
        uuid_to_index = {g.uuid: g.gpu for g in statuses if g.uuid}
        pview = self.inspector.inspect(
            now,
            gpu_pids=gpu_pids,
            claims=progress_claims(view, self.progress.host),
            uuid_to_index=uuid_to_index,
        )
        self.process_view = pview
        self.progress.priority = frozenset(
            name.split("@", 1)[0]
            for name, ranks in pview.jobs.items()
            if any(r.alive and r.proof for r in ranks)
        )
        untrusted_files = [u.to_dict() for u in view.untrusted]
        progress_jobs = view.jobs
        if self.inspector.scope is not None:  # a simulation judges its own job only, not any file's job
            progress_jobs = {name: jp for name, jp in view.jobs.items() if name in pview.jobs}
        jobs = job_views(
            progress_jobs, pview.jobs, untrusted=pview.untrusted, untrusted_files=untrusted_files
        )
        self.untrusted = tuple([*untrusted_files, *(u.to_dict() for u in pview.untrusted)])
        jobs = self._with_signals(now, jobs, verdicts, signalled)
        gviews = [
            GpuView(
                g.gpu,
                g.state,
                g.state_since,
                self._gpus.nvlink_bytes(g.gpu),
                util_known=g.utilization_ratio is not None or g.power_w is None,
            )
            for g in statuses
        ]
        return gviews, jobs

    def _with_signals(
        self,
        now: float,
        jobs: list[JobView],
        verdicts: Mapping[str, Verdict],
        signalled: Signalled | None = None,
    ) -> list[JobView]:
        """Each job with what the signals contribute and, when armed (``signalled``), the ranks the
        kill ladder signalled (they read ``killed``, never a new stall); a job they change nothing
        of is kept as it is (no copy every process period)."""
        procs = self.processes
        sights = []
        for j in jobs:
            sizes = {p.world_size for p in procs.get(j.job, ()) if p.world_size is not None}
            prev = verdicts.get(j.job)
            sights.append(
                JobSight(
                    job=j.job,
                    pids={r.rank: r.pid for r in j.ranks if r.proven and r.alive and r.pid is not None},
                    ranks_here=len({r.rank for r in j.ranks}),
                    world_size=j.world_size,
                    process_world_size=(
                        j.world_size
                        if j.world_size is not None
                        else (sizes.pop() if len(sizes) == 1 else None)
                    ),
                    has_progress=j.has_progress,
                    suspect=prev is not None and prev not in _CALM,
                    gpus=frozenset({r.gpu for r in j.ranks if r.gpu is not None}),
                )
            )
        facts = self.signals.contribute(now, sights)
        out = []
        for j in jobs:
            changes = _changed(j, facts.get(j.job, {}))
            if signalled is not None:
                pids = signalled(j.job, now)
                if pids != j.signalled_pids:
                    changes["signalled_pids"] = pids
            out.append(replace(j, **changes) if changes else j)
        return out

    def export_facts(
        self,
        now: float,
        jobs: list[JobView],
        results: tuple[JobStatus, ...],
        statuses: Sequence[GpuStatus],
        config: DetectorConfig,
    ) -> tuple[NodeJobFacts, ...]:
        """This node's facts about each job, exported for the other nodes (gpu_watchdog_fleet_*)."""
        self.fleet_facts = node_facts(now, self.node, jobs, results, statuses, config)
        return self.fleet_facts


SIGNAL_FIELDS = frozenset(f.name for f in fields(JobView)) - {
    "job",
    "ranks",
    "has_progress",
    "signalled_pids",
}
"""What a signal may contribute to a job: any JobView field but the job's identity, its ranks and
the kill ladder's record."""


def _changed(view: JobView, facts: Mapping[str, object]) -> dict[str, Any]:
    """The signals' facts (SignalSet.contribute kept only SIGNAL_FIELDS) that are not already
    ``view``'s (the same object: nothing to copy)."""
    return {name: value for name, value in facts.items() if getattr(view, name) is not value}


def progress_claims(view: ProgressView, host: str) -> list[ProgressClaim]:
    """What each believed progress file claims about its process (the inspector checks the claim)."""
    claims = []
    for job, jp in view.jobs.items():
        ranks = dict(jp.ranks)
        for rank, r in jp.stale.items():
            ranks.setdefault(rank, r)
        for rank, r in ranks.items():
            rec = r.record
            claims.append(
                ProgressClaim(
                    job, rank, rec.pid, rec.local_rank, host_is_local=rec.host == host, owner_uid=r.owner_uid
                )
            )
    return claims


def node_facts(
    now: float,
    node: str,
    jobs: list[JobView],
    results: tuple[JobStatus, ...],
    statuses: Sequence[GpuStatus],
    c: DetectorConfig,
) -> tuple[NodeJobFacts, ...]:
    """This node's facts about each judged job (gpu_watchdog_fleet_*)."""
    spin = spin_since_by_gpu(statuses)
    by_job = {j.job: j for j in results}
    out = []
    for view in jobs:
        st = by_job.get(view.job)
        if st is None:
            continue
        ev = st.evidence
        world = (
            view.world_size
            if view.world_size is not None
            else (view.stacks.world_size if view.stacks is not None else None)
        )
        out.append(
            local_facts(
                now,
                node,
                job=view.job,
                world_size=world,
                ranks=view.ranks,
                stacks=view.stacks,
                verdict=str(st.verdict),
                onset=st.onset,
                kill_worthy=st.kill_worthy,
                writing=ev is not None and ev.bytes_written_recently >= c.write_active_bytes,
                reading=ev is not None and ev.bytes_read_recently >= c.read_active_bytes,
                gpu_spin_since=spin,
                fresh_s=c.stacks.fresh_s,
            )
        )
    return tuple(out)
