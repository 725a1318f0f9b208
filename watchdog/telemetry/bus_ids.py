"""Made-up PCI bus ids for GPUs that have none of their own: the simulation's, and a replayed
recording's (an nvidia-smi CSV names no bus). Stable across runs, so a real kernel line written to
``/dev/kmsg`` - ``NVRM: Xid (PCI:0000:61:00): 79, ...`` - reaches simulated GPU 3 (docs/health.md)."""

from __future__ import annotations

#: The PCI buses of an 8-GPU HGX board, in NVML's spelling: GPU ``g`` sits on the ``g % 8``-th, in PCI
#: domain ``g // 8`` (a second board's worth of GPUs).
SIM_BUSES = (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF)


def sim_bus_id(gpu: int) -> str:
    """The made-up PCI bus id of GPU ``gpu`` (``00000000:1B:00.0`` for GPU 0, ``00000000:61:00.0`` for 3)."""
    domain, slot = divmod(gpu, len(SIM_BUSES))
    return f"{domain:08X}:{SIM_BUSES[slot]:02X}:00.0"


__all__ = ["SIM_BUSES", "sim_bus_id"]
