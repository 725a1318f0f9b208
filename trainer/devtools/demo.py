"""``make demo``: the whole story on one CPU-only machine, narrated, in a few minutes.

1. ``ft-trainer gate`` refuses an imbalanced plan in about a second, naming the ranks.
2. The gate bypassed, the real 2-rank DeepSpeed ZeRO-3 job (gloo, CPU, a tiny random Qwen3) deadlocks
   at the end of its epoch. The real daemon, watching with ``--source none`` (no GPU here, so no
   simulated telemetry either), raises ``deadlock_suspected``, captures evidence (py-spy stacks of both
   ranks), alerts a real Alertmanager, and - armed over its REST API for the demo - kills exactly the
   job's processes.
3. The same data with equalize-to-minimum completes.

It ends with a summary: times to detection, alert and kill, and which signals carried the verdict.
This module is only an orchestrator: the daemon is driven through its CLI and HTTP API, the trainer
through ``ft_trainer.devtools.testing`` (the same helpers the tests use).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from ft_trainer.devtools.testing import launch_local, prepare_tiny_data, write_tiny_job

JOB = "tiny-cpu"
BOLD, DIM, RED, GREEN, RESET = "\033[1m", "\033[2m", "\033[31m", "\033[32m", "\033[0m"


class Narrator:
    def __init__(self, color: bool) -> None:
        self.t0 = time.monotonic()
        self.color = color

    def _c(self, code: str, text: str) -> str:
        return f"{code}{text}{RESET}" if self.color else text

    def step(self, title: str) -> None:
        print("\n" + self._c(BOLD, f"== {title}"), flush=True)

    def say(self, text: str, *, good: bool | None = None) -> None:
        stamp = self._c(DIM, f"[{time.monotonic() - self.t0:6.1f} s]")
        if good is True:
            text = self._c(GREEN, text)
        elif good is False:
            text = self._c(RED, text)
        print(f"{stamp} {text}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _imbalanced_job(root: Path, data, *, equalize: bool, name: str) -> Path:
    """One epoch, grad_accum 1, with the first seed whose epoch 0 packs clearly unequal counts."""
    from ft_trainer.config import load_config
    from ft_trainer.data.data import JobData

    for seed in range(60):
        job = write_tiny_job(
            root / f"{name}.toml",
            cache_dir=data.cache_dir,
            tokenizer_dir=data.tokenizer_dir,
            checkpoint_dir=root / f"ckpt-{name}",
            job={"name": JOB, "seed": seed, "epochs": 1},
            data={"equalize": equalize, "grad_accum": 1},
            train={"save_every_epoch": False, "save_at_end": False},
        )
        plan = JobData.open(load_config(job)).epoch_plan(0)
        if int(plan.local_micro_batches.max()) - int(plan.local_micro_batches.min()) >= 4:
            return job
    raise RuntimeError("no seed gives an imbalanced plan for the demo corpus")


def _start_alertmanager(root: Path, n: Narrator) -> tuple[subprocess.Popen | None, str | None]:
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        n.say(
            "no Alertmanager binary here (Debian: prometheus-alertmanager; `make system-deps`): "
            "the daemon's alert goes nowhere in this run",
            good=False,
        )
        return None, None
    port = _free_port()
    cfg = root / "alertmanager.yml"
    cfg.write_text("route:\n  receiver: demo\n  group_wait: 1s\nreceivers:\n  - name: demo\n")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.path={root / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                n.say(f"Alertmanager (real, Debian's {Path(binary).name}) listening on {url}")
                return proc, url
        time.sleep(0.3)
    proc.kill()
    n.say("Alertmanager did not start; continuing without it", good=False)
    return None, None


def _daemon_config(root: Path, port: int, progress: Path, token_file: Path, am_url: str | None) -> Path:
    cfg = root / "gpu-watchdog.toml"
    sink = (
        f'\n[[alerts.sinks]]\nkind = "alertmanager"\nname = "demo-am"\nurl = "{am_url}"\ntimeout_s = 2.0\n'
        if am_url
        else ""
    )
    cfg.write_text(f"""# make demo: the daemon watching a CPU-only job (no GPU telemetry)
