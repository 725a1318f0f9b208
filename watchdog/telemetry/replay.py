"""``replay``: an nvidia-smi CSV recording played back as live telemetry (tests and demos).

The recording is loaded once, through the chunked reader (:mod:`gpu_triage.recordings.nvsmi_csv`), and
held in memory as per-GPU arrays. Time is mapped, not slept: the first :meth:`ReplaySource.sample`
call anchors the recording's first timestamp (plus ``start_s``) to the caller's clock, and every later
call at ``now_s`` answers with each GPU's latest recorded row at or before recording time

    first + start_s + (now_s - anchor) * speed

stamped ``time_s = now_s``. With ``loop=True`` the recording restarts after its last rows have been
shown for one sampling interval; otherwise the last rows are repeated forever. A GPU whose first row
comes a few milliseconds after the snapshot's first row answers with that first row rather than with
nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gpu_triage.model.limits import power_limit_problem
from gpu_triage.model.samples import GpuInfo, GpuSample, TelemetryUnavailable
from gpu_triage.recordings.nvsmi_csv import NvsmiCsvReader, RecordingError
from gpu_triage.recordings.values import impossible_power_limit
from gpu_triage.telemetry.bus_ids import sim_bus_id


def _value(array: np.ndarray, row: int) -> float | None:
    value = float(array[row])
    return None if math.isnan(value) else value


class ReplaySource:
    """A :class:`~gpu_triage.model.samples.TelemetrySource` reading a recorded nvidia-smi CSV."""

    name = "replay"

    def __init__(
        self,
        path: str | Path,
        *,
        gpus: int | None = None,
        speed: float = 1.0,
        loop: bool = True,
        start_s: float | None = None,
    ) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be positive, not {speed}")
        if start_s is not None and start_s < 0:
            raise ValueError(f"start_s must not be negative, not {start_s}")
        try:
            reader = NvsmiCsvReader(path, gpus=gpus)
            chunk = reader.read_all()
        except RecordingError as error:
            raise TelemetryUnavailable(f"replay: {error}") from error
        except OSError as error:
            raise TelemetryUnavailable(f"replay: cannot read {path}: {error.strerror or error}") from error
        impossible_w = impossible_power_limit(chunk.power_limit_w)  # every row (the header's value too)
        if impossible_w is not None:
            raise TelemetryUnavailable(f"replay: {path}: power.limit: {power_limit_problem(impossible_w)}")
        self.path = Path(path)
        self.header = reader.header
        self.warnings = list(reader.warnings)
        self.speed = float(speed)
        self.loop = loop
        self.start_s = float(start_s or 0.0)
        self._chunk = chunk
        self._anchor_s: float | None = None
        self._closed = False

        gpu_count = self.header.gpus
        self._rows: list[np.ndarray] = []
        self._times: list[np.ndarray] = []
        for gpu in range(gpu_count):
            rows = np.flatnonzero(chunk.gpu == gpu)
            rows = rows[np.argsort(chunk.time_s[rows], kind="stable")]
            self._rows.append(rows)
            self._times.append(chunk.time_s[rows])
        self.first_s = float(np.min(chunk.time_s))
        self.last_s = float(np.max(chunk.time_s))
        interval_s = [np.median(np.diff(t)) for t in self._times if len(t) > 1]
        #: Seconds between snapshots (median over GPUs); the last rows are held this long before looping.
        self.interval_s = float(np.median(interval_s)) if interval_s else 1.0
        #: Length of one loop of the recording, in recording seconds.
        self.period_s = (self.last_s - self.first_s) + self.interval_s

        names = self.header.gpu_names
        self._infos = []
        for gpu in range(gpu_count):
            rows = self._rows[gpu]
            limits = chunk.power_limit_w[rows]
            limit = (
                float(np.nanpercentile(limits, 50, method="lower"))
                if np.isfinite(limits).any()
                else self.header.power_limit_w
            )
            totals = chunk.memory_total_bytes[rows]
            total = float(totals[np.isfinite(totals)][0]) if np.isfinite(totals).any() else None
            name = (names[gpu] if names else "") or "unknown"
            self._infos.append(
                GpuInfo(
                    gpu=gpu,
                    name=name,
                    power_limit_w=limit,
                    memory_total_bytes=total,
                    pci_bus_id=sim_bus_id(gpu),  # the CSV names no bus: the simulation's made-up ones
                )
            )

    def gpus(self) -> list[GpuInfo]:
        return list(self._infos)

    def recording_time_s(self, now_s: float) -> float:
        """The recording's timestamp that ``now_s`` maps to (anchors the clock on first use)."""
        if self._anchor_s is None:
            self._anchor_s = now_s
        offset_s = self.start_s + max(0.0, now_s - self._anchor_s) * self.speed
        if self.loop:
            offset_s %= self.period_s
        return self.first_s + offset_s

    def sample(self, now_s: float) -> list[GpuSample]:
        if self._closed:
            raise RuntimeError("sample() on a closed ReplaySource")
        at_s = self.recording_time_s(now_s)
        chunk = self._chunk
        samples = []
        for gpu, info in enumerate(self._infos):
            times = self._times[gpu]
            if len(times) == 0:
                samples.append(
                    GpuSample(
                        gpu=gpu,
                        time_s=now_s,
                        name=info.name,
                        pci_bus_id=info.pci_bus_id,
                        error="no rows in the recording",
                    )
                )
                continue
            position = max(int(np.searchsorted(times, at_s, side="right")) - 1, 0)
            row = int(self._rows[gpu][position])
            samples.append(
                GpuSample(
                    gpu=gpu,
                    time_s=now_s,
                    power_w=_value(chunk.power_w, row),
                    utilization_ratio=_value(chunk.utilization_ratio, row),
                    memory_used_bytes=_value(chunk.memory_used_bytes, row),
                    memory_total_bytes=_value(chunk.memory_total_bytes, row),
                    sm_clock_mhz=_value(chunk.sm_clock_mhz, row),
                    temperature_c=_value(chunk.temperature_c, row),
                    power_limit_w=_value(chunk.power_limit_w, row),
                    name=info.name,
                    pci_bus_id=info.pci_bus_id,
                )
            )
        return samples

    def close(self) -> None:
        self._closed = True
