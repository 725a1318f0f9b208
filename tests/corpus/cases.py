"""The scenario corpus: realistic training situations, each with its truth.

Each case is one node's view of a job (sometimes two jobs), scripted second by second: what the
trainer's ranks write in their progress files, what their processes do, what their GPUs draw. Numbers
come from public figures (docs/triage.md): an H100 trains at ~0.8 of its limit, waits in a collective
at ~0.22 with 100 % utilisation, a checkpoint writer's GPU shows ~0.21 at ~5 %.

Families: healthy training, saves (local, remote, with and without progress files, leases right and
wrong), evals (announced, unannounced, lease too short), warm-ups and resumes, stragglers and slow
models, storage stalls, suspends, restarts, power-capped and MIG nodes, two jobs on a node; and the
hangs (symmetric, asymmetric, epoch-end, in init, after done, loader, on a capped node, under flaky
NVML, behind another rank's lease, on a multi-node job).

The truth and the expectation of each case are stated with it; ``tests/watchdog/test_verdict_corpus.py``
asserts every one and ``python -m benchmarks verdicts`` prints the scorecard.
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_triage.model.health import (
    Blame,
    FaultKind,
    FaultSource,
    GpuHealth,
    HardwareFinding,
    HealthLevel,
    NodeHealth,
    OperatorAction,
    worst,
)
from gpu_triage.model.states import Verdict
from gpu_triage.signals.fleet.facts import NodeJobFacts, RankFacts
from gpu_triage.signals.fleet.remote import RemoteFacts
from gpu_triage.signals.stacks.dumps import Frame, ThreadStack, classify, group_key
from gpu_triage.verdicts.settings import DetectorConfig
from tests.corpus.harness import Case, Expect, SimRank, World

JOB = "qwen3-32b-ft"
V = Verdict
HEALTHY = frozenset({V.HEALTHY})
Stage = Callable[[World], None]


# -- building blocks --------------------------------------------------------------------------------


def node(
    *,
    local: int = 8,
    world_size: int | None = None,
    rank_offset: int = 0,
    model: str = "H100",
    lease_scope: str | None = "job",
    progress: bool = True,
    interval_s: float = 10.0,
    job: str = JOB,
    gpu0: int = 0,
    pid0: int = 40_000,
    power_limit_w: float | None = None,
    util_readable: bool = True,
    start_step: int = 0,
    start_phase: str = "init",
) -> Stage:
    """A setup: ``local`` ranks of ``job`` on GPUs ``gpu0..``, one per GPU."""

    def setup(w: World) -> None:
        w.model = model
        w.gpus = max(w.gpus, gpu0 + local) if w.ranks else gpu0 + local
        w.power_limit_w = power_limit_w
        w.util_readable = util_readable
        for i in range(local):
            w.ranks.append(
                SimRank(
                    job=job,
                    rank=rank_offset + i,
                    local_rank=i,
                    world_size=world_size or local,
                    gpu=gpu0 + i,
                    pid=pid0 + i,
                    phase=start_phase,
                    lease_s=600.0 if start_phase != "train" else None,
                    interval_s=interval_s,
                    step=start_step,
                    progress=progress,
                    lease_scope=lease_scope if progress else None,
                    proof=("rank_env", "gpu_context", "progress_file") if progress else ("gpu_context",),
                )
            )

    return setup


def both(*setups: Stage) -> Stage:
    def setup(w: World) -> None:
        for s in setups:
            s(w)

    return setup


def gpus_of(w: World, ranks: list[SimRank]) -> list[int]:
    return [r.gpu for r in ranks if r.gpu is not None]


def boot(w: World, ranks: list[SimRank] | None = None, *, lease_s: float = 600.0) -> None:
    ranks = w.ranks if ranks is None else ranks
    w.set(ranks, phase="init", lease_s=lease_s, read_bps=300e6, status="running", write_bps=0.0)
    w.set_gpus("idle_mem", gpus_of(w, ranks))


def train(w: World, ranks: list[SimRank] | None = None, *, interval_s: float | None = None) -> None:
    ranks = w.ranks if ranks is None else ranks
    values: dict[str, object] = {"phase": "train", "write_bps": 0.0, "read_bps": 0.0, "status": "running"}
    if interval_s is not None:
        values["interval_s"] = interval_s
    w.set(ranks, **values)
    for r in ranks:
        if r.interval_s is None:
            r.interval_s = 10.0
    w.set_gpus("train", gpus_of(w, ranks))


def hang(w: World, ranks: list[SimRank] | None = None, *, gpu: str = "spin") -> None:
    """The ranks block in a collective: steps stop, their GPUs wait in the spin band."""
    ranks = w.ranks if ranks is None else ranks
    w.set(ranks, interval_s=None, status="sleeping", write_bps=0.0, read_bps=0.0)
    w.set_gpus(gpu, gpus_of(w, ranks))


def local_save(w: World, *, lease_s: float, ours: bool = True, writer_bps: float = 400e6) -> None:
    """Rank 0 writes; the others wait for it in a collective. Ours: every rank announces the save."""
    ranks = w.ranks
    if ours:
        w.set(ranks, phase="checkpoint", lease_s=lease_s, interval_s=None)
    else:
        w.set(ranks[:1], phase="checkpoint", lease_s=lease_s, interval_s=None)
        w.set(ranks[1:], interval_s=None)
    w.set(ranks[:1], write_bps=writer_bps, status="running")
    w.set_gpus("writer", gpus_of(w, ranks[:1]))
    w.set_gpus("spin", gpus_of(w, ranks[1:]))


def script(*stages: tuple[float, Stage]) -> Callable[[World], None]:
    """Apply the stage whose start is the latest at or before the current tick (once, on entry)."""
    ordered = sorted(stages, key=lambda s: s[0])

    def run(w: World) -> None:
        for start, stage in ordered:
            if w.t == start:
                stage(w)

    return run


def first_of(ranks: int) -> Callable[[World], list[SimRank]]:
    return lambda w: w.ranks[:ranks]


# -- the cases --------------------------------------------------------------------------------------

BOOT = (0.0, lambda w: boot(w))
TRAIN = (60.0, lambda w: train(w))


def healthy_cases() -> list[Case]:
    cases = [
        Case(
            "steady-training",
            "training",
            node(),
            script(BOOT, TRAIN),
            900,
            Expect("healthy", allowed=HEALTHY),
            describe="8 ranks, 10 s steps; every step ends with a second of waiting in the spin band",
        ),
        Case(
            "local-save-60s",
            "save",
            node(),
            script(BOOT, TRAIN, (300.0, lambda w: local_save(w, lease_s=180)), (360.0, lambda w: train(w))),
            700,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
            onset_s=300,
            describe="every rank announces the save; rank 0 writes for 60 s, seven GPUs spin",
        ),
        Case(
            "local-save-600s-slow-storage",
            "save",
            node(),
            script(
                BOOT, TRAIN, (300.0, lambda w: local_save(w, lease_s=900, writer_bps=40e6)), (900.0, train)
            ),
            1200,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
            onset_s=300,
        ),
        Case(
            "local-save-lease-too-short",
            "save",
            node(),
            script(
                BOOT, TRAIN, (300.0, lambda w: local_save(w, lease_s=200, writer_bps=60e6)), (900.0, train)
            ),
            1200,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT, V.STALLED_CHECKPOINT})),
            onset_s=300,
            describe="a 600 s save under a 200 s lease: stalled_checkpoint (still writing), never hung",
        ),
        Case(
            "local-save-third-party-lease-on-saver-only",
            "save",
            node(lease_scope="rank"),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: local_save(w, lease_s=400, ours=False)),
                (600.0, lambda w: train(w)),
            ),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
            onset_s=300,
        ),
        Case(
            "remote-save-300s-ours",
            "save",
            node(world_size=16, rank_offset=8),
            script(
                BOOT,
                TRAIN,
                (
                    300.0,
                    lambda w: (w.set(phase="checkpoint", lease_s=600, interval_s=None), w.set_gpus("spin")),
                ),
                (600.0, lambda w: train(w)),
            ),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
            onset_s=300,
            describe="node B of a 2-node job: the writer is on node A; every local rank announces the save",
        ),
        Case(
            "remote-save-600s-third-party",
            "save",
            node(world_size=16, rank_offset=8, lease_scope="rank"),
            script(BOOT, TRAIN, (300.0, lambda w: hang(w)), (900.0, lambda w: train(w))),
            1200,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.STALLED})),
            onset_s=300,
            describe="node B; the trainer announces the save only on the saving rank (on node A): every "
            "local rank looks frozen in train with its GPU spinning for 600 s - an alert at most",
        ),
        Case(
            "remote-save-300s-no-progress-files",
            "save",
            node(progress=False),
            script(BOOT, TRAIN, (300.0, lambda w: hang(w)), (600.0, lambda w: train(w))),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.STALLED})),
            onset_s=300,
            describe="no integration: power alone cannot tell this from a hang; alert, never kill",
        ),
        Case(
            "local-save-no-progress-files",
            "save",
            node(progress=False),
            script(BOOT, TRAIN, (300.0, lambda w: local_save(w, lease_s=60, ours=False)), (390.0, train)),
            700,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
            onset_s=300,
        ),
        Case(
            "long-eval-announced",
            "eval",
            node(),
            script(
                BOOT,
                TRAIN,
                (
                    200.0,
                    lambda w: (w.set(phase="eval", lease_s=1800, interval_s=None), w.set_gpus("compute")),
                ),
                (1700.0, lambda w: train(w)),
            ),
            1900,
            Expect("healthy", allowed=HEALTHY),
            onset_s=200,
        ),
        Case(
            "eval-unannounced",
            "eval",
            node(lease_scope="rank"),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: (w.set(interval_s=None), w.set_gpus("compute"))),
                (700.0, lambda w: train(w)),
            ),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.SLOW})),
            onset_s=300,
            describe="a 400 s eval the trainer does not announce: GPUs compute, steps frozen - slow",
        ),
        Case(
            "eval-lease-too-short",
            "eval",
            node(),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: (w.set(phase="eval", lease_s=60, interval_s=None), w.set_gpus("compute"))),
                (600.0, lambda w: train(w)),
            ),
            800,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.SLOW})),
            onset_s=300,
        ),
        Case(
            "rank0-eval-others-wait",
            "eval",
            node(lease_scope="rank"),
            script(
                BOOT,
                TRAIN,
                (
                    300.0,
                    lambda w: (
                        w.set(w.ranks[:1], phase="eval", lease_s=900, interval_s=None),
                        w.set(w.ranks[1:], interval_s=None),
                        w.set_gpus("compute", [0]),
                        w.set_gpus("spin", list(range(1, 8))),
                    ),
                ),
                (800.0, lambda w: train(w)),
            ),
            1000,
            Expect("healthy", allowed=HEALTHY),
            onset_s=300,
            describe="rank 0 evaluates under its own lease, the others wait for it in a collective",
        ),
        Case(
            "warm-up-slow-first-step",
            "warm-up",
            node(),
            script(
                (0.0, lambda w: boot(w, lease_s=300)),
                (120.0, lambda w: (train(w, interval_s=400.0), w.set_gpus("idle_mem"))),
                (420.0, lambda w: w.set_gpus("train")),
                (520.0, lambda w: w.set(interval_s=10.0)),
            ),
            900,
            Expect("healthy", allowed=HEALTHY),
            onset_s=120,
            describe="120 s model load, then a 400 s first step (torch.compile, NCCL set-up) with idle GPUs",
        ),
        Case(
            "resume-32b",
            "warm-up",
            node(interval_s=60.0),
            script(
                (0.0, lambda w: boot(w, lease_s=900)),
                (600.0, lambda w: (train(w, interval_s=300.0), w.set_gpus("idle_mem"))),
                (700.0, lambda w: w.set_gpus("train")),
                (900.0, lambda w: w.set(interval_s=60.0)),
            ),
            1500,
            Expect("healthy", allowed=HEALTHY),
            describe="a 32B resume: 600 s loading under an init lease, a 300 s first step, 60 s steps",
        ),
        Case(
            "post-checkpoint-first-step",
            "save",
            node(interval_s=30.0),
            script(
                BOOT,
                TRAIN,
                (400.0, lambda w: local_save(w, lease_s=180)),
                (460.0, lambda w: train(w, interval_s=70.0)),
                (530.0, lambda w: w.set(interval_s=30.0)),
            ),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
            onset_s=400,
            describe="30 s steps; after a save the first step takes 70 s",
        ),
        Case(
            "straggler-on-the-other-node",
            "straggler",
            node(world_size=16, rank_offset=8),
            script(
                BOOT,
                TRAIN,
                (400.0, lambda w: w.set(interval_s=20.0, wait_s=11.0)),
                (700.0, lambda w: w.set(interval_s=10.0, wait_s=1.0)),
            ),
            900,
            Expect("healthy", allowed=HEALTHY),
            onset_s=400,
            describe="node B of 16 ranks; node A slows down, each step doubles and node B waits 11 s",
        ),
        Case(
            "slow-model-unlearned",
            "slow model",
            node(interval_s=75.0, start_phase="train", start_step=1200),
            script((0.0, lambda w: train(w))),
            900,
            Expect("healthy", allowed=HEALTHY),
            describe="the daemon starts while a 32B job runs 75 s steps: nothing learned yet",
        ),
        Case(
            "storage-stall-d-state",
            "storage",
            node(),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: (w.set(interval_s=None, status="disk-sleep"), w.set_gpus("idle_mem"))),
                (600.0, lambda w: train(w)),
            ),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.STALLED, V.DATA_STARVATION})),
            onset_s=300,
            describe="a 300 s storage stall: ranks in D-state, GPUs idle - an alert, never hung",
        ),
        Case(
            "suspended-mid-collective",
            "suspend",
            node(),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: (w.set(interval_s=None, status="stopped"), w.set_gpus("spin"))),
                (900.0, lambda w: train(w)),
            ),
            1100,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.SUSPENDED})),
            onset_s=300,
            describe="the scheduler stops every rank (SIGSTOP) in a collective: the GPUs spin for 600 s",
        ),
        Case(
            "restart-from-checkpoint",
            "restart",
            node(),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: (w.set(alive=False, interval_s=None), w.set_gpus("idle"))),
                (320.0, lambda w: (_respawn(w, step_back=20), boot(w, lease_s=300))),
                (420.0, lambda w: train(w, interval_s=10.0)),
            ),
            800,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.GONE})),
            describe="the job dies (`gone` while no rank runs) and is restarted (new pids, same job name) "
            "from an earlier step",
        ),
        Case(
            "capped-400w-training-and-save",
            "capped",
            node(power_limit_w=400.0),
            script(BOOT, TRAIN, (300.0, lambda w: local_save(w, lease_s=180)), (360.0, lambda w: train(w))),
            700,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
        ),
        Case(
            "mig-idle-memory-no-utilization",
            "mig",
            node(progress=False, util_readable=False),
            script((0.0, lambda w: w.set_gpus("idle_mem"))),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CANNOT_JUDGE})),
            describe="utilisation unreadable (MIG/vGPU), a process holds memory and does nothing: with no "
            "progress files that is cannot_judge after idle_held_after_s (a hung loader looks the same)",
        ),
        Case(
            "two-jobs-one-saving",
            "two jobs",
            both(
                node(local=4, job="job-a", pid0=41_000),
                node(local=4, job="job-b", gpu0=4, pid0=42_000),
            ),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: _save_job(w, "job-b", lease_s=180)),
                (400.0, lambda w: train(w, w.job("job-b"))),
            ),
            700,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
        ),
        Case(
            "done-and-exit",
            "done",
            node(),
            script(
                BOOT,
                TRAIN,
                (400.0, lambda w: (w.set(phase="done", lease_s=60, interval_s=None), w.set_gpus("idle_mem"))),
                (420.0, lambda w: (w.set(alive=False), w.set_gpus("idle"))),
            ),
            600,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.DONE})),
            describe="every rank announces `done` and exits: `done`, never a stall",
        ),
        Case(
            "slow-loader-starving",
            "data",
            node(interval_s=30.0),
            script(BOOT, TRAIN, (300.0, lambda w: (w.set(interval_s=30.0), w.set_gpus("starve")))),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.DATA_STARVATION})),
        ),
        Case(
            "flaky-nvml-training",
            "nvml",
            node(),
            script(BOOT, TRAIN, (100.0, lambda w: w.set_gpus("flaky:compute"))),
            600,
            Expect("healthy", allowed=HEALTHY),
            describe="one read in four times out during normal training",
        ),
    ]
    return cases


def _respawn(w: World, *, step_back: int) -> None:
    for r in w.ranks:
        r.pid += 1000
        r.alive = True
        r.step = max(0, r.step - step_back)
        if r.writer is not None:
            r.writer._record["pid"] = r.pid
        r._written_phase = None


def _save_job(w: World, job: str, *, lease_s: float) -> None:
    ranks = w.job(job)
    w.set(ranks, phase="checkpoint", lease_s=lease_s, interval_s=None)
    w.set(ranks[:1], write_bps=300e6)
    w.set_gpus("writer", gpus_of(w, ranks[:1]))
    w.set_gpus("spin", gpus_of(w, ranks[1:]))


KW30 = Expect("hang", kill_worthy_within_s=30.0, alert_within_s=90.0)


def hang_cases() -> list[Case]:
    return [
        Case(
            "symmetric-hang",
            "hang",
            node(),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w))),
            800,
            KW30,
            onset_s=400,
        ),
        Case(
            "epoch-end-deadlock",
            "hang",
            node(),
            script(
                BOOT,
                TRAIN,
                (
                    400.0,
                    lambda w: (
                        hang(w),
                        w.set(w.ranks[:3], phase="epoch_end", lease_s=120),
                    ),
                ),
            ),
            800,
            KW30,
            onset_s=400,
            describe="ranks 0-2 ran out of data and wait at the epoch end; ranks 3-7 wait in the next step",
        ),
        Case(
            "epoch-end-deadlock-no-gpu-telemetry",
            "hang",
            node(),
            script(
                BOOT,
                TRAIN,
                (400.0, lambda w: (hang(w), w.set(w.ranks[:3], phase="epoch_end", lease_s=120))),
            ),
            800,
            KW30,
            onset_s=400,
            telemetry=False,
            describe="the same with --source none (a CPU job, or no NVML)",
        ),
        Case(
            "asymmetric-hang-busy-loop",
            "hang",
            node(),
            script(BOOT, TRAIN, (400.0, lambda w: (hang(w), w.set_gpus("busy_loop", [3])))),
            800,
            KW30,
            onset_s=400,
            describe="rank 3's GPU runs a kernel that never ends; the others wait for it",
        ),
        Case(
            "asymmetric-hang-host-idle",
            "hang",
            node(),
            script(BOOT, TRAIN, (400.0, lambda w: (hang(w), w.set_gpus("idle_mem", [5])))),
            800,
            KW30,
            onset_s=400,
            describe="rank 5 is stuck on the host (its GPU idle); the others wait for it",
        ),
        Case(
            "symmetric-hang-no-progress-files",
            "hang",
            node(progress=False),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w))),
            800,
            Expect("hang", alert_within_s=180.0, limit="no progress files: power alone is alert-only"),
            onset_s=400,
        ),
        Case(
            "asymmetric-hang-no-progress-files",
            "hang",
            node(progress=False),
            script(BOOT, TRAIN, (400.0, lambda w: (hang(w), w.set_gpus("busy_loop", [2])))),
            800,
            Expect("hang", alert_within_s=180.0, limit="no progress files: power alone is alert-only"),
            onset_s=400,
        ),
        Case(
            "init-hang-nccl",
            "hang",
            node(),
            script(
                (0.0, lambda w: boot(w, lease_s=240)),
                (60.0, lambda w: (w.set(read_bps=0.0, status="sleeping"), w.set_gpus("spin"))),
                (60.0, lambda w: w.set_gpus("idle_mem", [2])),
            ),
            600,
            KW30,
            onset_s=245,
            describe="NCCL set-up: seven ranks wait in the first broadcast, rank 2 never joins; the init "
            "lease (240 s) runs out at 245 s with grace - the onset this node can know",
        ),
        Case(
            "init-hang-gpus-idle",
            "hang",
            node(),
            script(
                (0.0, lambda w: boot(w, lease_s=240)),
                (60.0, lambda w: w.set(read_bps=0.0, status="sleeping")),
            ),
            600,
            Expect(
                "hang",
                alert_within_s=60.0,
                limit="init lease outlived with idle GPUs and no I/O: absence of progress, no second signal",
            ),
            onset_s=245,
        ),
        Case(
            "hang-after-done",
            "hang",
            node(),
            script(
                BOOT,
                TRAIN,
                (400.0, lambda w: (w.set(phase="done", lease_s=60, interval_s=None), w.set_gpus("spin"))),
            ),
            800,
            KW30,
            onset_s=465,
            describe="destroy_process_group never returns: the done lease (60 s) runs out",
        ),
        Case(
            "loader-hang",
            "hang",
            node(),
            script(BOOT, TRAIN, (400.0, lambda w: (hang(w), w.set_gpus("idle_mem")))),
            800,
            Expect(
                "hang",
                alert_within_s=120.0,
                limit="a data-loader deadlock leaves the GPUs idle: frozen steps alone are alert-only",
            ),
            onset_s=400,
        ),
        Case(
            "hang-on-capped-node-400w",
            "hang",
            node(power_limit_w=400.0),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w))),
            800,
            KW30,
            onset_s=400,
            describe="an H100 capped at 400 W: the spin still draws ~155 W",
        ),
        Case(
            "hang-on-capped-node-500w",
            "hang",
            node(power_limit_w=500.0),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w))),
            800,
            KW30,
            onset_s=400,
        ),
        Case(
            "hang-with-flaky-nvml",
            "hang",
            node(),
            script(BOOT, TRAIN, (100.0, lambda w: w.set_gpus("flaky:train")), (400.0, _flaky_hang)),
            800,
            KW30,
            onset_s=400,
            describe="one NVML read in four times out, before and during the hang",
        ),
        Case(
            "hang-behind-long-eval-lease",
            "hang",
            node(),
            script(
                BOOT,
                TRAIN,
                (400.0, lambda w: (hang(w), w.set(w.ranks[:1], phase="eval", lease_s=1800))),
            ),
            800,
            KW30,
            onset_s=400,
            describe="rank 0 announced a 30-minute eval, but every GPU (its own too) waits in a collective",
        ),
        Case(
            "multi-node-hang",
            "hang",
            node(world_size=16, rank_offset=8),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w))),
            800,
            KW30,
            onset_s=400,
            describe="node B of 16 ranks; the trainer announces its phases on every rank (lease_scope job)",
        ),
        Case(
            "multi-node-hang-third-party",
            "hang",
            node(world_size=16, rank_offset=8, lease_scope="rank"),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w))),
            800,
            Expect(
                "hang",
                alert_within_s=90.0,
                limit="ranks on another node announce only their own phases: a save there looks the same",
            ),
            onset_s=400,
        ),
        Case(
            "hang-in-first-step-after-save",
            "hang",
            node(),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: local_save(w, lease_s=180)),
                (360.0, lambda w: (train(w), hang(w))),
            ),
            700,
            KW30,
            onset_s=360,
        ),
        Case(
            "hang-no-gpu-telemetry-frozen-steps",
            "hang",
            node(),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w))),
            800,
            Expect(
                "hang",
                alert_within_s=120.0,
                limit="--source none and no phase disagreement: frozen steps alone are alert-only",
            ),
            onset_s=400,
            telemetry=False,
        ),
        Case(
            "hang-power-only-armed",
            "hang",
            node(progress=False),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w))),
            800,
            Expect("hang", kill_worthy_within_s=150.0, alert_within_s=180.0),
            onset_s=400,
            detector=DetectorConfig(power_only_can_kill=True),
            describe="no progress files, with detector.power_only_can_kill = true",
        ),
    ]


SP = "/usr/lib/python3/dist-packages/"
IN_SAVE = (
    ("barrier", SP + "torch/distributed/distributed_c10d.py", 5356),
    ("DeepSpeedEngine.save_checkpoint", SP + "deepspeed/runtime/engine.py", 4966),
    ("main", "/home/user/train.py", 120),
)
IN_ALLREDUCE = (
    ("all_reduce", SP + "torch/distributed/distributed_c10d.py", 2800),
    ("DistributedDataParallel._sync", SP + "torch/nn/parallel/distributed.py", 1500),
    ("main", "/home/user/train.py", 88),
)


def stack_cases() -> list[Case]:
    """Jobs without progress files whose ranks' stacks the sampler reads (py-spy)."""
    return [
        Case(
            "remote-save-no-progress-files-stacks",
            "save",
            node(progress=False, world_size=16),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: (hang(w), w.set(stack=IN_SAVE))),
                (900.0, lambda w: (train(w), w.set(stack=None))),
            ),
            1100,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
            onset_s=300,
            describe="8 of 16 ranks here, the writer on another node, no integration: every local GPU "
            "spins for 600 s, but the stacks wait inside save_checkpoint - checkpoint, not even stalled",
        ),
        Case(
            "hang-no-progress-files-stacks",
            "hang",
            node(progress=False),
            script(BOOT, TRAIN, (400.0, lambda w: (hang(w), w.set(stack=IN_ALLREDUCE, cpu_ratio=1.0)))),
            800,
            Expect("hang", kill_worthy_within_s=45.0, alert_within_s=180.0),
            onset_s=400,
            describe="no integration, every rank frozen in the same all_reduce with NCCL spinning its host "
            "thread: stacks + the spin band (K6)",
        ),
        Case(
            "healthy-no-progress-files-same-stack",
            "train",
            node(progress=False),
            script(BOOT, (60.0, lambda w: (train(w), w.set(stack=IN_ALLREDUCE, cpu_ratio=1.0)))),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY})),
            describe="healthy, but every dump lands in the same all_reduce line (the worst sampling luck): "
            "working GPUs and busy host threads keep it healthy",
        ),
    ]


