"""Run a scripted situation through the daemon's real decision path on an explicit clock.

What is real: the power tables and :class:`~gpu_triage.classify.tracker.GpuTracker` (classifier with
hysteresis), progress files written by the trainer's own writer and read back by the daemon's
:class:`~gpu_triage.signals.progress.ProgressReader`, :func:`~gpu_triage.verdicts.fusion.job_views`, the
:class:`~gpu_triage.verdicts.detector.Detector`, and the :class:`~gpu_triage.actions.engine.ActionEngine` with
an event store, in ``kill`` mode with ``dry_run`` and the default delays - so "a SIGTERM plan" below
is the engine's own decision to signal, recorded before anything would be sent.

What is scripted: the GPUs' board power and utilisation (the hardware boundary), and the facts the
process inspector would report per rank (alive, status, bytes written and read, which GPU, what
ties it to the job). The inspector itself is exercised on real processes in
``tests/watchdog/test_attribution.py``.

Time runs in 1 s ticks (the daemon's default period); nothing sleeps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpu_triage.actions.config import ActionsConfig
from gpu_triage.actions.interface import Cycle
from gpu_triage.actions.silences import SilenceBook
from gpu_triage.alerts.model import condition_for
from gpu_triage.classify.tracker import GpuTracker
from gpu_triage.contract import ProgressWriter
from gpu_triage.journal.eventstore import EventStore
from gpu_triage.model.health import UNKNOWN_HEALTH, NodeHealth
from gpu_triage.model.samples import GpuSample
from gpu_triage.model.states import KILL_WORTHY_VERDICTS, Mode, Verdict
from gpu_triage.signals.fleet.remote import RemoteFacts
from gpu_triage.signals.progress import ProgressReader
from gpu_triage.signals.ranks import RankProcess
from gpu_triage.signals.stacks.dumps import Frame, RankStack, StackSummary, ThreadStack, classify
from gpu_triage.verdicts.detector import Detector
from gpu_triage.verdicts.fusion import job_views
from gpu_triage.verdicts.settings import DetectorConfig
from gpu_triage.verdicts.views import GpuView, JobView
from tests.watchdog.engines import build_engine

T0 = 1_780_000_000.0
HOST = "corpus-node"
REFERENCE_LIMIT_W = {"H100": 700.0, "H200": 700.0, "B300": 1100.0, "B200": 1000.0, "A100": 400.0}
NAMES = {"H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200", "B300": "NVIDIA B300 SXM6 AC"}

#: What a GPU does, as (power as a fraction of the model's reference limit, utilisation). Sources:
#: docs/triage.md (the public figures behind the tables): training ~0.77-0.81 at 85-97 %; waiting in a
#: collective 0.21-0.23 at 100 %; the checkpoint writer ~0.21 at 0-10 %; idle with memory held
#: 0.16-0.21; idle 0.10.
ACTIVITY: dict[str, tuple[float, float]] = {
    "compute": (0.79, 0.93),
    "comm": (0.35, 0.72),
    "spin": (0.22, 1.00),
    "writer": (0.21, 0.05),
    "idle_mem": (0.19, 0.00),
    "idle": (0.10, 0.00),
    "starve": (0.26, 0.45),
    "busy_loop": (0.55, 1.00),
    # a spin whose power sits on the communication band's edge (0.28-0.32 of the limit at 100 %)
    "spin_edge": (0.30, 1.00),
}


def _noise(*key: object) -> float:
    """Deterministic noise in [-1, 1) from a key (no generator state: a tick reads the same twice)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**63 - 1.0


@dataclass
class SimRank:
    """One rank: what its progress file says and what the process inspector would see."""

    job: str
    rank: int
    local_rank: int
    world_size: int
    gpu: int | None
    pid: int
    phase: str = "init"
    lease_s: float | None = 600.0
    interval_s: float | None = None
    """Seconds per optimizer step while in train; None: frozen."""
    step: int = 0
    wait_s: float = 1.0
    """Seconds at the end of each step this rank's GPU waits in the spin band (a straggler elsewhere)."""
    write_bps: float = 0.0
    read_bps: float = 0.0
    status: str = "sleeping"
    alive: bool = True
    progress: bool = True
    """Writes a progress file (False: a job with no integration)."""
    lease_scope: str | None = "job"
    proof: tuple[str, ...] = ("rank_env", "progress_file")
    next_step_at: float | None = None
    stack: tuple[tuple[str, str, int], ...] | None = None
    """The rank's Python stack as py-spy would dump it (innermost first; None: not sampled)."""
    cpu_ratio: float = 0.05
    """Host CPU share of one core (0.05: asleep in a collective or a sleep; 1.0: NCCL spinning)."""
    host_pids: bool = True
    """False: the rank runs in a container without host PIDs - NVML's process list does not name it,
    so nothing ties it to its GPU (the GPU still draws what the rank does)."""
    writer: ProgressWriter | None = None
    _written_phase: tuple[str, float | None] | None = None
    phase_started: float = 0.0


