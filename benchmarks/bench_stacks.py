"""Stack sampling's cost: the daemon with py-spy sampling on against off, and the pause a dump
imposes on a rank.

1. The real daemon in its own process (16 simulated B300 GPUs at 10 Hz, the reference scenario) and
   the simulated job's 16 real rank processes (Python, writing progress at 1 Hz; the sampler dumps
   each on the healthy schedule). CPU share of one core over the window, the daemon *and its py-spy
   children* (reaped children's times), with ``[stacks] enabled = false`` (baseline) and ``true``.
   Budget: sampling adds <= 1 % of a core. Also: py-spy CPU per dump (from ``/status``) and what the
   suspicion schedule (every 3 s, all 16 ranks) would cost at that rate, against the sampler budget.
   Healthy: a scenario of the reference node training throughout; under suspicion: the reference
   scenario's deadlock, where the budget caps the spend.
2. The pause: a rank process (torch imported, a busy Python loop timing itself) is dumped 20 times
   with ``--nonblocking`` (the default) and 20 times blocking; the longest gap in its loop during each
   dump, against the longest gap without dumps (baseline).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from benchmarks.bench_daemon import _free_port
from benchmarks.common import header, line
from gpu_triage.signals.stacks.sampler import find_py_spy, run_py_spy

GPUS = 16
RANKS = 16
EXTRA_BUDGET = 0.01

CHILD = r"""
import sys, time
from gpu_triage.daemon.config import load_config, override
from gpu_triage.daemon.loop import Daemon
from gpu_triage.daemon.reload import install_signal_handlers
from gpu_triage.telemetry.sim import SimSource
port, state, progress, start, gpus, stacks, scenario = sys.argv[1:8]
config = override(load_config(None, {}), {"daemon.listen": f"127.0.0.1:{port}", "daemon.state_dir": state,
                  "daemon.period_s": 0.1, "progress.dir": progress, "stacks.enabled": stacks == "on"},
                  origin="bench")
daemon = Daemon(config, SimSource(scenario, gpus=int(gpus), start_s=float(start)))
daemon.start()
install_signal_handlers(daemon)
try:
    daemon.run_forever()
finally:
    daemon.close()
"""

RANK = r"""
import json, sys, time
import torch  # a large process: py-spy reads a real PyTorch rank's memory maps
x = torch.zeros(1024)
end = time.monotonic() + float(sys.argv[1])
gaps = []
last = time.monotonic()
while last < end:
    for _ in range(200):
        pass
    now = time.monotonic()
    if now - last > 0.0005:
        gaps.append((last, now - last))
    last = now
print(json.dumps(gaps))
"""


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def healthy_scenario(tmp: Path) -> Path:
    """The reference scenario's node, training throughout (no save, no stall, no deadlock)."""
    text = (
        Path(__file__).resolve().parent.parent / "watchdog" / "scenarios" / "reference-b300.toml"
    ).read_text()
    head = text[: text.index("[[phases]]")].replace('name = "reference-b300"', 'name = "bench-healthy"')
    head = head.replace("loop = true", "loop = false")
    phase = (
        '[[phases]]\nname = "train"\nduration_s = 86400.0\njob_phase = "train"\nstep_rate_per_s = 0.2\n'
        'gpu = "training"\nnote = "healthy training for the benchmark"\n'
    )
    path = tmp / "bench-healthy.toml"
    path.write_text(head + phase)
    return path


def isolated() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def _find_daemon(groups: list[subprocess.Popen]) -> psutil.Process:
    for g in groups:
        top = psutil.Process(g.pid)
        for p in [top, *top.children(recursive=True)]:
            try:
                cmd = p.cmdline()
                if cmd and "python" in Path(cmd[0]).name and "install_signal_handlers" in " ".join(cmd):
                    return p
            except psutil.Error:
                continue
    raise RuntimeError("the daemon process was not found")