WRITING = (
    ("_write", "/usr/lib/python3.11/io.py", 1200),
    ("DeepSpeedEngine.save_checkpoint", SP + "deepspeed/runtime/engine.py", 4966),
    ("main", "/home/user/train.py", 120),
)
"""The rank that does the save's work: inside save_checkpoint, in no collective."""


def other_node(*, name: str = "node-b", first: int = 8, world: int = 16, script):
    """``[cluster]``: the job's other node as Prometheus answers about it. ``script(t)`` -> a time (the
    node silent since then: its target down) or one entry per rank: None (it trains, its stack moves) or
    (frames, frozen since; None: moving)."""

    def answer(w: World, now: float) -> RemoteFacts:
        stacks = script(w.t)
        if isinstance(stacks, float):  # silent since then: its series gone, its last facts remembered
            return RemoteFacts(JOB, now, (), last_seen=((name, now - (w.t - stacks)),))
        ranks = []
        for i, entry in enumerate(stacks):
            frames, frozen_at = entry if entry is not None else (IN_ALLREDUCE, None)
            since = now if frozen_at is None else now - (w.t - frozen_at)
            info = classify([ThreadStack("MainThread", 1, tuple(Frame(*f) for f in frames))])
            ranks.append(
                RankFacts(
                    rank=first + i,
                    stack_phase=str(info.phase),
                    stack_where=group_key(info),
                    stack_same_since=since,
                    stack_sampled_at=now - 1,
                    stack_collective=info.collective,
                )
            )
        facts = NodeJobFacts(JOB, name, now - 1, world, "stalled", None, False, False, False, tuple(ranks))
        return RemoteFacts(JOB, now, (facts,), last_seen=((name, now - 1),))

    def setup(w: World) -> None:
        w.remote = answer

    return setup