@dataclass
class World:
    """The scripted node at the current tick. Scripts mutate it; the harness reads it."""

    model: str = "H100"
    gpus: int = 8
    power_limit_w: float | None = None
    """Enforced limit; None: the model's reference limit."""
    util_readable: bool = True
    ranks: list[SimRank] = field(default_factory=list)
    gpu_activity: dict[int, str] = field(default_factory=dict)
    """Activity per GPU; ``train`` follows its rank's step cycle; ``lost`` is a failed read;
    ``flaky:<activity>`` fails one read in four."""
    t: float = 0.0
    """Seconds since the start of the case."""
    remote: Callable[[World, float], RemoteFacts | None] | None = None
    """The other nodes of a multi-node job as Prometheus would answer about them at ``now`` (their
    fleet facts, or a node gone silent); None: no ``[cluster]``."""
    health: NodeHealth = UNKNOWN_HEALTH
    """The node's hardware health as the health signal would report it (scripted, like the power)."""

    def job(self, name: str) -> list[SimRank]:
        return [r for r in self.ranks if r.job == name]

    def set(self, ranks: list[SimRank] | None = None, **values: object) -> None:
        for r in ranks if ranks is not None else self.ranks:
            for k, v in values.items():
                setattr(r, k, v)

    def set_gpus(self, activity: str, gpus: list[int] | None = None) -> None:
        for g in gpus if gpus is not None else range(self.gpus):
            self.gpu_activity[g] = activity


@dataclass(frozen=True)
class Expect:
    truth: str
    """'healthy' or 'hang'."""
    kill_worthy_within_s: float | None = None
    """A hang: a kill-worthy verdict at most this long after the onset."""
    alert_within_s: float | None = None
    """An alert (any alert-worthy verdict, after the engine's alert delay) at most this long after onset."""
    allowed: frozenset[Verdict] | None = None
    """Healthy: the only verdicts it may take (None: anything but the hung ones)."""
    limit: str = ""
    """For a hang this node cannot prove: why (printed in the scorecard)."""
    cause: str | None = None
    """A hang: the cause its first kill-worthy verdict must give (None: any)."""
    blame: str | None = None
    """A hang: the blame its first kill-worthy verdict must carry (``node`` after a hardware fault)."""
    ends_in: frozenset[Verdict] | None = None
    """The verdicts the case may end in (None: any): a hang alerted as ``slow`` or not judged at all
    is misnamed even when some alert fired."""


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    setup: Callable[[World], None]
    script: Callable[[World], None]
    duration_s: float
    expect: Expect
    onset_s: float | None = None
    """When the hang (or the situation) begins, seconds from the start."""
    describe: str = ""
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    telemetry: bool = True
    """False: ``--source none`` (no GPU telemetry at all)."""


