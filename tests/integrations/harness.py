"""Run a real 2-rank job (torchrun, gloo, CPU) beside the real daemon (in-process, ``--source none``,
stack sampling off, observe mode) and record what the daemon said about it, cycle by cycle: the
verdicts rest on the progress files and the processes alone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.model.snapshot import Snapshot
from gpu_triage.telemetry.none import NoneSource
from tests.conftest import REPO

EXAMPLES = REPO / "docs" / "examples"
JOBS = Path(__file__).parent / "jobs"


@dataclass(frozen=True)
class Seen:
    """One daemon cycle's view of the job."""

    time_s: float
    verdict: str
    kill_worthy: bool
    onset: float | None
    raised: float | None
    phases: dict[int, str]
    steps: dict[int, int | None]
    signals: tuple[str, ...]
    evidence: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass
class JobRun:
    returncode: int | None
    log: str
    timeline: list[Seen] = field(default_factory=list)
    progress_dir: Path | None = None

    def verdicts(self) -> list[str]:
        out: list[str] = []
        for s in self.timeline:
            if not out or out[-1] != s.verdict:
                out.append(s.verdict)
        return out

    def first(self, verdict: str) -> Seen | None:
        return next((s for s in self.timeline if s.verdict == verdict), None)

    def phases_seen(self) -> set[str]:
        return {p for s in self.timeline for p in s.phases.values()}

    def assert_epoch_end_deadlock_caught(self, label: str) -> Seen:
        """Rank 1 in a job-scoped ``epoch_end``, rank 0 frozen in ``train``: kill-worthy phase
        disagreement within 30 s, by the daemon's onset and by the test's own clock (the first cycle
        showing the split to the verdict)."""
        verdicts = self.verdicts()
        hung = self.first("deadlock_suspected")
        assert hung is not None, (verdicts, self.log)
        assert hung.kill_worthy and "phase_disagreement" in hung.signals, hung
        assert hung.phases == {0: "train", 1: "epoch_end"}, hung
        assert hung.onset is not None and hung.raised is not None
        assert hung.raised - hung.onset <= 30.0, hung
        split = next(s for s in self.timeline if s.phases == {0: "train", 1: "epoch_end"})
        assert hung.time_s - split.time_s <= 30.0
        print(f"{label}: onset -> deadlock_suspected {hung.raised - hung.onset:.1f} s; verdicts {verdicts}")
        return hung


def torchrun(script: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--standalone",
        str(script),
        *args,
    ]


def run_with_daemon(
    tmp_path: Path,
    cmd: Sequence[str],
    job: str,
    *,
    env: dict[str, str] | None = None,
    stop_when: Callable[[Seen], bool] | None = None,
    timeout_s: float = 240.0,
) -> JobRun:
    """Start the daemon, then the job; poll the daemon's snapshots every 0.2 s until the job exits,
    ``stop_when`` says so (then the job's process group is killed) or ``timeout_s`` passes."""
    progress = tmp_path / "progress"
    config = override(
        load_config(None, {}),
        {
            "daemon.listen": "127.0.0.1:0",
            "daemon.state_dir": str(tmp_path / "state"),
            "daemon.period_s": 0.2,
            "daemon.process_period_s": 0.2,
            "progress.dir": str(progress),
            "actions.mode": "observe",
            # what the progress files alone prove: no GPU telemetry (--source none), no stack samples
            "stacks.enabled": False,
        },
        origin="test",
    )
    daemon = Daemon(config, NoneSource(), serve_http=False)
    daemon.start()
    loop = threading.Thread(target=daemon.run_forever, daemon=True)
    loop.start()
    log_path = tmp_path / "job.log"
    run_env = {
        **os.environ,
        "GPU_WATCHDOG_PROGRESS_DIR": str(progress),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(EXAMPLES)]),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    timeline: list[Seen] = []
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(cmd), cwd=tmp_path, env=run_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + timeout_s
            last_cycle = -1
            while time.monotonic() < deadline:
                snap: Snapshot | None = daemon.snapshots.latest()
                if snap is not None and snap.cycle != last_cycle:
                    last_cycle = snap.cycle
                    for j in snap.jobs:
                        if j.job != job:
                            continue
                        seen = Seen(
                            snap.time,
                            str(j.verdict),
                            j.kill_worthy,
                            j.onset,
                            j.raised,
                            {r.rank: r.phase or "" for r in j.ranks},
                            {r.rank: r.step for r in j.ranks},
                            tuple(j.evidence.signals if j.evidence is not None else ()),
                            j.evidence_dict(),
                        )
                        timeline.append(seen)
                        if stop_when is not None and stop_when(seen):
                            deadline = 0.0
                if proc.poll() is not None:
                    time.sleep(0.6)  # the daemon's last look at the finished files
                    break
                time.sleep(0.1)
        finally:
            # torchrun's workers leave its process group: take the whole tree, or a deadlocked
            # job outlives the test (and later daemons on this machine would see it)
            try:
                tree = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                tree = []
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            for child in tree:
                with contextlib.suppress(psutil.Error):
                    child.kill()
            proc.wait(30)
            psutil.wait_procs(tree, timeout=10)
            daemon.stop()
            loop.join(15)
            daemon.close()
    return JobRun(proc.returncode, log_path.read_text(errors="replace")[-6000:], timeline, progress)
