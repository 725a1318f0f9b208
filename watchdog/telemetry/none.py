"""The ``none`` source: no GPU telemetry at all.

For nodes without an NVIDIA driver (or where NVML is not wanted): the daemon then judges jobs from
progress files and process signals alone. It lists no GPUs and every sample is empty - an honest
"nothing to report", never simulated data.
"""

from __future__ import annotations

from gpu_triage.model.samples import GpuInfo, GpuSample

__all__ = ["NoneSource"]


class NoneSource:
    """A :class:`~gpu_triage.model.samples.TelemetrySource` with no GPUs."""

    name = "none"

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason
        """Why there is no GPU telemetry (e.g. the NVML error that made ``auto`` fall back), for logs
        and the status API."""

    def gpus(self) -> list[GpuInfo]:
        return []

    def sample(self, now_s: float) -> list[GpuSample]:
        return []

    def close(self) -> None:
        """Nothing to release."""