[daemon]
node = "demo-node"
source = "none"
listen = "127.0.0.1:{port}"
state_dir = "{root / "state"}"
period_s = 1.0
[progress]
dir = "{progress}"
[auth]
token_file = "{token_file}"
[detector]
confirm_after_s = 20.0      # demo: a deadlock is confirmed 20 s after it is suspected (default 120)
[actions]
mode = "observe"            # the demo arms it over the REST API, as an operator would
capture_after_s = 0.0
alert_after_s = 0.0
sigterm_after_s = 5.0       # demo: SIGTERM 5 s after confirmation (default 60)
sigkill_grace_s = 10.0
max_kills_per_hour = 5
[alerts]
retry_initial_s = 0.5
{sink}""")
    return cfg


def _status(base: str) -> dict[str, Any] | None:
    try:
        return httpx.get(f"{base}/status", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None


def _events(base: str) -> list[dict[str, Any]]:
    try:
        return httpx.get(f"{base}/events", params={"since": 0, "limit": 1000}, timeout=2).json()["events"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []


def _am_alerts(am_url: str) -> list[dict[str, Any]]:
    """The demo job's alerts as a real Alertmanager holds them (GET /api/v2/alerts)."""
    try:
        alerts = httpx.get(f"{am_url}/api/v2/alerts", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return []
    return [a for a in alerts if a.get("labels", {}).get("training_job") == JOB]


def _daemon_log_lines(path: Path, job: str) -> dict[str, str]:
    """The daemon's structured event lines for ``job`` (gpu_triage.journal.logs), first of each kind: the
    verdict that went to a deadlock, the evidence bundle, the SIGTERM (what journalctl would show)."""
    wanted = {
        "verdict": (f"verdict job={job} ", "-> deadlock_suspected"),
        "evidence": (f"evidence job={job} ", ""),
        "kill": (f"kill job={job} sigterm ok ", ""),
    }
    found: dict[str, str] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        _, sep, message = line.partition("gpu_watchdog.events: ")
        if not sep:
            continue
        for kind, (prefix, needle) in wanted.items():
            if kind not in found and message.startswith(prefix) and needle in message:
                found[kind] = message
    return found


def _py_spy_excerpt(bundle: Path) -> list[str]:
    out = []
    for f in sorted(bundle.glob("py-spy-rank*.txt")):
        lines = [ln.strip() for ln in f.read_text(errors="replace").splitlines() if ln.strip()]
        frames = [ln for ln in lines if "(" in ln and ("py:" in ln or ".py" in ln)]
        interesting = [
            ln
            for ln in frames
            if any(
                k in ln
                for k in ("barrier", "all_reduce", "reduce_scatter", "all_gather", "backward", "wait", "step")
            )
        ]
        pick = (interesting or frames)[:3]
        out.append(
            f"{f.name}: "
            + (" <- ".join(p.split(" (")[0] for p in pick) if pick else (lines[0] if lines else "(empty)"))
        )
    return out


def _watch_job(
    n: Narrator, base: str, run: Any, am_url: str | None, summary: dict[str, Any]
) -> tuple[dict[str, Any], list[Any]]:
    """Poll the daemon's ``/status`` and ``/events`` (and Alertmanager) once a second, narrating each
    new verdict and action, until the job is gone and its alert resolved (at most 300 s): what was
    seen when, and every ``/status`` poll (the timeline picture's points)."""
    seen: dict[str, Any] = {}
    points: list[Any] = []  # /status polls of the job: the timeline picture's steps (and power)
    last_line = ""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        st = _status(base)
        if st is not None:
            points.append(st)
        job = next((j for j in (st or {}).get("jobs", []) if j["job"] == JOB), None)
        if job is not None:
            ranks = ", ".join(f"rank {r['rank']} {r['phase'] or '?'} step {r['step']}" for r in job["ranks"])
            line = f"{job['verdict']}: {ranks}"
            if line != last_line:
                n.say(line, good=False if job["verdict"].startswith("deadlock") else None)
                last_line = line
            if job["verdict"] == "deadlock_suspected" and "suspected" not in seen:
                seen["suspected"] = job.get("raised") or time.time()  # the daemon's time, not the poll
                seen["onset"] = job["onset"]
                summary["signals"] = job["evidence"].get("signals", [])
                summary["evidence"] = {
                    k: job["evidence"].get(k)
                    for k in (
                        "phases",
                        "steps",
                        "steps_frozen_since",
                        "live_leases",
                        "telemetry",
                        "bytes_written_recently",
                    )
                }
            if job["verdict"] == "deadlock_confirmed" and "confirmed" not in seen:
                seen["confirmed"] = job.get("raised") or time.time()
        for e in _events(base):
            if e.get("job") != JOB:  # a shared machine's other jobs have events too
                continue
            p = e.get("payload", {})
            key = f"{p.get('action')}/{p.get('result')}" if e["kind"] == "action" else e["kind"]
            if (
                key
                in (
                    "capture/started",
                    "evidence",
                    "alert/queued",
                    "sigterm/started",
                    "sigterm/ok",
                    "sigkill/ok",
                    "sigkill/not_needed",
                    "resolve/queued",
                )
                and key not in seen
            ):
                seen[key] = e["time"]
                if key == "evidence":
                    seen["bundle"] = p.get("path")
                n.say(f"event: {key}" + (f" {p.get('path')}" if key == "evidence" else ""))
        if am_url and "alert/queued" in seen and "alertmanager" not in seen:
            mine = _am_alerts(am_url)
            if mine:
                seen["alertmanager"] = time.time()
                summary["alertmanager_alerts"] = [a["labels"] for a in mine]
                n.say(
                    f"Alertmanager received it: {mine[0]['labels'].get('alertname')} "
                    f"(severity {mine[0]['labels'].get('severity')}, state {mine[0]['status']['state']})",
                    good=True,
                )
        if not any(run.alive()) and "resolve/queued" in seen:
            break
        time.sleep(1.0)
    return seen, points


def run_demo(out: Path, *, color: bool) -> dict[str, Any]:
    n = Narrator(color)
    root = out.resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    summary: dict[str, Any] = {"ok": False}
    cleanup: list[Any] = []
    try:
        n.step("0. Setup: a tiny tokenizer and a corpus with one long document (packing puts it on one rank)")
        data = prepare_tiny_data(root / "data", imbalanced=True)
        off = _imbalanced_job(root, data, equalize=False, name="equalize-off")
        on = _imbalanced_job(root, data, equalize=True, name="equalize-on")
        n.say(
            f"job configs: {off.name} (equalize off), {on.name} (equalize on); "
            "2 ranks, DeepSpeed ZeRO-3 on CPU"
        )

        n.step("1. The pre-run gate refuses the imbalanced plan")
        t = time.monotonic()
        gate = subprocess.run(
            [sys.executable, "-m", "ft_trainer.cli", "gate", "--config", str(off)],
            capture_output=True,
            text=True,
        )
        gate_s = time.monotonic() - t
        for line in gate.stdout.splitlines():
            if "FAIL" in line or "rank" in line.lower():
                n.say("  " + line.strip(), good=False if "FAIL" in line else None)
        n.say(f"gate exit {gate.returncode} after {gate_s:.1f} s (whole process)", good=gate.returncode == 2)
        summary["gate"] = {"exit": gate.returncode, "seconds": round(gate_s, 2)}

        n.step("2. Gate bypassed: the real job deadlocks at epoch end; the real daemon catches it")
        am_proc, am_url = _start_alertmanager(root, n)
        if am_proc is not None:
            cleanup.append(am_proc)
        token = secrets.token_urlsafe(24)
        token_file = root / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        progress = root / "progress"
        cfg = _daemon_config(root, port, progress, token_file, am_url)
        log = (root / "daemon.log").open("w")
        cleanup.append(log)
        daemon = subprocess.Popen(
            [sys.executable, "-m", "gpu_triage", "run", "--config", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        cleanup.append(daemon)
        deadline = time.monotonic() + 60
        while _status(base) is None:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise RuntimeError(f"the daemon did not start; see {root / 'daemon.log'}")
            time.sleep(0.3)
        n.say(
            f"gpu-watchdog run --source none on {base} (no GPU here: no power signal, and no simulated one)"
        )
        r = httpx.post(f"{base}/arm", json={"mode": "kill"}, headers={"Authorization": f"Bearer {token}"})
        n.say(f'POST /arm {{"mode": "kill"}} with the bearer token -> {r.status_code}: armed for the demo')
        r_bad = httpx.post(f"{base}/arm", json={"mode": "kill"}, headers={"Authorization": "Bearer wrong"})
        n.say(f"(the same call with a wrong token -> {r_bad.status_code})")

        t_launch = time.time()
        run = launch_local(off, log_dir=root / "logs-off", progress_dir=progress, job=JOB)
        cleanup.append(run)
        n.say(f"launched 2 ranks (pids {run.pids}, process group {run.pgid})")
        seen, points = _watch_job(n, base, run, am_url, summary)
        gone = not any(run.alive())
        n.say("every rank of the job is gone" if gone else "the job is still running", good=gone)
        summary["daemon_log"] = _daemon_log_lines(root / "daemon.log", JOB)
        for kind in ("verdict", "evidence", "kill"):
            if summary["daemon_log"].get(kind):
                n.say(f"daemon log: {summary['daemon_log'][kind]}")
        if seen.get("bundle"):
            for line in _py_spy_excerpt(Path(seen["bundle"])):
                n.say("  py-spy " + line)
        if am_url and "alertmanager" not in seen:
            n.say("Alertmanager never showed the alert", good=False)
        run.kill()
        summary["pictures"] = _pictures(n, root, base, points, seen.get("bundle"))

        n.step("3. The same data with equalize-to-minimum completes")
        run_on = launch_local(on, log_dir=root / "logs-on", progress_dir=progress, job=JOB + "-on")
        cleanup.append(run_on)
        codes = run_on.wait(300)
        n.say(f"equalized job exited {codes}", good=codes == [0, 0])
        for line in (run_on.output(0) + run_on.output(1)).splitlines():
            if "equaliz" in line.lower() and "drop" in line.lower():
                n.say("  " + line.strip()[-160:])
                break
        summary["equalized_exit_codes"] = codes

        onset = seen.get("onset") or t_launch
        summary["times_s"] = {
            "detection": _rel(seen.get("suspected"), onset),
            "evidence": _rel(seen.get("evidence"), onset),
            "alert_delivered": _rel(seen.get("alertmanager"), onset),
            "confirmed": _rel(seen.get("confirmed"), onset),
            "sigterm": _rel(seen.get("sigterm/started"), onset),
            "alert_resolved": _rel(seen.get("resolve/queued"), onset),
        }
        summary["job_killed"] = gone
        summary["ok"] = bool(gate.returncode == 2 and "suspected" in seen and gone and codes == [0, 0])
        _print_summary(n, summary)
        return summary
    finally:
        for item in reversed(cleanup):
            with contextlib.suppress(Exception):
                if hasattr(item, "kill") and hasattr(item, "pgid"):
                    item.kill()
                elif hasattr(item, "close"):
                    item.close()
                elif isinstance(item, subprocess.Popen) and item.poll() is None:
                    os.killpg(item.pid, 15)
                    item.wait(timeout=15)
        (root / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


def _pictures(n: Narrator, root: Path, base: str, polls: list[dict[str, Any]], bundle: Any) -> dict[str, Any]:
    """The timeline PNG of the incident (steps per rank, verdict bands, the actions) from the polled
    /status documents and the daemon's /events; the evidence bundle's HTML report (written by the
    capture). A picture that cannot be made is said, never a failed demo."""
    from gpu_triage.journal.timeline import build_timeline, plot_timeline, status_point

    out: dict[str, Any] = {}
    try:
        points = [p for p in (status_point(d, JOB) for d in polls) if p is not None]
        events = _events(base)
        (root / "timeline.json").write_text(json.dumps({"job": JOB, "status": polls, "events": events}))
        timeline = build_timeline(JOB, points, events, end_s=time.time())
        png = plot_timeline(timeline, root / "timeline.png", title=f"make demo: job {JOB} (--source none)")
        out["timeline_png"] = str(png)
        out["verdicts"] = [s.verdict for s in timeline.spans]
        out["marks"] = [m.kind for m in timeline.marks]
        n.say(f"picture: {png} (steps per rank, verdict bands, evidence/alert/SIGTERM marks)", good=True)
    except Exception as e:  # matplotlib missing, daemon gone: say so
        n.say(f"no timeline picture: {type(e).__name__}: {e}", good=False)
    report = Path(bundle) / "report.html" if bundle else None
    if report is not None and report.is_file():
        out["evidence_report"] = str(report)
        n.say(f"evidence report: {report} (ranks grouped by where they wait)", good=True)
    return out


def _rel(t: float | None, onset: float) -> float | None:
    return None if t is None else round(t - onset, 1)


TIMELINE_LABELS = (
    ("detection", "deadlock_suspected raised"),
    ("evidence", "evidence bundle written"),
    ("alert_delivered", "alert seen in Alertmanager"),
    ("confirmed", "deadlock_confirmed"),
    ("sigterm", "SIGTERM to the job's group"),
    ("alert_resolved", "alert resolved"),
)


def timeline_rows(times: dict[str, float | None]) -> list[tuple[str, float | None]]:
    """The summary's milestones sorted by when they happened (ties keep the story's order); those
    that never happened last."""
    order = {key: i for i, (key, _label) in enumerate(TIMELINE_LABELS)}
    rows = sorted(
        TIMELINE_LABELS,
        key=lambda kl: (times.get(kl[0]) is None, times.get(kl[0]) or 0.0, order[kl[0]]),
    )
    return [(label, times.get(key)) for key, label in rows]


def _print_summary(n: Narrator, s: dict[str, Any]) -> None:
    n.step("Summary")
    t = s.get("times_s", {})

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:+.1f} s"

    print(f"  gate refused the plan:           exit {s['gate']['exit']} in {s['gate']['seconds']:.1f} s")
    print("  from the hang's onset (the last step any train rank made), in the order they happened:")
    for label, value in timeline_rows(t):
        print(f"    {label:<34} {fmt(value)}")
    print(f"  job killed: {s.get('job_killed')}; equalized job exit codes: {s.get('equalized_exit_codes')}")
    print(f"  signals behind the verdict: {', '.join(s.get('signals', [])) or '-'}")
    print(
        "  This machine has no GPU: the verdict was carried by the trainer's progress files (ranks\n"
        "  disagreeing on the phase - one at epoch_end with a lease, one in train with its step frozen)\n"
        "  and by the process signals (both ranks alive, no writes). Power, utilisation and NVLink played\n"
        "  no part; on a GPU node the spin band would have added its own evidence."
    )
    print(f"  demo {'PASSED' if s['ok'] else 'FAILED'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ft_trainer.devtools.demo", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", type=Path, default=Path("out/demo"), help="work directory (recreated)")
    p.add_argument("--no-color", action="store_true")
    args = p.parse_args(argv)
    summary = run_demo(args.out, color=not args.no_color and sys.stdout.isatty())
    return 0 if summary.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