def _both(*setups: Stage) -> Stage:
    def setup(w: World) -> None:
        for s in setups:
            s(w)

    return setup


def fleet_cases() -> list[Case]:
    """Issue 26: one job on two nodes (8 ranks here, 8 on node-b), the other node's facts through
    Prometheus ([cluster]), no progress files: the reference failure across nodes and a node lost."""
    moving = [None] * 8
    return [
        Case(
            "hang-save-split-across-nodes",
            "hang",
            _both(
                node(progress=False, world_size=16),
                other_node(
                    script=lambda t: moving if t < 400 else [(IN_SAVE, 400.0)] * 7 + [(IN_ALLREDUCE, 400.0)]
                ),
            ),
            script(BOOT, TRAIN, (400.0, lambda w: (hang(w), w.set(stack=IN_SAVE)))),
            800,
            Expect("hang", kill_worthy_within_s=120.0, alert_within_s=180.0),
            onset_s=400,
            describe="the epoch-end save deadlock over two nodes: every rank here and 7 on node-b wait in "
            "save_checkpoint's collective, node-b's rank 15 in its extra step's all-reduce; alone, this node "
            "sees a save (K6 split completed across nodes; before: checkpoint forever)",
        ),
        Case(
            "node-lost-no-progress-files",
            "hang",
            _both(
                node(progress=False, world_size=16), other_node(script=lambda t: moving if t < 400 else 400.0)
            ),
            script(BOOT, TRAIN, (400.0, lambda w: (hang(w), w.set(stack=IN_ALLREDUCE)))),
            800,
            Expect("hang", kill_worthy_within_s=120.0, alert_within_s=180.0, cause="node node-b lost"),
            onset_s=400,
            describe="node-b hangs whole (its daemon's target down): every rank here waits in its next "
            "all-reduce (K7; before: stalled until NCCL's timeout)",
        ),
        Case(
            "remote-writer-everyone-else-in-the-save",
            "save",
            _both(
                node(progress=False, world_size=16),
                other_node(
                    script=lambda t: (
                        moving if t < 300 or t >= 900 else [(WRITING, None)] + [(IN_SAVE, 300.0)] * 7
                    )
                ),
            ),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: (hang(w), w.set(stack=IN_SAVE))),
                (900.0, lambda w: (train(w), w.set(stack=None))),
            ),
            1100,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.CHECKPOINT})),
            onset_s=300,
            describe="a 10-minute save: node-b's rank 8 writes (its stack moves, in no collective), every "
            "other rank on both nodes waits inside the save's collective - never hung",
        ),
        Case(
            "remote-daemon-stopped-while-training",
            "train",
            _both(
                node(progress=False, world_size=16),
                other_node(script=lambda t: moving if t < 300 else 300.0),
            ),
            script(BOOT, (60.0, lambda w: (train(w), w.set(stack=IN_ALLREDUCE, cpu_ratio=1.0)))),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY})),
            describe="node-b's daemon stops at 300 s while the job trains on (every dump here lands in the "
            "same all_reduce line, host threads busy): node-b is silent, never lost against the job",
        ),
    ]


