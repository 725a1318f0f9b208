"""Scripted evidence streams through the detector: every verdict, its onset, the speed targets
(kill-worthy within 30 s of onset with GPU telemetry and progress; stalled within 3 min on power
alone), the verdict model (only positive evidence of a hang from two independent signals is
kill-worthy; the absence of progress alone is alert-worthy at most), and what it must never do (call
a checkpoint a deadlock, let one rank's lease excuse another rank's frozen step).

The realistic situations (saves local and remote, evals, warm-ups, stragglers, suspends, capped nodes,
every kind of hang) are the scenario corpus: tests/watchdog/test_verdict_corpus.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gpu_triage.model.states import GpuState, Verdict
from gpu_triage.verdicts.detector import Detector, DetectorConfig, GpuView, JobView, RankView

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


def test_frozen_steps_without_gpu_telemetry_are_stalled_never_hung():
    """--source none, no phase disagreement: frozen steps are the absence of progress - an alert."""
    out = drive(Job(), hang_at(300), 700, telemetry=False)
    assert first(out, Verdict.DEADLOCK_SUSPECTED) is None
    t_s, onset = first(out, Verdict.STALLED)
    assert onset <= 300 and t_s - onset <= DetectorConfig().stall_min_s + 2


def test_hang_without_progress_files_is_stalled_within_3_min_and_kill_worthy_only_when_allowed():
    out = drive(Job(progress=False), hang_at(300), 800)
    assert first(out, Verdict.DEADLOCK_SUSPECTED) is None
    t_s, onset = first(out, Verdict.STALLED)
    assert onset == 300 and t_s - onset <= 180
    armed = drive(Job(progress=False), hang_at(300), 800, cfg=DetectorConfig(power_only_can_kill=True))
    t_k, onset_k = first(armed, Verdict.DEADLOCK_SUSPECTED)
    assert onset_k == 300 and t_k - onset_k <= 180


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
    # The epoch_end ranks' lease is the disagreement itself, not evidence against the hang: `against`
    # is empty, as the runbook says of a deadlock verdict (the lease is kept as context).
    job, det = Job(), Detector(DetectorConfig())
    for t in range(0, 260):
        script(float(t), job)
        gpus, jobs = job.views()
        (status,) = det.update(float(t), gpus, jobs)
    assert status.verdict in (Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED)
    assert status.evidence_dict()["against"] == [], status.evidence_dict()["findings"]
    lease = [x for x in status.evidence_dict()["findings"] if x["signal"] == "live_lease"]
    assert lease and lease[0]["stance"] == "context" and lease[0]["ranks"] == [0, 1, 2, 3]


def test_every_rank_outliving_its_epoch_end_lease_with_spinning_gpus_is_hung():
    def script(t: float, job: Job) -> None:
        if t < 100:
            job.advance(t)
            return
        job.phase = ["epoch_end"] * job.n
        job.lease = [100 + 30.0] * job.n  # announced once, never renewed: the ranks hang
        job.set_gpus(SPIN, t)

    out = drive(Job(), script, 300)
    assert not {v for t, v, _ in out if t < 130} & {Verdict.DEADLOCK_SUSPECTED}
    t_s, onset = first(out, Verdict.DEADLOCK_SUSPECTED)
    cfg = DetectorConfig()
    assert onset == 130 + cfg.lease_grace_s and t_s <= onset + 1


def test_an_overrun_lease_while_the_gpus_compute_is_slow_not_hung():
    def script(t: float, job: Job) -> None:
        if t < 100:
            job.advance(t)
            return
        job.phase = ["eval"] * job.n
        job.lease = [100 + 30.0] * job.n
        job.set_gpus(C, t)

    out = drive(Job(), script, 400)
    assert not {v for _, v, _ in out} & {Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED}
    assert first(out, Verdict.SLOW) is not None


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


def test_the_detector_section_of_the_config_file_is_the_detectors_own_config(tmp_path):
    """[detector] is read straight into the detector's DetectorConfig (no mirror): every key the file
    may set is one of its fields, and the derived ones come from [stacks], [daemon] and [cluster]."""
    from gpu_triage.daemon.config import detector_config, load_config, schema_keys

    keys = {k.split(".", 1)[1] for k in schema_keys() if k.startswith("detector.")}
    assert keys and keys <= {f.name for f in dataclasses.fields(DetectorConfig)}
    path = tmp_path / "c.toml"
    path.write_text(
        '[daemon]\nnode = "n7"\n[detector]\nk_fast = 2.5\n'
        "[stacks]\nfrozen_s = 33\n[cluster]\nstale_after_s = 9\n"
    )
    cfg = detector_config(load_config(path, {}))
    assert type(cfg) is DetectorConfig and cfg.k_fast == 2.5
    assert (cfg.stacks.frozen_s, cfg.fleet_node, cfg.fleet_stale_after_s) == (33.0, "n7", 9.0)
    assert keys.isdisjoint({"stacks", "fleet_node", "fleet_stale_after_s"})


# -- the verdict model ------------------------------------------------------------------------------


def ranks_view(
    n: int,
    *,
    step: int,
    changed: float,
    phase: str = "train",
    phase_since: float | None = None,
    previous: str | None = None,
    lease: float | None = None,
    status: str = "sleeping",
    writes: float = 0.0,
) -> tuple[RankView, ...]:
    return tuple(
        RankView(
            rank=r,
            pid=100 + r,
            gpu=r,
            alive=True,
            status=status,
            write_bytes_delta=writes if r == 0 else 0.0,
            step=step,
            phase=phase,
            lease_until=lease,
            step_changed_at=changed,
            phase_since=phase_since,
            previous_phase=previous,
            proven=True,
        )
        for r in range(n)
    )


def spin(n: int, since: float) -> list[GpuView]:
    return [GpuView(g, SPIN, since) for g in range(n)]


def learn(det: Detector, job: str = "ft", *, interval: float = 10.0, until: float = 100.0) -> None:
    """Feed ``det`` a job stepping every ``interval`` seconds up to ``until``."""
    t = 0.0
    while t <= until:
        step = int(t // interval)
        det.update(
            t,
            [GpuView(g, C, 0.0) for g in range(4)],
            [JobView(job, ranks_view(4, step=step, changed=step * interval), True, 4, "job")],
        )
        t += 1.0


def test_only_hung_verdicts_are_kill_worthy_and_the_evidence_says_why_not():
    det = Detector()
    learn(det)
    (hung,) = det.update(
        130, spin(4, 102), [JobView("ft", ranks_view(4, step=10, changed=100), True, 4, "job")]
    )
    assert hung.verdict is Verdict.DEADLOCK_SUSPECTED and hung.kill_worthy
    stances = {f["signal"]: f["stance"] for f in hung.evidence_dict()["findings"]}
    assert stances["steps_frozen"] == "hang" and stances["spin_band"] == "hang"
    det = Detector()
    learn(det)
    (stalled,) = det.update(
        200, [], [JobView("ft", ranks_view(4, step=10, changed=100), True, 4, "job")], telemetry_ok=False
    )
    assert stalled.verdict is Verdict.STALLED and not stalled.kill_worthy
    assert "telemetry" in stalled.evidence_dict()["not_kill_worthy_because"]


def test_frozen_time_starts_at_the_return_to_train_not_at_the_last_step():
    """Back from a 300 s save at t=400 with the step last changed at 100: not frozen for 300 s."""
    det = Detector()
    learn(det)
    ranks = ranks_view(4, step=10, changed=100, phase_since=400, previous="checkpoint")
    (s,) = det.update(410, spin(4, 398), [JobView("ft", ranks, True, 4, "job")])
    assert s.verdict is Verdict.HEALTHY and s.evidence_dict()["first_step"] == "after_lease"
    (s,) = det.update(430, spin(4, 398), [JobView("ft", ranks, True, 4, "job")])
    assert s.verdict is Verdict.DEADLOCK_SUSPECTED  # 30 s into the first step, every GPU spinning


def test_unseen_ranks_need_job_wide_leases_before_spin_and_frozen_steps_prove_a_hang():
    for scope, expected in (("rank", Verdict.STALLED), ("job", Verdict.DEADLOCK_SUSPECTED)):
        det = Detector()
        t = 0.0
        while t <= 100:
            step = int(t // 10)
            job = JobView("ft", ranks_view(4, step=step, changed=step * 10.0), True, 8, scope)
            det.update(t, [GpuView(g, C, 0.0) for g in range(4)], [job])
            t += 1.0
        job = JobView("ft", ranks_view(4, step=10, changed=100), True, 8, scope)
        verdicts = [det.update(t, spin(4, 101), [job])[0].verdict for t in range(101, 160)]
        assert expected in verdicts and not ({*verdicts} - {Verdict.HEALTHY, expected}), (scope, verdicts)


def test_writes_and_d_state_veto_a_hang_and_a_stopped_rank_is_suspended():
    det = Detector()
    learn(det)
    job = JobView("ft", ranks_view(4, step=10, changed=100, writes=50e6), True, 4, "job")
    assert det.update(150, spin(4, 101), [job])[0].verdict is not Verdict.DEADLOCK_SUSPECTED
    det = Detector()
    learn(det)
    job = JobView("ft", ranks_view(4, step=10, changed=100, status="disk-sleep"), True, 4, "job")
    (s,) = det.update(250, spin(4, 101), [job])
    assert not s.kill_worthy
    det = Detector()
    learn(det)
    job = JobView("ft", ranks_view(4, step=10, changed=100, status="stopped"), True, 4, "job")
    (s,) = det.update(250, spin(4, 101), [job])
    assert s.verdict is Verdict.SUSPENDED and not s.kill_worthy
    # resumed: the frozen clock restarts, the spinning GPUs do not make it a hang at once
    job = JobView("ft", ranks_view(4, step=10, changed=100), True, 4, "job")
    assert det.update(251, spin(4, 101), [job])[0].verdict is Verdict.HEALTHY


def test_a_job_on_no_gpu_never_borrows_another_jobs_gpus():
    det = Detector()
    a = JobView("a", ranks_view(4, step=1, changed=0), True, 4, "job")
    b_ranks = tuple(replace_gpu(r) for r in ranks_view(4, step=1, changed=0))
    b = JobView("b", b_ranks, True, 4, "job")
    _, sb = det.update(10, spin(4, 0), [a, b])
    ev = sb.evidence_dict()
    assert ev["gpus"] == [] and "gpus_unmapped" in {f["signal"] for f in ev["findings"]}
    (alone,) = Detector().update(10, spin(4, 0), [b])
    assert alone.evidence_dict()["gpus_inferred"] is True  # the only job, no GPU claimed: inferred, flagged


def replace_gpu(r: RankView) -> RankView:
    from dataclasses import replace

    return replace(r, gpu=None)


def test_step_timing_rises_at_once_and_comes_down_slowly():
    from gpu_triage.verdicts.settings import DetectorConfig
    from gpu_triage.verdicts.step_timing import FirstStep, StepTiming

    t = StepTiming(DetectorConfig(default_step_interval_s=60.0, first_step_default_s=600.0).timing())
    assert t.interval_s() == 60.0 and not t.learned()
    t.observe_interval(10.0)
    assert t.interval_s() == 10.0
    t.observe_interval(20.0)  # a straggler: at once
    assert t.interval_s() == 20.0
    t.observe_interval(10.0)  # one fast step: slowly
    assert 18.0 < t.interval_s() < 20.0
    assert t.first_step_budget_s(FirstStep.AFTER_START) == 600.0
    t.observe_first_step(FirstStep.AFTER_START, 400.0)
    assert t.first_step_budget_s(FirstStep.AFTER_START) == 800.0
    assert t.first_step_budget_s(FirstStep.AFTER_LEASE) == 2.5 * t.interval_s()


# -- how a job ended: done, gone, killed (never healthy, never a new stall) ---------------------------


def _ranks(phase: str, alive: bool | None, *, lease_until: float | None = None, step: int = 40):
    return tuple(
        RankView(
            rank=r,
            pid=1000 + r,
            gpu=r,
            alive=alive,
            status="sleeping" if alive else None,
            step=step,
            phase=phase,
            lease_until=lease_until,
            step_changed_at=0.0,
            phase_since=0.0,
            proven=True,
        )
        for r in range(2)
    )


def _judge(ranks, *, signalled: frozenset[int] = frozenset(), now: float = 100.0):
    gpus = [GpuView(g, GpuState.IDLE, 0.0) for g in range(2)]
    job = JobView("j", ranks, has_progress=True, world_size=2, signalled_pids=signalled)
    (status,) = Detector(DetectorConfig()).update(now, gpus, [job])
    return status


def test_a_job_that_announced_done_reads_done_while_its_lease_holds_and_after_it_exits():
    assert _judge(_ranks("done", True, lease_until=130.0)).verdict is Verdict.DONE
    assert _judge(_ranks("done", False)).verdict is Verdict.DONE
    # still running long past its `done` lease: the usual after_done stall, not "done"
    late = _judge(_ranks("done", True, lease_until=10.0), now=400.0)
    assert late.verdict not in (Verdict.DONE, Verdict.HEALTHY)


def test_a_job_whose_ranks_all_exited_reads_gone_and_is_never_kill_worthy():
    status = _judge(_ranks("train", False))
    assert status.verdict is Verdict.GONE and not status.kill_worthy and status.cause == "exited"
    # one rank still running: not gone
    mixed = (*_ranks("train", False)[:1], *_ranks("train", True)[1:])
    assert _judge(mixed).verdict is not Verdict.GONE


def test_ranks_the_daemon_signalled_read_killed_from_the_sigterm_on_and_a_relaunch_does_not():
    pids = frozenset({1000, 1001})
    dying = _judge(_ranks("train", True), signalled=pids)
    assert dying.verdict is Verdict.KILLED and not dying.kill_worthy
    assert _judge(_ranks("train", False), signalled=pids).verdict is Verdict.KILLED
    # the same job name relaunched: new pids, judged afresh
    assert _judge(_ranks("train", True), signalled=frozenset({7, 8})).verdict is Verdict.HEALTHY


# -- issue 19: slow that never ends, jobs that cannot be judged ----------------------------------

COMM = GpuState.COMMUNICATION


def _frozen_from(t0: float, gpus: Callable[[float, Job], None]):
    def script(t: float, job: Job) -> None:
        if t < t0:
            job.advance(t)
            job.set_gpus(C, t)
        else:
            gpus(t, job)

    return script


def test_a_busy_loop_beside_spinning_gpus_is_stalled_not_slow():
    """Rank 3 computes forever, the others spin, steps frozen: not slowness (before: slow forever)."""

    def gpus(t: float, job: Job) -> None:
        job.set_gpus(SPIN, t)
        job.set_gpus(C, t, [3])

    out = drive(Job(), _frozen_from(100, gpus), 600)
    assert Verdict.SLOW not in {v for _, v, _ in out}
    assert out[-1][1] is Verdict.STALLED


def test_a_spin_on_the_communication_band_edge_is_stalled_not_slow():
    def gpus(t: float, job: Job) -> None:
        job.set_gpus(COMM, t, range(0, 8, 2))
        job.set_gpus(SPIN, t, range(1, 8, 2))

    out = drive(Job(), _frozen_from(100, gpus), 600)
    assert Verdict.SLOW not in {v for _, v, _ in out}
    assert out[-1][1] is Verdict.STALLED


def test_slow_escalates_to_stalled_after_slow_max_budgets_and_never_to_a_hang():
    cfg = DetectorConfig(slow_max_budgets=4.0)
    out = drive(Job(), _frozen_from(100, lambda t, job: job.set_gpus(C, t)), 600, cfg=cfg)
    slow, stalled = first(out, Verdict.SLOW), first(out, Verdict.STALLED)
    assert slow is not None and stalled is not None
    budget = max(cfg.stall_min_s, cfg.k_stall * 1.0)  # 1 s steps learned
    assert stalled[0] >= 99 + cfg.slow_max_budgets * budget > slow[0]  # last step at 99 s
    assert not {v for _, v, _ in out} & {Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED}


def test_no_progress_files_and_no_gpu_of_its_own_cannot_be_judged():
    """Ranks tied to no GPU (a container without host PIDs), no progress files, no stacks: the
    daemon says what it cannot judge and why, never healthy."""
    det = Detector()
    ranks = tuple(RankView(rank=r, pid=2000 + r, alive=True, status="sleeping") for r in range(2))
    jobs = [JobView("a", ranks, has_progress=False), JobView("b", ranks, has_progress=False)]
    gpus = [GpuView(g, C, 0.0) for g in range(4)]
    for t in range(0, 40):
        out = det.update(float(t), gpus, jobs)
        if t < DetectorConfig().stacks.fresh_s:  # a grace: the sampler's first dumps may be pending
            assert {st.verdict for st in out} == {Verdict.HEALTHY}
    for status in out:
        assert status.verdict is Verdict.CANNOT_JUDGE and not status.kill_worthy
        assert status.cause is not None and "no rank is tied to a GPU" in status.cause
        assert status.evidence_dict()["gpus_unknown"] is True
        assert {x["what"] for x in status.evidence_dict()["cannot_judge"]} == {"steps", "power", "stacks"}


def test_progress_only_jobs_with_unknown_gpus_say_their_gpus_are_unknown():
    """Two jobs with progress files whose ranks no GPU names (containers without host PIDs): judged
    on their steps, and their status says the GPUs are unknown instead of naming none silently."""
    det = Detector()
    jobs = [
        JobView(
            name,
            tuple(
                RankView(rank=r, pid=pid + r, alive=True, step=5, phase="train", step_changed_at=0.0)
                for r in range(2)
            ),
            has_progress=True,
        )
        for name, pid in (("p", 2000), ("q", 3000))
    ]
    for status in det.update(1.0, [GpuView(g, C, 0.0) for g in range(4)], jobs):
        assert status.verdict is Verdict.HEALTHY
        assert status.evidence_dict()["gpus"] == [] and status.evidence_dict()["gpus_unknown"] is True
        assert [x["what"] for x in status.evidence_dict()["cannot_judge"]] == ["power", "stacks"]


def test_gpus_held_idle_without_progress_files_cannot_be_judged_never_a_kill():
    cfg = DetectorConfig()

    def script(t: float, job: Job) -> None:
        job.set_gpus(C if t < 100 else IDLE, t)

    out = drive(Job(progress=False), script, 100 + cfg.idle_held_after_s + 30)
    assert {v for t, v, _ in out if t < 100 + cfg.idle_held_after_s} == {Verdict.HEALTHY}
    t_s, onset = first(out, Verdict.CANNOT_JUDGE)
    assert t_s == 100 + cfg.idle_held_after_s and onset == 100
    assert not {v for _, v, _ in out} & {Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED}


def test_a_restored_detector_continues_the_episode_where_the_previous_one_was():
    """Detector.export/restore (a restarted daemon): the suspicion keeps its clock toward confirmation,
    the onset stays, the learned interval stays - no healthy in between."""
    job, script = Job(), hang_at(300)
    det = Detector()
    t = 0.0
    while t <= 340:  # suspected at ~315
        script(t, job)
        gpus, jobs = job.views()
        (status,) = det.update(t, gpus, jobs)
        t += 1.0
    assert status.verdict is Verdict.DEADLOCK_SUSPECTED
    onset = status.onset
    saved = det.export()
    assert saved["ft"]["verdict"] == "deadlock_suspected" and saved["ft"]["interval_s"] is not None
    again = Detector()
    assert again.restore(json_roundtrip(saved)) == 1
    seen = []
    while t <= 460:
        script(t, job)
        gpus, jobs = job.views()
        (status,) = again.update(t, gpus, jobs)
        seen.append((t, status.verdict, status.onset))
        t += 1.0
    assert {v for _, v, _ in seen} <= {Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED}
    confirmed = next(t for t, v, _ in seen if v is Verdict.DEADLOCK_CONFIRMED)
    assert confirmed <= 315 + DetectorConfig().confirm_after_s + 2  # the clock did not restart
    assert {o for _, _, o in seen} == {onset}
    assert again.restore({"ft": {"verdict": "nonsense"}, "x": "junk"}) == 0  # bad entries skipped


def json_roundtrip(value):
    import json

    return json.loads(json.dumps(value))