@dataclass
class Result:
    case: Case
    timeline: list[tuple[float, Verdict]]
    """(seconds from start, verdict) at each change, for the case's first job."""
    first_kill_worthy_s: float | None
    first_alert_s: float | None
    first_kill_worthy_cause: str | None
    sigterm_plans: list[tuple[float, str, tuple[int, ...]]]
    """(time, job, pids) of every SIGTERM the engine decided on."""
    healthy_pids: frozenset[int]
    jobs_seen: dict[str, list[tuple[float, Verdict]]]

    @property
    def onset(self) -> float | None:
        return self.case.onset_s

    def after_onset(self, t: float | None) -> float | None:
        if t is None or self.case.onset_s is None:
            return None
        return t - self.case.onset_s

    @property
    def killed_healthy(self) -> bool:
        return self.case.expect.truth == "healthy" and bool(self.sigterm_plans)

    @property
    def kill_worthy_healthy(self) -> bool:
        return self.case.expect.truth == "healthy" and self.first_kill_worthy_s is not None

    def problems(self) -> list[str]:
        """What breaks the case's expectation (empty: it holds)."""
        e = self.case.expect
        out = []
        if e.truth == "healthy":
            if self.sigterm_plans:
                out.append(f"healthy job in a SIGTERM plan at {self.sigterm_plans[0][0]:.0f} s")
            if self.first_kill_worthy_s is not None:
                out.append(f"healthy job called hung at {self.first_kill_worthy_s:.0f} s")
            if e.allowed is not None:
                bad = sorted({str(v) for _, v in self.timeline} - {str(v) for v in e.allowed})
                if bad:
                    out.append(f"verdicts {bad} outside {sorted(str(v) for v in e.allowed)}")
        else:
            k = self.after_onset(self.first_kill_worthy_s)
            a = self.after_onset(self.first_alert_s)
            if e.kill_worthy_within_s is not None and (k is None or k > e.kill_worthy_within_s):
                got = "never" if k is None else f"{k:.0f} s"
                out.append(f"kill-worthy {got} after onset, wanted <= {e.kill_worthy_within_s:.0f} s")
            if e.cause is not None and k is not None and self.first_kill_worthy_cause != e.cause:
                out.append(f"kill-worthy with cause {self.first_kill_worthy_cause!r}, wanted {e.cause!r}")
            if e.kill_worthy_within_s is None and k is not None:
                out.append(f"kill-worthy {k:.0f} s after onset where only an alert was expected")
            if e.blame is not None and k is not None and self.blame_at_kill_worthy != e.blame:
                out.append(f"blamed {self.blame_at_kill_worthy}, wanted {e.blame}")
            if e.alert_within_s is not None and (a is None or a > e.alert_within_s):
                got = "never" if a is None else f"{a:.0f} s"
                out.append(f"alerted {got} after onset, wanted <= {e.alert_within_s:.0f} s")
        if e.ends_in is not None and self.timeline and self.timeline[-1][1] not in e.ends_in:
            wanted = sorted(str(v) for v in e.ends_in)
            out.append(f"ends in {self.timeline[-1][1]}, wanted one of {wanted}")
        bystanders = {p for _, _, pids in self.sigterm_plans for p in pids} - self.job_pids
        if bystanders:
            out.append(f"bystander pids {sorted(bystanders)} in a SIGTERM plan")
        return out

    job_pids: frozenset[int] = frozenset()
    blame_at_kill_worthy: str | None = None
    """The main job's blame at its first kill-worthy verdict."""


def _gpu_sample(world: World, g: int, now: float, tick: int) -> GpuSample:
    ref = REFERENCE_LIMIT_W[world.model]
    cap = world.power_limit_w or ref
    activity = world.gpu_activity.get(g, "idle")
    if activity.startswith("flaky:"):
        activity = activity.split(":", 1)[1]
        if tick % 4 == g % 4:
            activity = "lost"
    if activity == "train":
        activity = _train_activity(world, g, now)
    name = NAMES.get(world.model, f"NVIDIA {world.model}")
    uuid = f"GPU-corpus-{g:02d}"
    if activity == "lost":
        return GpuSample(g, now, uuid=uuid, name=name, power_limit_w=cap, error="timeout")
    frac, util = ACTIVITY[activity]
    power = frac * ref
    if activity in ("compute", "comm", "busy_loop"):  # work scales with the cap; waiting does not
        power = min(power, 0.97 * cap) if activity == "compute" else min(power, 0.6 * cap)
    power *= 1.0 + 0.03 * _noise("p", g, tick)
    util = min(1.0, max(0.0, util + (0.0 if util >= 1.0 else 0.04 * _noise("u", g, tick))))
    return GpuSample(
        gpu=g,
        time_s=now,
        power_w=power,
        utilization_ratio=util if world.util_readable else None,
        memory_used_bytes=60e9 if activity != "idle" else 0.5e9,
        power_limit_w=cap,
        uuid=uuid,
        name=name,
    )


def _train_activity(world: World, g: int, now: float) -> str:
    """A step of training on one GPU: compute, then a communication dip, then a short wait for the
    slowest rank (every step has a second or so in the spin band)."""
    rank = next((r for r in world.ranks if r.gpu == g), None)
    if rank is None or rank.interval_s is None or rank.next_step_at is None:
        return "compute"
    left = rank.next_step_at - now
    if left <= rank.wait_s:
        return "spin"
    if left <= rank.wait_s + 1.0:
        return "comm"
    return "compute"