def _containers(*setups: Stage) -> Stage:
    """Jobs in containers without host PIDs: NVML names no process of theirs, nothing ties a rank to
    its GPU (the GPUs still draw what the ranks do)."""

    def setup(w: World) -> None:
        for s in setups:
            s(w)
        w.set(host_pids=False)

    return setup


def wild_cases() -> list[Case]:
    """Issue 19: hangs as they happen in the wild - ``slow`` that never ends, and jobs the watchdog
    cannot judge (it must say so, never ``healthy``)."""
    return [
        Case(
            "busy-loop-hang-third-party",
            "hang",
            node(lease_scope="rank"),
            script(BOOT, TRAIN, (400.0, lambda w: (hang(w), w.set_gpus("busy_loop", [3])))),
            900,
            Expect(
                "hang",
                alert_within_s=120.0,
                limit="phases announced per rank: an unannounced eval on rank 3 looks the same - stalled "
                "(asymmetric), not slow",
                ends_in=frozenset({V.STALLED}),
            ),
            onset_s=400,
            describe="rank 3's GPU runs a kernel that never ends, the others spin; before: slow forever",
        ),
        Case(
            "band-edge-spin-hang",
            "hang",
            node(lease_scope="rank"),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w, gpu="spin_edge"))),
            900,
            Expect(
                "hang",
                alert_within_s=120.0,
                limit="the spin draws 0.29-0.31 of the limit: the communication band's edge, no power proof",
                ends_in=frozenset({V.STALLED, V.DEADLOCK_SUSPECTED, V.DEADLOCK_CONFIRMED}),
            ),
            onset_s=400,
            describe="a hang whose spin power sits on the band edge at 100 % util; before: slow forever",
        ),
        Case(
            "band-edge-spin-hang-stacks",
            "hang",
            node(lease_scope="rank"),
            script(
                BOOT,
                TRAIN,
                (400.0, lambda w: (hang(w, gpu="spin_edge"), w.set(stack=IN_ALLREDUCE, cpu_ratio=1.0))),
            ),
            900,
            Expect("hang", kill_worthy_within_s=45.0, alert_within_s=120.0),
            onset_s=400,
            describe="the band-edge spin with the stack sampler: frozen steps and every stack frozen in the "
            "all-reduce are independent proof (K6); GPUs in the communication band do not veto it",
        ),
        Case(
            "band-edge-spin-hang-no-progress-files",
            "hang",
            node(progress=False),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w, gpu="spin_edge"))),
            900,
            Expect(
                "hang",
                alert_within_s=180.0,
                limit="no progress files: power alone is alert-only",
                ends_in=frozenset({V.STALLED}),
            ),
            onset_s=400,
            describe="the same without progress files; before: healthy throughout",
        ),
        Case(
            "eval-unannounced-long",
            "eval",
            node(lease_scope="rank"),
            script(
                BOOT,
                TRAIN,
                (300.0, lambda w: (w.set(interval_s=None), w.set_gpus("compute"))),
                (1500.0, lambda w: train(w)),
            ),
            1700,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.SLOW, V.STALLED})),
            onset_s=300,
            describe="a 20-minute eval nobody announces: slow, then stalled (an alert) after "
            "slow_max_budgets stall budgets - never hung",
        ),
        Case(
            "containers-no-host-pids-one-hung",
            "hang",
            _containers(
                node(local=4, job="job-b", gpu0=4, pid0=42_000, progress=False),
                node(local=4, job="job-a", pid0=41_000, progress=False),
            ),
            script(BOOT, TRAIN, (400.0, lambda w: hang(w, w.job("job-b")))),
            800,
            Expect(
                "hang",
                alert_within_s=60.0,
                limit="no progress files and no rank tied to a GPU: cannot_judge from the start",
                ends_in=frozenset({V.CANNOT_JUDGE}),
            ),
            onset_s=400,
            describe="two jobs in containers without host PIDs, no integration; job-b hangs; before: healthy",
        ),
        Case(
            "loader-hang-no-progress-files",
            "hang",
            node(progress=False),
            script(BOOT, TRAIN, (400.0, lambda w: (hang(w), w.set_gpus("idle_mem")))),
            1000,
            Expect(
                "hang",
                alert_within_s=360.0,
                limit="GPUs idle with memory held, ranks asleep: a hung loader and a paused job look the "
                "same - cannot_judge after idle_held_after_s",
                ends_in=frozenset({V.CANNOT_JUDGE}),
            ),
            onset_s=400,
            describe="a hung data loader without progress files; before: healthy forever",
        ),
    ]


