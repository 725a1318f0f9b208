"""Attribution on real processes: the daemon's reader, inspector, fusion, detector and action engine
(kill mode, dry run) against real ``sleep`` processes and real progress files, on an explicit clock.

:func:`forged_progress_file`: a real two-rank job deadlocks at epoch end (its ranks carry the rank
environment a launcher sets); a third progress file, forged into the job's directory, names an
unrelated ``setsid sleep`` (no rank environment, no GPU, another session). The job must be planned
for SIGTERM, the sleep never, and the forged file reported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ft_trainer.progress import ProgressWriter
from gpu_triage.actions.config import ActionsConfig
from gpu_triage.actions.engine import ActionEngine
from gpu_triage.actions.silences import SilenceBook
from gpu_triage.alerts.config import AlertsConfig
from gpu_triage.daemon.observe import progress_claims
from gpu_triage.journal.eventstore import EventStore
from gpu_triage.model.states import Mode
from gpu_triage.signals.processes import ProcessInspector
from gpu_triage.signals.progress import ProgressReader
from gpu_triage.verdicts.detector import Detector
from gpu_triage.verdicts.fusion import job_views
from tests.spawned import wait_for_exec

JOB = "victim-job"
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


@dataclass(frozen=True)
class ForgedOutcome:
    targets: list[int]
    """Pids the engine planned to SIGTERM."""
    ranks: list[int]
    bystander: int
    bystander_targeted: bool
    reported: bool
    """The forged file appears as untrusted in the process view / job evidence."""
    verdicts: list[str]


def _clean_env() -> dict[str, str]:
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPU_WATCHDOG_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("MASTER_")}


def spawn_rank(rank: int, world: int, job: str = JOB) -> subprocess.Popen:
    env = _clean_env() | {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}
    env["GPU_WATCHDOG_JOB"] = job
    return wait_for_exec(subprocess.Popen(SLEEP, env=env, start_new_session=True))


def spawn_bystander() -> subprocess.Popen:
    """An unrelated process in a session of its own: ``setsid`` execs in place (its child is not a
    group leader), so the pid is the sleeper's."""
    return wait_for_exec(subprocess.Popen(["setsid", *SLEEP], env=_clean_env()), marker=b"import time")


def forged_progress_file(duration_s: int = 260) -> ForgedOutcome:
    ranks = [spawn_rank(0, 3), spawn_rank(1, 3)]
    bystander = spawn_bystander()
    bystander_pid = bystander.pid
    host = os.uname().nodename
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-triage-live-") as tmp:
            root = Path(tmp)
            progress = root / "progress"
            t0 = time.time()
            clock = {"now": t0}

            def now_fn() -> float:
                return clock["now"]

            writers = [
                ProgressWriter(JOB, r, r, 3, directory=progress, clock=now_fn, pid=p.pid, host=host)
                for r, p in enumerate(ranks)
            ]
            forged = ProgressWriter(
                JOB, 2, 2, 3, directory=progress, clock=now_fn, pid=bystander_pid, host=host
            )
            reader = ProgressReader(progress, host=host)
            inspector = ProcessInspector()
            detector = Detector()
            store = EventStore(root / "state", t0)
            engine = ActionEngine(
                actions=ActionsConfig(mode=Mode.KILL, dry_run=True),
                alerts=AlertsConfig(),
                store=store,
                state_dir=root / "state",
                node=host,
                clock=now_fn,
                ras_address=("127.0.0.1", 9),
                py_spy=None,
                nvidia_smi=None,
            )
            targets: list[int] = []
            reported = False
            verdicts: list[str] = []
            try:
                for tick in range(duration_s):
                    now = t0 + tick
                    clock["now"] = now
                    for w in (*writers, forged):
                        if tick == 0:
                            w.phase("train")
                        if tick < 60 and tick % 10 == 0:
                            w.step(tick // 10)
                    if tick == 60:  # rank 0 reaches the epoch end; rank 1 (and the forgery) stay in train
                        writers[0].phase("epoch_end", lease_s=300)
                    view = reader.read(now)
                    pview = inspector.inspect(now, claims=progress_claims(view, host))
                    jobs = job_views(view.jobs, pview.jobs, untrusted=pview.untrusted)
                    reported = reported or any(u.pid == bystander_pid for u in pview.untrusted)
                    results = detector.update(now, [], jobs, telemetry_ok=False)
                    for j in results:
                        if j.job == JOB and (not verdicts or verdicts[-1] != str(j.verdict)):
                            verdicts.append(str(j.verdict))
                    records = engine.on_cycle(
                        now,
                        mode=Mode.KILL,
                        jobs=results,
                        processes=pview.jobs,
                        gpus=(),
                        silences=SilenceBook(),
                        progress_dir=progress,
                    )
                    for rec in records:
                        if rec["action"] == "sigterm" and rec["result"] == "started":
                            targets.extend(rec.get("pids") or ())
                    deadline = time.monotonic() + 5.0
                    while engine.busy and time.monotonic() < deadline:
                        time.sleep(0.001)
            finally:
                engine.close(timeout_s=2.0)
                store.close()
    finally:
        for p in (*ranks, bystander):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    return ForgedOutcome(
        targets=sorted(set(targets)),
        ranks=[p.pid for p in ranks],
        bystander=bystander_pid,
        bystander_targeted=bystander_pid in targets,
        reported=reported,
        verdicts=verdicts,
    )


__all__ = ["ForgedOutcome", "forged_progress_file", "spawn_bystander", "spawn_rank"]
