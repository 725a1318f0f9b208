"""Telemetry sources: NVML, replayed nvidia-smi recordings, a scripted simulation, or none."""
