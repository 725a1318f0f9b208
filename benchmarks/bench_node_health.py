"""The node-health signal's cost (issue 27): what it adds to a daemon cycle, and how fast the kernel log
parser reads lines, each beside its baseline.

* **Cycle cost**: the in-process daemon (16 simulated B300 GPUs, no HTTP, no job) driving ``cycle``
  back to back, with ``[health]`` off (the baseline) and on (its kernel log read from an idle file,
  the sim source's path); the same with 2,000 kernel lines waiting each cycle (the bound of one
  poll: a driver flooding the log) - per-cycle time, mean of the middle half.
* **Parser**: lines per second of :func:`parse_line` over a mix of Xid lines in every wrapper, beside
  a plain ``str.find`` scan of the same lines (the floor of any reader).

    .venv/bin/python -m benchmarks node_health [--quick]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import header, line

LINES = [
    "3,1234,567890123,-;NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
    "Nov 22 18:29:55 host kernel: [ 966.503025] NVRM: Xid (0000:1b:00): 31, Ch 0000000b, engmask 00000120",
    "6,1235,567890124,-;usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "6,1236,567890125,-;EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode",
]


def _daemon(tmp: Path, enabled: bool, log: Path) -> object:
    from gpu_triage.daemon.config import load_config, override
    from gpu_triage.daemon.loop import Daemon
    from gpu_triage.telemetry.sim import SimSource

    config = override(
        load_config(None, {}),
        {
            "daemon.state_dir": str(tmp / f"state-{enabled}"),
            "progress.dir": str(tmp / "progress"),
            "stacks.enabled": False,
            "health.enabled": enabled,
            "health.kernel_log": "off",
            "health.kernel_log_file": str(log),
        },
        origin="bench",
    )
    daemon = Daemon(config, SimSource(gpus=16), serve_http=False)
    daemon.start()
    return daemon


def _cycle_ms(daemon: object, cycles: int, feed: Path | None = None, lines: int = 0) -> float:
    times = []
    now = 1000.0
    text = ("\n".join(LINES) + "\n") * (lines // len(LINES)) if lines else ""
    for _ in range(cycles):
        if feed is not None and text:
            with open(feed, "a") as f:
                f.write(text)
        now += 1.0
        t0 = time.perf_counter()
        daemon.cycle(now)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - t0)
    times.sort()
    middle = times[len(times) // 4 : 3 * len(times) // 4]
    return statistics.mean(middle) * 1000.0


def run(quick: bool = False) -> None:
    from gpu_triage.signals.health.kernel_log import parse_line

    cycles = 100 if quick else 600
    header("node health: the daemon cycle (16 simulated GPUs, no job, no HTTP)")
    with tempfile.TemporaryDirectory(prefix="bench-node-health-") as name:
        tmp = Path(name)
        idle, flood = tmp / "idle.log", tmp / "flood.log"
        idle.write_text("")
        flood.write_text("")
        off = _daemon(tmp, False, idle)
        on = _daemon(tmp / "on", True, idle)
        flooded = _daemon(tmp / "flood", True, flood)
        try:
            _cycle_ms(off, 20), _cycle_ms(on, 20)  # warm both (imports, first-cycle setup)
            rounds = 5  # interleaved, so a noisy neighbour hits both alike
            pairs = [
                (_cycle_ms(off, cycles // rounds), _cycle_ms(on, cycles // rounds)) for _ in range(rounds)
            ]
            base = statistics.median(b for b, _ in pairs)
            with_health = statistics.median(h for _, h in pairs)
            with_flood = _cycle_ms(flooded, max(20, cycles // 10), feed=flood, lines=2000)
        finally:
            for d in (off, on, flooded):
                d.close()  # type: ignore[attr-defined]
        line("cycle, [health] on, idle kernel log", with_health, "ms", baseline=base,
             baseline_name="[health] off", higher_is_better=False)  # fmt: skip
        line("cycle, [health] on, 2000 kernel lines/cycle", with_flood, "ms", baseline=base,
             baseline_name="[health] off", higher_is_better=False)  # fmt: skip
    header("node health: the kernel-log parser")
    lines = LINES * (5_000 if quick else 50_000)
    t0 = time.perf_counter()
    found = sum(1 for text in lines if text.find("NVRM") >= 0)
    scan_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    parsed = sum(1 for text in lines if parse_line(text) is not None)
    parse_s = time.perf_counter() - t0
    assert parsed == found // 1 and parsed == len(lines) // 2
    line(
        "parse_line",
        len(lines) / parse_s,
        "lines/s",
        baseline=len(lines) / scan_s,
        baseline_name="str.find scan",
    )