def _flaky_hang(w: World) -> None:
    hang(w)
    w.set_gpus("flaky:spin")


def _finding(
    gpu: int, kind: FaultKind, level: HealthLevel, *, xid: int | None = None, detail: str
) -> HardwareFinding:
    fault = level is HealthLevel.UNHEALTHY
    return HardwareFinding(
        kind=kind,
        level=level,
        blame=Blame.NODE,
        action=OperatorAction.DRAIN_NODE if fault else OperatorAction.NONE,
        detail=detail,
        source=FaultSource.KERNEL_LOG if xid is not None else FaultSource.NVML_POLL,
        gpu=gpu,
        xid=xid,
    )


def _health(w: World, *findings: HardwareFinding) -> None:
    """The node's health from now on: ``findings`` (per GPU; the worst level wins)."""
    by_gpu: dict[int, list[HardwareFinding]] = {}
    for f in findings:
        by_gpu.setdefault(f.gpu if f.gpu is not None else -1, []).append(f)
    gpus = tuple(
        GpuHealth(g, None, worst([f.level for f in fs]), tuple(fs)) for g, fs in sorted(by_gpu.items())
    )
    w.health = NodeHealth(level=worst([g.level for g in gpus]), gpus=gpus)


XID_79 = _finding(
    3, FaultKind.XID, HealthLevel.UNHEALTHY, xid=79, detail="Xid 79: GPU has fallen off the bus"
)
ECC_BURST = tuple(
    _finding(g, FaultKind.ECC_CORRECTABLE, HealthLevel.DEGRADED, detail="4096 correctable ECC errors")
    for g in range(8)
)
THROTTLE = tuple(
    _finding(g, FaultKind.THROTTLE_THERMAL, HealthLevel.DEGRADED, detail="thermal slowdown") for g in range(8)
)
PCIE_DROP = _finding(5, FaultKind.PCIE_DEGRADED, HealthLevel.DEGRADED, detail="PCIe Gen5 x8 of x16")


