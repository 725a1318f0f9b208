"""Scripted evidence streams through the detector: every verdict, its onset, and the speed targets
(suspected within 30 s of onset with GPU telemetry and progress; within 3 min on power and process
signals alone), and the two things it must never do (call a checkpoint a deadlock, let one rank's
lease excuse another rank's frozen step)."""

from __future__ import annotations

from collections.abc import Callable

from gpu_triage.detector import Detector, DetectorConfig, GpuView, JobView, RankView
from gpu_triage.states import GpuState, Verdict

C, SPIN, IDLE, STARVE, UNK = (
    GpuState.COMPUTE,
    GpuState.CHECKPOINT_OR_DEADLOCK,
    GpuState.IDLE,
    GpuState.DATA_STARVATION,
    GpuState.UNKNOWN,
)


class Job:
    """A scripted 8-rank job on one node: each second the script says what every rank and GPU does."""

    def __init__(self, ranks: int = 8, progress: bool = True) -> None:
        self.n = ranks
        self.progress = progress
        self.steps = [0] * ranks
        self.changed = [0.0] * ranks
        self.gpu_state = [C] * ranks
        self.gpu_since = [0.0] * ranks
        self.phase = ["train"] * ranks
        self.lease: list[float | None] = [None] * ranks
        self.writes = [0.0] * ranks
        self.status = ["running"] * ranks

    def set_gpus(self, state: GpuState, now: float, which=None) -> None:
        for g in which if which is not None else range(self.n):
            if self.gpu_state[g] is not state:
                self.gpu_state[g], self.gpu_since[g] = state, now

    def advance(self, now: float, which=None) -> None:
        for r in which if which is not None else range(self.n):
            self.steps[r] += 1
            self.changed[r] = now

    def views(self) -> tuple[list[GpuView], list[JobView]]:
        gpus = [GpuView(g, self.gpu_state[g], self.gpu_since[g]) for g in range(self.n)]
        ranks = tuple(
            RankView(
                rank=r,
                pid=1000 + r,
                gpu=r,
                alive=True,
                status=self.status[r],
                cpu_ratio=0.05,
                write_bytes_delta=self.writes[r],
                read_bytes_delta=0.0,
                step=self.steps[r] if self.progress else None,
                phase=self.phase[r] if self.progress else None,
                lease_until=self.lease[r] if self.progress else None,
                step_changed_at=self.changed[r] if self.progress else None,
            )
            for r in range(self.n)
        )
        return gpus, [JobView("ft", ranks, has_progress=self.progress)]


def drive(
    job: Job,
    script: Callable[[float, Job], None],
    until_s: float,
    *,
    cfg: DetectorConfig | None = None,
    telemetry=True,
) -> list[tuple[float, Verdict, float | None]]:
    det = Detector(cfg or DetectorConfig())
    out = []
    t = 0.0
    while t <= until_s:
        script(t, job)
        gpus, jobs = job.views()
        (status,) = det.update(t, gpus if telemetry else [], jobs, telemetry_ok=telemetry)
        out.append((t, status.verdict, status.onset))
        t += 1.0
    return out


def first(out, verdict: Verdict) -> tuple[float, float | None] | None:
    return next(((t, onset) for t, v, onset in out if v is verdict), None)


def training(t: float, job: Job) -> None:
    job.advance(t)


def test_healthy_training_stays_healthy():
    out = drive(Job(), training, 600)
    assert {v for _, v, _ in out} == {Verdict.HEALTHY}


def hang_at(t0: float):
    def script(t: float, job: Job) -> None:
        if t < t0:
            job.advance(t)
            job.set_gpus(C, t)
        else:
            job.set_gpus(SPIN, t)

    return script


def test_symmetric_hang_with_progress_and_gpus_is_suspected_within_30s_then_confirmed():
    out = drive(Job(), hang_at(300), 700)
    t_s, onset = first(out, Verdict.DEADLOCK_SUSPECTED)
    assert 299 <= onset <= 300
    assert t_s - onset <= 30
    t_c, onset_c = first(out, Verdict.DEADLOCK_CONFIRMED)
    assert t_c - t_s >= DetectorConfig().confirm_after_s
    assert onset_c == onset


def test_hang_without_gpu_telemetry_is_still_detected_from_progress():
    out = drive(Job(), hang_at(300), 700, telemetry=False)
    t_s, onset = first(out, Verdict.DEADLOCK_SUSPECTED)
    assert onset <= 300 and t_s - onset <= 90


def test_hang_without_progress_files_is_detected_from_power_and_processes_within_3_min():
    out = drive(Job(progress=False), hang_at(300), 800)
    t_s, onset = first(out, Verdict.DEADLOCK_SUSPECTED)
    assert onset == 300
    assert t_s - onset <= 180


