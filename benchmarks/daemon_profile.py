"""Where the daemon's CPU goes: the daemon of ``python -m benchmarks daemon`` (16 simulated B300 at
10 Hz, 16 real ranks writing progress files) run in this process, its main parts timed with the
thread's CPU clock (``time.thread_time`` around each call: inclusive, ~1 us of overhead a call), and
each thread's CPU from ``/proc/self/task`` over the window::

    python -m benchmarks.daemon_profile [WINDOW_S]          # 60 s after a 12 s warm-up

Run it in a PID namespace of its own, as the bench runs its daemon (``unshare --fork --pid
--mount-proc --kill-child``): the environment scans then see the job's processes, not the machine's.
Nothing reads the snapshots (as in the bench), so the loop publishes them unbuilt. A profile of the
same shape as issue 30 asks (a 10-minute run): pass 600. ``PROFILE_EXTRA=1`` times more parts (the
cycle's small per-tick ones, every private method of the Observer and the Detector).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_triage.daemon.runner import settle_heap
from gpu_triage.signals.procfs import parse_stat

WARM_UP_S = 12.0


def _threads() -> dict[str, tuple[str, float]]:
    """Thread id -> (name, CPU seconds) of this process."""
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        st = parse_stat(data)  # the daemon's own stat parser (signals/procfs)
        if st is not None:
            out[tid] = (names.get(tid, tid), st.cpu_time_s)
    return out


def _timed(parts: dict[str, list[float]], cls: type, name: str) -> None:
    original: Callable[..., Any] = getattr(cls, name)
    label = f"{cls.__name__}.{name}"

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            entry = parts.setdefault(label, [0.0, 0.0])
            entry[0] += time.thread_time() - t0
            entry[1] += 1

    setattr(cls, name, wrapper)


def _extra_parts() -> list[tuple[type, str]]:
    """With ``PROFILE_EXTRA=1``: the cycle's small per-tick parts and every private method of the
    Observer and the Detector, timed too (each wrapper adds ~1-2 us a call: tiny parts look larger)."""
    if not os.environ.get("PROFILE_EXTRA"):
        return []
    from gpu_triage.daemon.health import HealthBook
    from gpu_triage.daemon.loop import Daemon
    from gpu_triage.daemon.observe import Observer, SignalSet
    from gpu_triage.daemon.record import Recorder
    from gpu_triage.journal.eventstore import EventStore
    from gpu_triage.model.clock import Timeline
    from gpu_triage.serving.control import QueuedControl
    from gpu_triage.serving.publish import SnapshotHolder
    from gpu_triage.signals.health.monitor import HealthMonitor
    from gpu_triage.verdicts.detector import Detector

    out: list[tuple[type, str]] = [
        (Daemon, "_tick"), (Daemon, "_snapshot_maker"), (SignalSet, "node_facts"),
        (HealthMonitor, "sample"), (Timeline, "check_step"), (QueuedControl, "drain"),
        (Recorder, "persist_silences"), (Recorder, "persist_episode_state"),
        (Recorder, "verdict_changes"), (HealthBook, "input_errors"), (SnapshotHolder, "publish_lazy"),
        (EventStore, "maybe_reattach"), (EventStore, "maybe_prune"),
    ]  # fmt: skip
    for cls in (Observer, Detector):
        for name, value in vars(cls).items():
            if name.startswith("_") and not name.startswith("__") and callable(value):
                out.append((cls, name))
    return out


def main(window_s: float) -> None:
    from gpu_triage.actions.engine import ActionEngine
    from gpu_triage.classify.tracker import GpuTracker
    from gpu_triage.daemon.config import load_config, override
    from gpu_triage.daemon.loop import Daemon
    from gpu_triage.daemon.observe import Observer, SignalSet
    from gpu_triage.demo import simjob
    from gpu_triage.signals.processes import ProcessInspector
    from gpu_triage.signals.progress import ProgressReader
    from gpu_triage.telemetry.sim import SimSource
    from gpu_triage.verdicts.detector import Detector

    parts: dict[str, list[float]] = {}
    for cls, name in [
        (Daemon, "_cycle"), (Daemon, "_detect"), (Daemon, "_node_facts"), (SimSource, "sample"),
        (GpuTracker, "update"), (GpuTracker, "status_inputs"), (Observer, "observe"),
        (ProcessInspector, "inspect"), (ProcessInspector, "_discover"), (ProcessInspector, "_measure"),
        (ProgressReader, "read"), (Detector, "update"), (SignalSet, "contribute"), (SignalSet, "status"),
        (ActionEngine, "on_cycle"), *_extra_parts(),
    ]:  # fmt: skip
        _timed(parts, cls, name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="gpuwd-profile-"))
    start = time.time() + 1.0
    config = override(
        load_config(None, {}),
        {"daemon.listen": f"127.0.0.1:{port}", "daemon.state_dir": str(tmp / "state"),
         "daemon.period_s": 0.1, "progress.dir": str(tmp / "progress")},
        origin="profile",
    )  # fmt: skip
    job = simjob.start(tmp / "progress", start, ranks=16, world_size=16)
    daemon = Daemon(config, SimSource("reference-b300", gpus=16, start_s=start, job_session=job.pid))
    daemon.start()
    settle_heap()  # as `gpu-watchdog run` does once it listens
    marks: dict[str, Any] = {}

    def window() -> None:
        time.sleep(WARM_UP_S)
        parts.clear()
        marks["t0"], marks["threads0"] = time.monotonic(), _threads()
        time.sleep(window_s)
        marks["t1"], marks["threads1"] = time.monotonic(), _threads()
        daemon.stop()

    threading.Thread(target=window, daemon=True).start()
    try:
        daemon.run_forever()
    finally:
        daemon.close()
        os.killpg(job.pid, signal.SIGKILL)
    wall = marks["t1"] - marks["t0"]
    before = marks["threads0"]
    used = {tid: cpu - before.get(tid, (name, 0.0))[1] for tid, (name, cpu) in marks["threads1"].items()}
    total = sum(used.values())
    print(f"daemon CPU over {wall:.0f} s: {100 * total / wall:.3f} % of one core")
    for tid, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
        if cpu > 0:
            print(f"  thread {marks['threads1'][tid][0]:24s} {100 * cpu / wall:7.3f} %")
    print("parts (inclusive; % of one core, share of the daemon's CPU, calls, us a call):")
    for label, (cpu, calls) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
        share = cpu / total if total else 0.0
        print(
            f"  {label:34s} {100 * cpu / wall:7.3f} % {100 * share:5.1f} % {int(calls):7d} "
            f"{1e6 * cpu / max(calls, 1):9.1f}"
        )


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