def _process(r: SimRank, gpu_pids_visible: bool) -> RankProcess:
    return RankProcess(
        job=r.job,
        pid=r.pid,
        rank=r.rank,
        local_rank=r.local_rank,
        world_size=r.world_size,
        gpu=r.gpu if r.host_pids else None,
        gpus=(r.gpu,) if r.gpu is not None and gpu_pids_visible and r.host_pids else (),
        found_by="progress" if r.progress else "nvml",
        alive=r.alive,
        status=r.status if r.alive else None,
        pgid=r.pid,
        cpu_time_s=10.0,
        cpu_time_delta_s=r.cpu_ratio,
        read_bytes_delta=int(r.read_bps),
        write_bytes_delta=int(r.write_bps),
        read_chars_delta=int(r.read_bps),
        write_chars_delta=int(r.write_bps),
        interval_s=1.0,
        proof=r.proof,
    )


def run_case(case: Case) -> Result:
    world = World()
    case.setup(world)
    shm = Path("/dev/shm")  # the progress directory is a tmpfs under /run in production, too
    with tempfile.TemporaryDirectory(prefix="gpu-triage-corpus-", dir=shm if shm.is_dir() else None) as tmp:
        root = Path(tmp)
        progress_dir = root / "progress"
        clock = {"now": T0}

        def now_fn() -> float:
            return clock["now"]

        for r in world.ranks:
            if r.progress:
                r.writer = ProgressWriter(
                    r.job,
                    r.rank,
                    r.local_rank,
                    r.world_size,
                    directory=progress_dir,
                    clock=now_fn,
                    pid=r.pid,
                    host=HOST,
                )
                r.writer._record["step"] = r.step
        pids = {r.pid for r in world.ranks}
        reader = ProgressReader(progress_dir, host=HOST, pid_exists=lambda pid: pid in alive_pids)
        tracker = GpuTracker()
        detector = Detector(case.detector)
        store = EventStore(root / "state", T0)
        engine = build_engine(
            store,
            root / "state",
            clock=now_fn,
            node=HOST,
            actions=ActionsConfig(mode=Mode.KILL, dry_run=True),
        )
        silences = SilenceBook()
        timeline: dict[str, list[tuple[float, Verdict]]] = {}
        first_kw: float | None = None
        first_cause: str | None = None
        blame_kw: str | None = None
        first_alert: float | None = None
        plans: list[tuple[float, str, tuple[int, ...]]] = []
        main_job = world.ranks[0].job if world.ranks else ""
        alive_pids: set[int] = set(pids)
        stacks: dict[tuple[str, int], RankStack] = {}
        try:
            tick = 0
            while tick <= case.duration_s:
                t = float(tick)
                now = T0 + t
                clock["now"] = now
                world.t = t
                case.script(world)
                alive_pids = {r.pid for r in world.ranks if r.alive}
                pids |= alive_pids
                for r in world.ranks:
                    _advance(r, now)
                samples = (
                    [_gpu_sample(world, g, now, tick) for g in range(world.gpus)] if case.telemetry else []
                )
                tracker.update(now, samples)
                statuses = tracker.statuses()
                view = reader.read(now)
                procs: dict[str, list[RankProcess]] = {}
                for r in world.ranks:
                    procs.setdefault(r.job, []).append(_process(r, gpu_pids_visible=True))
                jobs = job_views(view.jobs, {k: tuple(v) for k, v in procs.items()})
                if tick % STACK_INTERVAL_S == 0:
                    _sample_stacks(world, now, stacks)
                jobs = [_with_stacks(j, world, stacks) for j in jobs]
                if world.remote is not None:
                    remote = world.remote(world, now)
                    jobs = [dataclasses.replace(j, remote=remote) for j in jobs]
                gviews = [
                    GpuView(
                        g.gpu,
                        g.state,
                        g.state_since,
                        util_known=g.utilization_ratio is not None or g.power_w is None,
                    )
                    for g in statuses
                ]
                results = detector.update(
                    now, gviews, jobs, telemetry_ok=case.telemetry, node_health=world.health
                )
                for j in results:
                    line = timeline.setdefault(j.job, [])
                    if not line or line[-1][1] is not j.verdict:
                        line.append((t, j.verdict))
                    if j.job == main_job and j.kill_worthy and first_kw is None:
                        first_kw, first_cause = t, j.cause
                        blame_kw = str(j.blame)
                records = engine.on_cycle(
                    Cycle(
                        now,
                        mode=Mode.KILL,
                        jobs=results,
                        processes={k: tuple(v) for k, v in procs.items()},
                        gpus=statuses,
                        silences=silences,
                        progress_dir=progress_dir,
                        node_health=world.health,
                    )
                )
                for rec in records:
                    if rec["action"] == "sigterm" and rec["result"] == "started":
                        plans.append((t, rec["job"], tuple(rec.get("pids") or ())))
                    if (
                        rec["action"] == "alert"
                        and rec["result"] in ("queued", "no_sinks")
                        and rec.get("job") == main_job
                        and first_alert is None
                    ):
                        first_alert = t
                deadline = time.monotonic() + 5.0
                while engine.busy and time.monotonic() < deadline:  # let captures finish in step
                    time.sleep(0.001)
                tick += 1
        finally:
            engine.close(timeout_s=2.0)
            store.close()
        return Result(
            case=case,
            timeline=timeline.get(main_job, []),
            first_kill_worthy_s=first_kw,
            first_alert_s=first_alert,
            first_kill_worthy_cause=first_cause,
            sigterm_plans=plans,
            healthy_pids=frozenset(pids) if case.expect.truth == "healthy" else frozenset(),
            jobs_seen=timeline,
            job_pids=frozenset(pids),
            blame_at_kill_worthy=blame_kw,
        )