def checkpoint(t0: float, length_s: float, lease_s: float, writer_bytes_per_s: float = 200e6):
    def script(t: float, job: Job) -> None:
        if t < t0 or t >= t0 + length_s:
            job.advance(t)
            job.set_gpus(C, t)
            job.phase = ["train"] * job.n
            job.lease = [None] * job.n
            job.writes = [0.0] * job.n
        else:
            job.phase = ["checkpoint"] * job.n
            job.lease = [t0 + lease_s] * job.n
            job.set_gpus(IDLE, t, [0])
            job.set_gpus(SPIN, t, range(1, job.n))
            job.writes = [writer_bytes_per_s] + [0.0] * (job.n - 1)

    return script


def test_long_checkpoint_with_live_lease_is_never_a_deadlock():
    out = drive(Job(), checkpoint(100, 400, 450), 700)
    verdicts = {v for _, v, _ in out}
    assert Verdict.CHECKPOINT in verdicts
    assert not verdicts & {Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED, Verdict.STALLED_CHECKPOINT}
    assert out[-1][1] is Verdict.HEALTHY


def test_checkpoint_without_progress_files_is_recognised_by_the_writer_writing():
    out = drive(Job(progress=False), checkpoint(100, 400, 450), 700)
    verdicts = {v for _, v, _ in out}
    assert Verdict.CHECKPOINT in verdicts
    assert not verdicts & {Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED}


def test_checkpoint_outliving_its_lease_is_a_stalled_checkpoint():
    out = drive(Job(), checkpoint(100, 400, 60, writer_bytes_per_s=0.0), 400)
    t, onset = first(out, Verdict.STALLED_CHECKPOINT)
    assert onset == 160 and 160 < t <= 170


def test_phase_disagreement_is_the_epoch_end_deadlock_even_with_a_live_lease():
    def script(t: float, job: Job) -> None:
        if t < 200:
            job.advance(t)
            return
        # ranks 0-3 ran out of batches: epoch_end with a generous lease; 4-7 wait in train, frozen
        for r in range(4):
            job.phase[r], job.lease[r] = "epoch_end", 200 + 3600
        job.set_gpus(SPIN, t)

    out = drive(Job(), script, 400)
    t_s, onset = first(out, Verdict.DEADLOCK_SUSPECTED)
    assert onset <= 200 and t_s - onset <= 30


def test_every_rank_outliving_its_epoch_end_lease_is_suspected():
    def script(t: float, job: Job) -> None:
        if t < 100:
            job.advance(t)
            return
        job.phase = ["epoch_end"] * job.n
        job.lease = [100 + 30.0] * job.n  # announced once, never renewed: the ranks hang

    out = drive(Job(), script, 300)
    assert not {v for t, v, _ in out if t < 130} & {Verdict.DEADLOCK_SUSPECTED}
    t_s, onset = first(out, Verdict.DEADLOCK_SUSPECTED)
    cfg = DetectorConfig()
    assert onset <= 100 and t_s <= 130 + cfg.lease_grace_s + cfg.fast_min_s + 1


def test_steps_advancing_again_clears_the_verdict():
    def script(t: float, job: Job) -> None:
        if 100 <= t < 200:
            job.set_gpus(SPIN, t)
        else:
            job.advance(t)
            job.set_gpus(C, t)

    out = drive(Job(), script, 260)
    assert first(out, Verdict.DEADLOCK_SUSPECTED) is not None
    assert out[-1][1] is Verdict.HEALTHY
    assert next(v for t, v, _ in out if t == 201) is Verdict.HEALTHY


def test_slow_steps_are_not_a_hang():
    """A job whose step takes 40 s (a big model) is learned, not suspected between steps."""

    def script(t: float, job: Job) -> None:
        if t % 40 == 0:
            job.advance(t)
        job.set_gpus(SPIN if t % 40 > 30 else C, t)  # waits at the end of each step

    out = drive(Job(), script, 800)
    assert not {v for t, v, _ in out if t > 200} & {Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED}


def test_sustained_data_starvation_names_its_cause():
    def script(t: float, job: Job) -> None:
        job.advance(t)
        if t >= 50:
            job.set_gpus(STARVE, t)
            job.status = ["disk-sleep"] * job.n

    out = drive(Job(), script, 120)
    t, onset = first(out, Verdict.DATA_STARVATION)
    assert onset == 50 and 80 <= t <= 81
    det = Detector()
    j = Job()
    j.set_gpus(STARVE, 0)
    gpus, jobs = j.views()
    det.update(0, gpus, jobs)
    (s,) = det.update(40, gpus, jobs)
    assert s.verdict is Verdict.DATA_STARVATION and s.cause == "loader"


def test_wedged_gpu_reads_become_telemetry_lost():
    def script(t: float, job: Job) -> None:
        job.advance(t)
        if t >= 30:
            job.set_gpus(UNK, t, [3])

    out = drive(Job(), script, 60)
    t, onset = first(out, Verdict.TELEMETRY_LOST)
    assert onset == 30 and t == 40


def test_daemon_config_mirrors_the_detector_config():
    """[detector] in the TOML config is the detector's own config, key for key, default for default."""
    import dataclasses

    from gpu_triage import config

    ours = {f.name: f.default for f in dataclasses.fields(DetectorConfig)}
    theirs = {f.name: f.default for f in dataclasses.fields(config.DetectorConfig)}
    assert ours == theirs
