"""Measure one GPU's power bands under known loads and fit a table from them (run on a GPU machine).

Phases, each ``--phase-s`` seconds, sampled by NVML at 10 Hz into an nvidia-smi-format CSV with a
labels file beside it:

1. ``idle``: no process on the GPU (NVML is read before this process creates a CUDA context);
2. ``idle`` with memory held: a CUDA context and a large allocation, no kernel;
3. ``compute``: back-to-back bf16 matmuls (8192 x 8192);
4. ``memcpy``: device-to-device copies of a large buffer (recorded, left unlabelled: bandwidth-bound
   work sits between the bands and shows where the compute floor must not be);
5. ``spin``: ``torch.cuda._sleep`` - one thread block busy-waiting, as a collective waiting for a peer
   does. One GPU cannot host a real NCCL hang; a waiting collective spins a few blocks per channel, so
   this is the closest single-GPU approximation (utilisation 100 %, power near idle). Labelled
   ``checkpoint_wait``.

Then ``gpu-watchdog calibrate`` fits a table from the recording. Usage, on the GPU machine::

    python -m benchmarks.device.power_bands --out out/h200 --phase-s 30
    # -> out/h200/power.csv, power.labels.csv, power.png, table.toml, summary.txt

Needs torch with CUDA and nvidia-ml-py. Nothing here runs in the CPU test suite.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path


class Sampler(threading.Thread):
    """NVML at ``rate_hz`` into rows shaped like ``nvidia-smi --query-gpu=timestamp,index,name,
    power.draw,power.limit,utilization.gpu,memory.used --format=csv``."""

    def __init__(self, index: int, rate_hz: float = 10.0) -> None:
        super().__init__(daemon=True)
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.index = index
        self.name = pynvml.nvmlDeviceGetName(self.handle)
        self.limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000
        self.period_s = 1.0 / rate_hz
        self.rows: list[list[str]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        nv, h = self.nvml, self.handle
        next_t = time.monotonic()
        while not self.halt.is_set():
            now = datetime.now(UTC)
            power_w = nv.nvmlDeviceGetPowerUsage(h) / 1000
            util = nv.nvmlDeviceGetUtilizationRates(h).gpu
            mem_mib = nv.nvmlDeviceGetMemoryInfo(h).used / 2**20
            self.rows.append(
                [
                    now.strftime("%Y/%m/%d %H:%M:%S.") + f"{now.microsecond // 1000:03d}",
                    str(self.index),
                    self.name,
                    f"{power_w:.2f} W",
                    f"{self.limit_w:.2f} W",
                    f"{util} %",
                    f"{mem_mib:.0f} MiB",
                ]
            )
            next_t += self.period_s
            time.sleep(max(0.0, next_t - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--phase-s", type=float, default=30.0)
    p.add_argument("--name", default=None, help="model name of the fitted table (default: from NVML)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(args.gpu)
    sampler.start()
    t0 = time.monotonic()
    labels: list[tuple[float, float, str]] = []

    def phase(label: str | None, body) -> None:
        start = time.monotonic() - t0
        print(f"[{start:6.1f} s] {label or 'unlabelled'}", flush=True)
        body()
        end = time.monotonic() - t0
        if label:
            labels.append((start + 2.0, end - 0.5, label))  # skip the ramp at each edge

    phase("idle", lambda: time.sleep(args.phase_s))
    import torch

    dev = torch.device("cuda", args.gpu)
    held = torch.empty(20 * 2**30, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize(dev)
    phase("idle", lambda: time.sleep(args.phase_s))

    def loop(fn) -> None:
        end = time.monotonic() + args.phase_s
        while time.monotonic() < end:
            for _ in range(20):
                fn()
            torch.cuda.synchronize(dev)

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    phase("compute", lambda: loop(lambda: a @ b))
    src = torch.empty(4 * 2**30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    phase(None, lambda: loop(lambda: dst.copy_(src)))
    cycles = int(torch.cuda.get_device_properties(dev).clock_rate * 1000 * 0.05)  # ~50 ms per kernel
    phase("checkpoint_wait", lambda: loop(lambda: torch.cuda._sleep(cycles)))
    sampler.halt.set()
    sampler.join()
    torch.cuda.synchronize(dev)
    held.record_stream(torch.cuda.current_stream(dev))  # keep the allocation alive until here

    rec = args.out / "power.csv"
    with rec.open("w", newline="") as f:
        f.write(
            "timestamp, index, name, power.draw [W], power.limit [W], utilization.gpu [%], "
            "memory.used [MiB]\n"
        )
        for row in sampler.rows:
            f.write(", ".join(row) + "\n")
    with (args.out / "power.labels.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["start_s", "end_s", "label"])
        for start, end, label in labels:
            w.writerow([f"{start:.1f}", f"{end:.1f}", label])
    gw = [sys.executable, "-m", "gpu_triage"]
    name = args.name or sampler.name.replace("NVIDIA ", "").split()[0] + "-measured"
    fit = subprocess.run(
        [
            *gw,
            "calibrate",
            "--labels",
            str(args.out / "power.labels.csv"),
            "--unlabelled",
            "ignore",
            "--name",
            name,
            "--out",
            str(args.out / "table.toml"),
            str(rec),
        ],
        capture_output=True,
        text=True,
    )
    triage = subprocess.run(
        [*gw, "triage", "--plot", str(args.out / "power.png"), str(rec)], capture_output=True, text=True
    )
    summary = fit.stdout + fit.stderr + "\n" + triage.stdout + triage.stderr
    (args.out / "summary.txt").write_text(summary)
    print(summary)
    return fit.returncode


if __name__ == "__main__":
    sys.exit(main())
