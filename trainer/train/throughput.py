"""Throughput accounting: tokens per second, MFU, GPU-hours, and the JSONL metrics log.

**MFU** (model FLOPs utilisation) = achieved model FLOP/s / peak FLOP/s of the devices:
``tokens_per_s * flops_per_token / (devices * peak_flops_per_device)``, with ``flops_per_token`` from
:meth:`ft_trainer.planning.presets.ModelSpec.flops_per_token` (6 N + 12 L d s, PaLM appendix B;
recomputation for gradient checkpointing is not counted, as MFU is usually reported). The peak is the
dense (no sparsity) bf16 tensor-core rate of the GPU, from :data:`PEAK_BF16_DENSE_FLOPS`, or
``metrics.peak_flops_per_device``; on CPU it is measured (:func:`measure_cpu_matmul_flops`) unless
configured.

**GPU-hours** = devices x wall-clock hours since the run started (everything the allocation pays for:
start-up, checkpoints and epoch ends included), carried across resumes.

The arithmetic is pure; :class:`MetricsLog` appends one JSON object per line (rank 0 only).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "PEAK_BF16_DENSE_FLOPS",
    "MetricsLog",
    "ThroughputMeter",
    "gpu_hours",
    "lookup_peak_flops",
    "measure_cpu_matmul_flops",
    "mfu",
    "read_metrics",
]

# Dense bf16 tensor-core peak per GPU (FLOP/s), from NVIDIA's data sheets (the "with sparsity" figures
# halved). SXM parts; a PCIe H100 is slower (756 TFLOPS) - set metrics.peak_flops_per_device for it.
PEAK_BF16_DENSE_FLOPS: dict[str, float] = {
    "B300": 2.25e15,  # HGX B300: FP16/BF16 36 PFLOPS sparse per 8 GPUs = 2.25 PFLOPS dense per GPU
    "B200": 2.25e15,  # HGX B200: same 36 PFLOPS sparse per 8 GPUs
    "H200": 989.4e12,  # H200 SXM: 1,979 TFLOPS sparse
    "H100": 989.4e12,  # H100 SXM: 1,979 TFLOPS sparse
    "A100": 312e12,  # A100 SXM/PCIe: 624 TFLOPS sparse
}


def lookup_peak_flops(device_name: str) -> tuple[str, float] | None:
    """(model, peak) for an NVML/torch device name such as ``NVIDIA H100 80GB HBM3``; None if unknown.
    The longest model name that appears in the device name wins (``H100`` never matches ``H200``)."""
    name = device_name.upper()
    for model in sorted(PEAK_BF16_DENSE_FLOPS, key=len, reverse=True):
        if model in name:
            return model, PEAK_BF16_DENSE_FLOPS[model]
    return None


def mfu(tokens_per_s: float, flops_per_token: float, devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation in 0..1."""
    if devices < 1 or peak_flops_per_device <= 0:
        raise ValueError("devices must be >= 1 and the peak > 0")
    return tokens_per_s * flops_per_token / (devices * peak_flops_per_device)


def gpu_hours(devices: int, wall_s: float) -> float:
    return devices * wall_s / 3600.0


def measure_cpu_matmul_flops(seconds: float = 0.3, size: int = 256) -> float:
    """fp32 matmul FLOP/s this process reaches on CPU with its torch thread setting (the "peak" that
    CPU MFU is reported against; a CPU run's MFU says how close the tiny model gets to plain GEMM)."""
    import torch

    a = torch.randn(size, size)
    b = torch.randn(size, size)
    torch.mm(a, b)  # warm-up
    n = 0
    t0 = time.perf_counter()
    while True:
        torch.mm(a, b)
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return 2.0 * size**3 * n / dt


@dataclass
class ThroughputMeter:
    """Tokens per second over log intervals, MFU and GPU-hours.

    ``tokens_per_step`` counts every rank (global batch x seq_len); ``elapsed_before_s`` is the wall time
    of earlier segments of the run (resumes), so GPU-hours accumulate over the whole run."""

    tokens_per_step: int
    flops_per_token: float
    devices: int
    peak_flops_per_device: float | None  # None: MFU is not reported
    start_s: float
    elapsed_before_s: float = 0.0
    _interval_start_s: float | None = None
    _interval_steps: int = 0

    def start_interval(self, now_s: float) -> None:
        self._interval_start_s = now_s
        self._interval_steps = 0

    def add_step(self) -> None:
        self._interval_steps += 1

    @property
    def interval_steps(self) -> int:
        return self._interval_steps

    def elapsed_s(self, now_s: float) -> float:
        return self.elapsed_before_s + (now_s - self.start_s)

    def close_interval(self, now_s: float) -> dict[str, float | None]:
        """Numbers for the steps since :meth:`start_interval`; starts the next interval at ``now_s``."""
        start = self._interval_start_s if self._interval_start_s is not None else self.start_s
        steps = max(1, self._interval_steps)
        wall_s = max(1e-9, now_s - start)
        tps = steps * self.tokens_per_step / wall_s
        out = {
            "step_time_s": wall_s / steps,
            "tokens_per_s": tps,
            "tokens_per_s_per_device": tps / self.devices,
            "mfu": None
            if self.peak_flops_per_device is None
            else mfu(tps, self.flops_per_token, self.devices, self.peak_flops_per_device),
            "gpu_hours": gpu_hours(self.devices, self.elapsed_s(now_s)),
            "elapsed_s": self.elapsed_s(now_s),
        }
        self.start_interval(now_s)
        return out


class MetricsLog:
    """Append-only JSONL: one object per line, each with ``kind`` and ``time`` (epoch seconds). Written by
    rank 0; a ``None`` path makes every call a no-op (the other ranks)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._f: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)

    def write(self, kind: str, **fields: Any) -> None:
        if self._f is None:
            return
        rec = {"kind": kind, "time": round(time.time(), 3), **fields}
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._f = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics log; a torn last line (the run was killed mid-write) is skipped."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON object") from None
    return out