def hardware_cases() -> list[Case]:
    """The node's health beside the job (issue 27): a hang on a faulty GPU is the node's, and
    confirmed at once; degraded signals never make a kill."""
    return [
        Case(
            "hang-after-xid-79",
            "hardware",
            node(),
            script(BOOT, TRAIN, (390.0, lambda w: _health(w, XID_79)), (400.0, lambda w: hang(w))),
            800,
            Expect("hang", kill_worthy_within_s=30.0, alert_within_s=90.0, blame="node"),
            onset_s=400,
            describe="an Xid 79 on GPU 3, then every rank blocks in a collective: blame node, no window",
        ),
        Case(
            "healthy-through-degraded-gpus",
            "hardware",
            node(),
            script(
                BOOT,
                TRAIN,
                (200.0, lambda w: _health(w, *ECC_BURST)),
                (300.0, lambda w: (_health(w, *THROTTLE), w.set(interval_s=25.0), w.set_gpus("spin"))),
                (600.0, lambda w: (_health(w, PCIE_DROP), train(w, interval_s=12.0))),
            ),
            900,
            Expect("healthy", allowed=frozenset({V.HEALTHY, V.SLOW, V.STALLED})),
            describe="a correctable ECC burst, a thermal throttle (full utilisation at spin-band power, "
            "steps 2.5x slower), a PCIe width drop: an alert at most",
        ),
    ]


def all_cases() -> list[Case]:
    return healthy_cases() + hang_cases() + stack_cases() + wild_cases() + fleet_cases() + hardware_cases()


__all__ = ["all_cases", "hang_cases", "healthy_cases"]
