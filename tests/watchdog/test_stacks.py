"""Stack evidence: py-spy dumps classified (real dumps of the plain DeepSpeed job's epoch-end deadlock,
and dumps shaped like py-spy's for saves, eval, data waits), the ranks compared, the detector's K6 and
stack-in-save rules, and the sampler running the real py-spy against a real process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_triage.model.findings import Signal
from gpu_triage.model.states import Verdict
from gpu_triage.signals.stacks.config import StacksConfig
from gpu_triage.signals.stacks.dumps import (
    RankStack,
    StackError,
    StackPhase,
    StackSummary,
    classify,
    parse_dump,
    stack_pattern,
)
from gpu_triage.signals.stacks.sampler import DumpResult, StackSampler, find_py_spy
from gpu_triage.verdicts.detector import Detector
from gpu_triage.verdicts.views import JobView, RankView
from tests.conftest import in_ci

DUMPS = Path(__file__).parent / "stack_dumps"
SP = "/venv/lib/python3.11/site-packages/"


def dump(*frames: tuple[str, str, int], thread: str = "MainThread") -> str:
    """A py-spy ``dump --json`` document with one thread, innermost frame first."""
    return json.dumps(
        [
            {
                "pid": 1,
                "thread_id": 1,
                "thread_name": thread,
                "os_thread_id": 1,
                "active": False,
                "owns_gil": False,
                "frames": [
                    {
                        "name": n,
                        "filename": f,
                        "module": None,
                        "short_filename": f,
                        "line": ln,
                        "locals": None,
                    }
                    for n, f, ln in frames
                ],
            }
        ]
    )


USER = ("main", "/home/u/train.py", 40)


def test_real_deadlock_dumps_name_the_collective_and_the_call_site():
    r0 = classify(parse_dump((DUMPS / "deepspeed_epoch_end_rank0_barrier.json").read_bytes()))
    r1 = classify(parse_dump((DUMPS / "deepspeed_epoch_end_rank1_reduce_scatter.json").read_bytes()))
    assert (r0.phase, r0.op) == (StackPhase.COLLECTIVE, "barrier")
    assert r0.call_site is not None and r0.call_site.endswith("plain_deepspeed.py:80 main")
    assert (r1.phase, r1.op) == (StackPhase.COLLECTIVE, "reduce_scatter_tensor")
    assert r1.call_site is not None and "plain_deepspeed.py" in r1.call_site
    assert r0.fingerprint != r1.fingerprint


def test_a_save_wins_over_its_barrier_and_eval_over_its_gather():
    waiting = classify(
        parse_dump(
            dump(
                ("barrier", SP + "torch/distributed/distributed_c10d.py", 5356),
                ("barrier", SP + "deepspeed/comm/comm.py", 400),
                ("DeepSpeedEngine.save_checkpoint", SP + "deepspeed/runtime/engine.py", 4966),
                USER,
            )
        )
    )
    assert (waiting.phase, waiting.op) == (StackPhase.CHECKPOINT, "DeepSpeedEngine.save_checkpoint")
    hf = classify(
        parse_dump(
            dump(
                ("save_file", SP + "safetensors/torch.py", 286),
                ("Trainer._save_checkpoint", SP + "transformers/trainer.py", 3100),
                ("Trainer._inner_training_loop", SP + "transformers/trainer.py", 2500),
                USER,
            )
        )
    )
    assert hf.phase is StackPhase.CHECKPOINT
    ev = classify(
        parse_dump(
            dump(
                ("all_gather", SP + "torch/distributed/distributed_c10d.py", 3000),
                ("Trainer.evaluation_loop", SP + "transformers/trainer.py", 4100),
                USER,
            )
        )
    )
    assert ev.phase is StackPhase.EVAL
    data = classify(
        parse_dump(
            dump(
                ("_MultiProcessingDataLoaderIter._get_data", SP + "torch/utils/data/dataloader.py", 1100),
                ("_BaseDataLoaderIter.__next__", SP + "torch/utils/data/dataloader.py", 700),
                USER,
            )
        )
    )
    assert (data.phase, data.op) == (StackPhase.DATA, "DataLoader")
    bwd = classify(parse_dump(dump(("_engine_run_backward", SP + "torch/autograd/graph.py", 825), USER)))
    assert bwd.phase is StackPhase.BACKWARD
    assert classify(parse_dump(dump(USER))).phase is StackPhase.OTHER


def test_another_thread_in_a_collective_counts_when_the_main_thread_only_waits():
    doc = json.loads(dump(("Event.wait", "/usr/lib/python3.11/threading.py", 600), USER))
    doc += json.loads(
        dump(
            ("all_reduce", SP + "torch/distributed/distributed_c10d.py", 2000),
            ("run", "/x/w.py", 3),
            thread="w",
        )
    )
    assert classify(parse_dump(json.dumps(doc))).phase is StackPhase.COLLECTIVE


@pytest.mark.parametrize(
    "data, message",
    [
        (b"not json", "not JSON"),
        (b'{"frames": []}', "expected a list"),
        (b'[{"thread_name": "x"}]', "no 'frames' list"),
        (b"[" + b" " * (5 << 20) + b"]", "more than"),
    ],
)
def test_hostile_dumps_are_refused_with_a_reason(data: bytes, message: str):
    with pytest.raises(StackError, match=message):
        parse_dump(data)


def _rank(rank: int, frames, at: float, since: float, samples: int) -> RankStack:
    return RankStack(rank, 100 + rank, classify(parse_dump(dump(*frames))), at, since, samples)


ALLREDUCE = (("all_reduce", SP + "torch/distributed/distributed_c10d.py", 2000), USER)
BARRIER = (("barrier", SP + "torch/distributed/distributed_c10d.py", 5356), ("main", "/home/u/train.py", 90))
SAVING = (("DeepSpeedEngine.save_checkpoint", SP + "deepspeed/runtime/engine.py", 4966), USER)


def test_pattern_names_the_minority_waiting_elsewhere():
    ranks = {r: _rank(r, ALLREDUCE, 100.0, 50.0, 6) for r in (0, 1, 2)}
    ranks[3] = _rank(3, BARRIER, 100.0, 50.0, 6)
    p = stack_pattern(ranks, now=101.0, fresh_s=30.0, frozen_s=30.0)
    assert p.all_frozen_in_collective and p.different and p.odd == (3,)
    assert p.frozen_since == 50.0


def test_the_pattern_is_made_again_only_when_the_fresh_stacks_change():
    """Issue 30: the detector asked for the pattern of the same stacks every process period (a fifth of
    its CPU); the same fresh stacks now give the very same pattern until a dump arrives or one ages out."""
    ranks = {r: _rank(r, ALLREDUCE, 100.0, 50.0, 6) for r in (0, 1, 2)}
    first = stack_pattern(ranks, now=101.0, fresh_s=30.0, frozen_s=30.0)
    assert stack_pattern(dict(ranks), now=110.0, fresh_s=30.0, frozen_s=30.0) is first
    ranks[2] = _rank(2, BARRIER, 112.0, 112.0, 1)  # a new dump of rank 2
    moved = stack_pattern(ranks, now=112.0, fresh_s=30.0, frozen_s=30.0)
    assert moved is not first and moved.odd == (2,) and moved.frozen == (0, 1)
    aged = stack_pattern(ranks, now=131.0, fresh_s=30.0, frozen_s=30.0)  # ranks 0 and 1 too old now
    assert aged.sampled == (2,) and aged.frozen == () and not aged.different
    assert stack_pattern(ranks, now=112.0, fresh_s=30.0, frozen_s=10.0).frozen == (0, 1)


def _job(stacks: StackSummary | None, cpu: float = 0.0, world: int | None = None) -> JobView:
    ranks = tuple(
        RankView(rank=r, pid=100 + r, alive=True, status="sleeping", cpu_ratio=cpu, proven=True)
        for r in (0, 1)
    )
    return JobView("plain", ranks, has_progress=False, world_size=world, stacks=stacks)


def _summary(frames0, frames1, now: float, since: float, world: int = 2) -> StackSummary:
    n = max(1, int((now - since) // 3) + 1)
    return StackSummary({0: _rank(0, frames0, now, since, n), 1: _rank(1, frames1, now, since, n)}, world)


def _drive(make, until: float, cpu: float = 0.0):
    det = Detector()
    out = []
    for t in range(0, int(until) + 1):
        st = det.update(float(t), [], [_job(make(float(t)), cpu=cpu)], telemetry_ok=False)[0]
        out.append((t, st))
    return out


def test_every_rank_frozen_in_collectives_and_asleep_is_kill_worthy_from_stacks_alone():
    out = _drive(lambda t: _summary(BARRIER, ALLREDUCE, t, 0.0), 60)
    hung = [(t, s) for t, s in out if s.kill_worthy]
    assert hung, [s.verdict for _, s in out]
    t, st = hung[0]
    assert 20 <= t <= 25 and st.verdict is Verdict.DEADLOCK_SUSPECTED
    signals = st.evidence_dict()["signals"]
    assert str(Signal.STACKS_FROZEN) in signals and str(Signal.RANKS_ASLEEP) in signals
    assert str(Signal.STACKS_DIVERGED) in signals  # barrier vs all_reduce at another call site
    assert "rank 0: collective barrier @" in st.evidence_dict()["stacks_where"]


def test_frozen_stacks_with_busy_host_threads_are_stalled_never_kill_worthy():
    out = _drive(lambda t: _summary(ALLREDUCE, ALLREDUCE, t, 0.0), 90, cpu=1.0)
    assert not any(s.kill_worthy for _, s in out)
    assert out[-1][1].verdict is Verdict.STALLED
    assert out[-1][1].cause.startswith("stacks_frozen:")


def test_a_rank_inside_a_save_is_checkpoint_and_a_cap_makes_it_stalled_checkpoint():
    out = _drive(lambda t: _summary(SAVING, BARRIER, t, 0.0), 1900)
    assert not any(
        s.kill_worthy or s.verdict in (Verdict.DEADLOCK_SUSPECTED, Verdict.DEADLOCK_CONFIRMED) for _, s in out
    )
    assert out[100][1].verdict is Verdict.CHECKPOINT
    assert out[-1][1].verdict is Verdict.STALLED_CHECKPOINT


def test_ranks_of_the_world_not_seen_here_keep_frozen_stacks_from_being_proof():
    def make(t: float) -> StackSummary:
        s = _summary(BARRIER, BARRIER, t, 0.0, world=4)
        return s

    out = _drive(make, 90)
    assert not any(s.kill_worthy for _, s in out)
    assert out[-1][1].verdict is Verdict.STALLED
    assert "other node" in out[-1][1].evidence_dict()["not_kill_worthy_because"]


def _real(name: str):
    return parse_dump((DUMPS / name).read_bytes())


def _real_rank(rank: int, name: str, at: float, since: float) -> RankStack:
    return RankStack(rank, 100 + rank, classify(_real(name)), at, since, max(1, int((at - since) // 3) + 1))


def test_real_dumps_of_the_reference_failure_show_a_phase_collective_beside_a_step():
    """Dumps taken by py-spy of tests/jobs/plain_deepspeed.py save_deadlock and plain_hf.py eval_deadlock."""
    save = classify(_real("deepspeed_save_deadlock_rank0_in_save_barrier.json"))
    step = classify(_real("deepspeed_save_deadlock_rank1_reduce_scatter.json"))
    assert (save.phase, save.collective) == (StackPhase.CHECKPOINT, "barrier")
    assert (step.phase, step.collective) == (StackPhase.COLLECTIVE, "reduce_scatter_tensor")
    ev = classify(_real("hf_eval_deadlock_rank0_in_eval_all_gather.json"))
    bwd = classify(_real("hf_eval_deadlock_rank1_backward.json"))
    assert (ev.phase, ev.collective) == (StackPhase.EVAL, "all_gather")
    assert (bwd.phase, bwd.collective) == (StackPhase.BACKWARD, None)
    # a writer inside its save waits in no collective
    assert classify(parse_dump(dump(*SAVING))).collective is None


@pytest.mark.parametrize(
    "phase_dump, step_dump",
    [
        (
            "deepspeed_save_deadlock_rank0_in_save_barrier.json",
            "deepspeed_save_deadlock_rank1_reduce_scatter.json",
        ),
        ("hf_eval_deadlock_rank0_in_eval_all_gather.json", "hf_eval_deadlock_rank1_backward.json"),
    ],
)
def test_a_save_or_eval_collective_beside_a_frozen_step_is_kill_worthy_k6_split(phase_dump, step_dump):
    def make(t: float) -> StackSummary:
        return StackSummary({0: _real_rank(0, phase_dump, t, 0.0), 1: _real_rank(1, step_dump, t, 0.0)}, 2)

    out = _drive(make, 60)
    hung = [(t, s) for t, s in out if s.kill_worthy]
    assert hung, [(t, str(s.verdict)) for t, s in out[::10]]
    t, st = hung[0]
    assert 20 <= t <= 25 and st.verdict is Verdict.DEADLOCK_SUSPECTED
    signals = st.evidence_dict()["signals"]
    assert str(Signal.STACKS_PHASE_SPLIT) in signals and str(Signal.RANKS_ASLEEP) in signals
    stacks = st.evidence_dict()["stacks"]
    assert stacks["split_ranks"] == [0] and stacks["step_ranks"] == [1]
    assert not any(s.verdict in (Verdict.CHECKPOINT, Verdict.STALLED_CHECKPOINT) for _, s in out[20:])
    assert str(Signal.STACK_IN_SAVE) not in st.evidence_dict()["against"]


WAIT_IN_SAVE = (
    ("barrier", SP + "torch/distributed/distributed_c10d.py", 5356),
    ("barrier", SP + "deepspeed/comm/comm.py", 400),
    ("DeepSpeedEngine.save_checkpoint", SP + "deepspeed/runtime/engine.py", 4966),
    USER,
)


def test_a_save_where_every_rank_sits_is_a_save_not_a_split():
    # rank 0 writes (its stack moves), rank 1 waits in the save's barrier: checkpoint, for as long as it takes
    def writing(t: float) -> StackSummary:
        w = RankStack(0, 100, classify(parse_dump(dump(*SAVING))), t, t, 1)  # a new line every dump
        return StackSummary({0: w, 1: _rank(1, WAIT_IN_SAVE, t, 0.0, max(1, int(t // 3) + 1))}, 2)

    out = _drive(writing, 600)
    assert {s.verdict for _, s in out[30:]} == {Verdict.CHECKPOINT}
    # every rank waiting inside the save's collectives (a writer on another node): still a save
    out = _drive(lambda t: _summary(WAIT_IN_SAVE, WAIT_IN_SAVE, t, 0.0), 300)
    assert not any(s.kill_worthy for _, s in out) and out[-1][1].verdict is Verdict.CHECKPOINT


def test_a_split_with_busy_host_threads_or_unseen_ranks_is_stalled_never_kill_worthy():
    out = _drive(lambda t: _summary(WAIT_IN_SAVE, ALLREDUCE, t, 0.0), 120, cpu=1.0)
    assert not any(s.kill_worthy for _, s in out)
    assert out[-1][1].verdict is Verdict.STALLED and out[-1][1].cause.startswith("stacks_split:")
    out = _drive(lambda t: _summary(WAIT_IN_SAVE, ALLREDUCE, t, 0.0, world=4), 120)
    assert not any(s.kill_worthy for _, s in out)
    assert out[-1][1].verdict is Verdict.STALLED


# -- the sampler ---------------------------------------------------------------------------------


def _py_spy() -> str:
    found = find_py_spy("auto")
    if found is None:
        if in_ci():
            pytest.fail("py-spy is missing (the [daemon] extra installs it)")
        pytest.skip("py-spy is not installed")
    return found


def test_sampler_dumps_a_real_process_and_reports_its_cost(tmp_path: Path):
    _py_spy()
    script = tmp_path / "sleeper.py"
    script.write_text("import time\n\ndef wait_here():\n    time.sleep(600)\n\nwait_here()\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(0.5)
        sampler = StackSampler(StacksConfig(healthy_interval_s=60.0))
        assert sampler.request(0.0, "j", {0: proc.pid})
        assert sampler.wait_idle(30)
        assert not sampler.request(1.0, "j", {0: proc.pid})  # not due yet
        summary = sampler.summary("j")
        assert summary is not None and 0 in summary.ranks, summary
        info = summary.ranks[0].info
        assert info.phase is StackPhase.OTHER and "wait_here" in " ".join(info.top)
        status = sampler.status()
        assert status["state"] == "available" and status["dumps_total"] == 1
        assert status["failures_total"] == 0 and status["cpu_s_last_min"] >= 0.0
        sampler.close()
    finally:
        proc.kill()
        proc.wait()


def test_a_missing_py_spy_is_reported_and_sampling_carries_on_without_it(tmp_path: Path):
    sampler = StackSampler(StacksConfig(py_spy=str(tmp_path / "no-such-py-spy")))
    assert sampler.status()["state"] == "py_spy_missing"
    assert not sampler.request(0.0, "j", {0: 1})
    assert sampler.summary("j") is None


def test_denied_ptrace_is_reported_and_stops_sampling():
    denied = DumpResult(1, b"", "Error: Permission denied (os error 13)\n", 0.001, 0.01)
    sampler = StackSampler(StacksConfig(), runner=lambda _b, _pid: denied)
    assert sampler.request(0.0, "j", {0: 10, 1: 11})
    assert sampler.wait_idle(10)
    st = sampler.status()
    assert st["state"] == "ptrace_denied" and "Permission denied" in st["detail"]
    assert not sampler.request(100.0, "j", {0: 10, 1: 11})


def test_the_budget_holds_back_dumps_and_counts_them():
    ok = DumpResult(0, dump(*ALLREDUCE).encode(), "", 2.0, 0.01)
    sampler = StackSampler(StacksConfig(budget_cpu_s_per_min=3.0), runner=lambda _b, _pid: ok)
    assert sampler.request(0.0, "j", {0: 10}, blind=True)
    assert sampler.wait_idle(10)
    # no progress files and a rank in a collective: suspicious, due after 3 s; 2 CPU-s spent of 3:
    # one more urgent dump fits, then the budget holds the next back
    assert sampler.request(3.0, "j", {0: 10}, blind=True)
    assert sampler.wait_idle(10)
    assert not sampler.request(6.0, "j", {0: 10}, blind=True)
    assert sampler.status()["skipped_budget_total"] == 1
    # a job whose steps advance is dumped on the healthy schedule whatever its last stack said
    assert not sampler.request(70.0, "k", {}, blind=False)
    calm = StackSampler(StacksConfig(budget_cpu_s_per_min=30.0), runner=lambda _b, _pid: ok)
    assert calm.request(0.0, "k", {0: 10})
    assert calm.wait_idle(10)
    assert not calm.request(3.0, "k", {0: 10})
    assert not calm.request(59.0, "k", {0: 10})
    assert calm.request(60.0, "k", {0: 10})
    assert calm.wait_idle(10)
    assert calm.request(63.0, "k", {0: 10}, urgent=True)


def test_the_daemon_says_in_status_and_metrics_that_py_spy_is_missing_and_carries_on(tmp_path: Path):
    """A real sleeping rank (RANK in its environment) watched by the in-process daemon whose py-spy
    points at a missing path: /status and the metrics say so, the job is still seen and judged."""
    from gpu_triage.daemon.config import load_config, override
    from gpu_triage.daemon.loop import Daemon
    from gpu_triage.serving.api import status_document
    from gpu_triage.serving.metrics import snapshot_metrics
    from gpu_triage.telemetry.none import NoneSource

    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "GPU_WATCHDOG_JOB": f"spyless-{time.time_ns()}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={**env, "PATH": "/usr/bin"}
    )
    config = override(
        load_config(None, {}),
        {
            "daemon.state_dir": str(tmp_path / "state"),
            "progress.dir": str(tmp_path / "progress"),
            "stacks.py_spy": str(tmp_path / "no-such-py-spy"),
        },
        origin="test",
    )
    daemon = Daemon(config, NoneSource(), serve_http=False)
    daemon.start()
    try:
        time.sleep(0.3)
        snap = daemon.cycle(time.time())
        doc = status_document(snap)
        assert doc["stacks"]["state"] == "py_spy_missing"
        assert "no-such-py-spy" in doc["stacks"]["detail"]
        job = next(j for j in doc["jobs"] if j["job"] == env["GPU_WATCHDOG_JOB"])
        assert job["verdict"] == "healthy" and "stacks" not in job["evidence"]
        # no progress files, no GPU telemetry, no stacks: after a grace the daemon says it cannot judge
        assert {"what": "stacks", "why": "no fresh stack (none taken)"} in job["evidence"]["cannot_judge"]
        fams = {f.name: f for f in snapshot_metrics(snap)}
        sample = fams["gpu_watchdog_stack_sampler_available"].samples[0]
        assert sample.labels == {"state": "py_spy_missing"} and sample.value == 0.0
    finally:
        daemon.close()
        proc.kill()
        proc.wait()


def test_the_budget_also_stops_a_round_midway():
    ok = DumpResult(0, dump(*ALLREDUCE).encode(), "", 2.0, 0.01)
    seen: list[int] = []
    sampler = StackSampler(
        StacksConfig(budget_cpu_s_per_min=3.0), runner=lambda _b, pid: (seen.append(pid), ok)[1]
    )
    assert sampler.request(0.0, "j", {0: 10, 1: 11, 2: 12}, blind=True)
    assert sampler.wait_idle(10)
    assert seen == [10]  # 2 CPU-s spent, above half the budget: the round stops
    assert sampler.status()["skipped_budget_total"] == 1


def _fake_py_spy(tmp_path: Path, body: str) -> str:
    script = tmp_path / "py-spy"
    script.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_dump_starts_no_thread_and_keeps_its_output_errors_and_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: each dump started a timer thread and made a temporary file for py-spy's errors (~45 %
    of the sampler's own CPU a dump); the pipes are read with poll up to the deadline instead."""
    import threading

    from gpu_triage.signals.stacks import sampler as sampler_module

    started: list[str] = []
    real_start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    noisy = _fake_py_spy(
        tmp_path, "sys.stderr.write('w' * 200_000); sys.stderr.flush(); sys.stdout.write('[]')"
    )
    res = sampler_module.run_py_spy(noisy, 1, nonblocking=True, timeout_s=20.0)
    assert (res.rc, res.stdout, res.error, len(res.stderr)) == (0, b"[]", None, 8192)
    assert started == []  # no timer thread
    hung = _fake_py_spy(tmp_path, "sys.stdout.write('[partial'); sys.stdout.flush(); time.sleep(600)")
    t0 = time.monotonic()
    res = sampler_module.run_py_spy(hung, 1, nonblocking=True, timeout_s=0.5)
    assert res.rc == -9 and res.error == "py-spy killed after 0 s" and res.stdout == b"[partial"
    assert 0.5 <= time.monotonic() - t0 < 10.0
    monkeypatch.setattr(sampler_module, "MAX_OUTPUT_BYTES", 1000)
    flood = _fake_py_spy(tmp_path, "sys.stdout.write('x' * 1_000_000); time.sleep(600)")
    res = sampler_module.run_py_spy(flood, 1, nonblocking=True, timeout_s=20.0)
    assert len(res.stdout) == 1001 and res.rc == -9  # bounded; parse_dump refuses it as too large