def _daemon_share(stacks: str, window_s: float, scenario: str, into_s: float = 0.0) -> tuple[float, dict]:
    """``into_s``: seconds of the scenario already past at the start (100: the deadlock in 10 s)."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="gpuwd-bench-stacks-") as tmp:
        state, progress = Path(tmp) / "state", Path(tmp) / "progress"
        start = time.time() + 1.0 - into_s
        job_cmd = [sys.executable, "-m", "gpu_triage.demo.simjob", "--progress-dir", str(progress),
                   "--start-epoch", str(start), "--ranks", str(RANKS), "--world-size", str(RANKS),
                   "--scenario", scenario]  # fmt: skip
        daemon_cmd = [sys.executable, "-c", CHILD, str(port), str(state), str(progress), str(start),
                      str(GPUS), stacks, scenario]  # fmt: skip
        if isolated():
            # the daemon and the job in their own PID namespace: the daemon sees this job only, not
            # the other jobs of a shared machine
            inner = f"{shlex.join(job_cmd)} & {shlex.join(daemon_cmd)} & wait"
            ns = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", inner],
                                  start_new_session=True)  # fmt: skip
            groups = [ns]
        else:
            groups = [subprocess.Popen(c, start_new_session=True) for c in (job_cmd, daemon_cmd)]
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the daemon did not become healthy")
                time.sleep(0.2)
            time.sleep(10.0)  # warm-up: discovery, the first round of dumps
            proc = _find_daemon(groups)
            c0, t0 = _cpu_s(proc), time.monotonic()
            s0 = httpx.get(f"{base}/status", timeout=5).json().get("stacks", {})
            time.sleep(window_s)
            c1, t1 = _cpu_s(proc), time.monotonic()
            s1 = httpx.get(f"{base}/status", timeout=5).json().get("stacks", {})
            s1["dumps_in_window"] = s1.get("dumps_total", 0) - s0.get("dumps_total", 0)
            s1["cpu_s_in_window"] = s1.get("cpu_s_total", 0.0) - s0.get("cpu_s_total", 0.0)
            jobs = httpx.get(f"{base}/status", timeout=5).json()["jobs"]
            s1["jobs_seen"] = len(jobs)
            s1["verdicts"] = sorted({j["verdict"] for j in jobs})
            return (c1 - c0) / (t1 - t0), s1
        finally:
            for p in groups:
                try:  # a namespace's init ignores SIGTERM from outside: SIGKILL tears the namespace down
                    os.killpg(p.pid, signal.SIGKILL if isolated() else signal.SIGTERM)
                    p.wait(timeout=15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(p.pid, signal.SIGKILL)


def _pauses(binary: str, dumps: int) -> dict[str, list[float]]:
    duration = 8.0 + dumps * 0.6
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(duration)], stdout=subprocess.PIPE, text=True)
    time.sleep(5.0)  # torch imported, the loop running
    windows: dict[str, list[tuple[float, float]]] = {"nonblocking": [], "blocking": []}
    for i in range(2 * dumps):
        mode = "nonblocking" if i % 2 == 0 else "blocking"
        t0 = time.monotonic()
        run_py_spy(binary, rank.pid, nonblocking=mode == "nonblocking", timeout_s=10.0)
        windows[mode].append((t0, time.monotonic()))
        time.sleep(0.25)
    out, _ = rank.communicate(timeout=duration + 30)
    gaps = json.loads(out)
    result: dict[str, list[float]] = {"nonblocking": [], "blocking": [], "baseline": []}
    busy = [w for ws in windows.values() for w in ws]
    for mode, ws in windows.items():
        for a, b in ws:
            result[mode].append(max((g for t, g in gaps if a - 0.05 <= t <= b), default=0.0))
    first = min(a for a, _ in busy)
    result["baseline"] = [max((g for t, g in gaps if t < first - 0.1), default=0.0)]
    return result


def run(quick: bool = False) -> None:
    window_s = 30.0 if quick else 120.0
    header(
        f"stack sampling on a healthy job: daemon + py-spy children, {GPUS} simulated B300 at 10 Hz, "
        f"{RANKS} rank processes, {window_s:.0f} s window, off vs on"
    )
    with tempfile.TemporaryDirectory(prefix="gpuwd-bench-scenario-") as tmp:
        healthy = str(healthy_scenario(Path(tmp)))
        off, _ = _daemon_share("off", window_s, healthy)
        on, st = _daemon_share("on", window_s, healthy)
    line("daemon CPU share, stacks off (baseline)", 100 * off, "%", higher_is_better=False)
    line("daemon CPU share, stacks on", 100 * on, "%", higher_is_better=False)
    extra = on - off
    line(
        "added by stack sampling",
        100 * extra,
        "% of a core",
        budget=f"<= {100 * EXTRA_BUDGET:.0f} %",
        ok=extra <= EXTRA_BUDGET,
        higher_is_better=False,
    )
    line("py-spy dumps in the window", float(st.get("dumps_in_window", 0)), "dumps")
    line("jobs the daemon saw (this machine's other jobs too)", float(st.get("jobs_seen", 0)), "jobs")
    per_dump = st.get("cpu_s_total", 0.0) / max(1, st.get("dumps_total", 0))
    line("py-spy CPU per dump", 1000 * per_dump, "ms", higher_is_better=False)
    line(
        "py-spy wall time per dump", 1000 * (st.get("mean_dump_wall_s") or 0.0), "ms", higher_is_better=False
    )
    suspect = RANKS / 3.0 * 60.0 * per_dump
    line(
        f"demand of the suspicion schedule ({RANKS} ranks every 3 s)",
        suspect,
        "CPU-s/min",
        budget=f"capped at {st.get('budget_cpu_s_per_min', 3.0)} by the sampler budget",
        higher_is_better=False,
    )
    header(
        f"under suspicion: the reference deadlock (16 ranks dumped every 3 s), {window_s / 2:.0f} s window"
    )
    hung, hst = _daemon_share("on", window_s / 2, "reference-b300", into_s=100.0)
    line("verdicts of the hung job", float(len(hst.get("verdicts", []))), ",".join(hst.get("verdicts", [])))
    line("daemon CPU share, stacks on, job hung", 100 * hung, "%", higher_is_better=False)
    spent = 60.0 * hst.get("cpu_s_in_window", 0.0) / (window_s / 2)
    budget = float(hst.get("budget_cpu_s_per_min", 3.0))
    line("py-spy CPU per minute", spent, "CPU-s/min", budget=f"<= {budget} (sampler budget)",
         ok=spent <= budget * 1.1, higher_is_better=False)  # fmt: skip
    line("dumps held back by the budget", float(hst.get("skipped_budget_total", 0)), "requests")
    binary = find_py_spy("auto")
    if binary is None:
        print("  (py-spy not found: pause measurement skipped)")
        return
    dumps = 5 if quick else 20
    header(f"the pause a dump imposes on a rank (torch imported, busy loop), {dumps} dumps per mode")
    p = _pauses(binary, dumps)
    base = p["baseline"][0]
    line("longest loop gap without dumps (baseline)", 1000 * base, "ms", higher_is_better=False)
    for mode in ("nonblocking", "blocking"):
        gaps = sorted(p[mode])
        line(f"{mode} dump: median longest gap", 1000 * gaps[len(gaps) // 2], "ms", higher_is_better=False)
        line(f"{mode} dump: worst gap", 1000 * gaps[-1], "ms", higher_is_better=False)


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