STACK_INTERVAL_S = 3
"""The stack sampler's suspicion schedule (every rank dumped every 3 s)."""


def _sample_stacks(world: World, now: float, mem: dict[tuple[str, int], RankStack]) -> None:
    """What the sampler keeps: each rank's latest stack and since when it has not changed."""
    for r in world.ranks:
        key = (r.job, r.rank)
        if r.stack is None or not r.alive:
            mem.pop(key, None)
            continue
        frames = tuple(Frame(n, f, ln) for n, f, ln in r.stack)
        info = classify([ThreadStack("MainThread", r.pid, frames)])
        old = mem.get(key)
        if old is not None and old.info.fingerprint == info.fingerprint:
            mem[key] = RankStack(r.rank, r.pid, info, now, old.same_since, old.samples + 1)
        else:
            mem[key] = RankStack(r.rank, r.pid, info, now, now, 1)


def _with_stacks(job: JobView, world: World, mem: dict[tuple[str, int], RankStack]) -> JobView:
    ranks = {rank: s for (name, rank), s in mem.items() if name == job.job}
    if not ranks:
        return job
    sizes = {r.world_size for r in world.job(job.job)}
    return dataclasses.replace(job, stacks=StackSummary(ranks, sizes.pop() if len(sizes) == 1 else None))


def _advance(r: SimRank, now: float) -> None:
    """Steps, phases and the progress file of one rank at ``now``."""
    if r.phase == "train" and r.interval_s is not None:
        if r.next_step_at is None:
            r.next_step_at = now + r.interval_s
        elif now >= r.next_step_at:
            r.step += 1
            r.next_step_at = now + r.interval_s
    else:
        r.next_step_at = None
    if r.writer is None or not r.alive:
        return
    if r.lease_scope is not None:
        r.writer._record["lease_scope"] = r.lease_scope
    want = (r.phase, None if r.phase == "train" else r.lease_s)
    if want != r._written_phase:
        r._written_phase = want
        r.phase_started = now
        r.writer.phase(r.phase, lease_s=None if r.phase == "train" else (r.lease_s or 60.0))
    if r.writer.record["step"] != r.step:  # a trainer reports at each optimizer step
        r.writer.step(r.step)
    else:
        r.writer.flush()  # a step held back by the writer's rate limit goes out a second later


def alert_worthy(verdict: Verdict) -> bool:
    return condition_for(verdict) is not None


def kill_worthy(verdict: Verdict) -> bool:
    return verdict in KILL_WORTHY_VERDICTS


def fmt_timeline(timeline: list[tuple[float, Verdict]], end_s: float) -> str:
    parts = []
    for i, (t, v) in enumerate(timeline):
        until = timeline[i + 1][0] if i + 1 < len(timeline) else end_s
        parts.append(f"{v} {t:.0f}-{until:.0f}")
    return ", ".join(parts)


__all__ = ["ACTIVITY", "Case", "Expect", "Result", "SimRank", "World", "fmt_timeline", "math", "run_case"]
