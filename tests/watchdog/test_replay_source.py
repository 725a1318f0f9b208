"""ReplaySource: a recorded nvidia-smi CSV played back on the caller's clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_triage.model.samples import TelemetrySource, TelemetryUnavailable
from gpu_triage.telemetry.replay import ReplaySource
from tests.conftest import require_traces

MIB = float(1 << 20)


def recording(tmp_path: Path, snapshots: int = 5) -> Path:
    """2 GPUs, a snapshot every second (GPU 1 logged 3 ms after GPU 0); snapshot s, GPU g reads
    100 + 10 s + g W at (10 s + g) % and 1000 + s MiB."""
    lines = [
        "timestamp, index, name, power.draw [W], power.limit [W], utilization.gpu [%], memory.used [MiB], "
        "memory.total [MiB]"
    ]
    for s in range(snapshots):
        for g in range(2):
            lines.append(
                f"2025/07/27 00:00:{s:02d}.00{3 * g}, {g}, NVIDIA H200, {100 + 10 * s + g:.2f} W, 700.00 W, "
                f"{10 * s + g} %, {1000 + s} MiB, 143771 MiB"
            )
    path = tmp_path / "replay.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def powers(source: ReplaySource, now_s: float) -> list[float | None]:
    return [sample.power_w for sample in source.sample(now_s)]


def test_speed_10_maps_the_clock_onto_the_recording(tmp_path: Path) -> None:
    source = ReplaySource(recording(tmp_path), speed=10.0)
    assert isinstance(source, TelemetrySource) and source.name == "replay"
    assert [info.name for info in source.gpus()] == ["NVIDIA H200", "NVIDIA H200"]
    assert source.gpus()[1].power_limit_w == 700.0 and source.gpus()[0].memory_total_bytes == 143771 * MIB
    assert powers(source, 1000.0) == [100.0, 101.0]  # anchor: GPU 1's first row (3 ms later) is shown
    assert powers(source, 1000.05) == [100.0, 101.0]  # recording +0.5 s
    assert powers(source, 1000.1) == [110.0, 101.0]  # +1.0 s: GPU 1's row comes at +1.003 s
    assert powers(source, 1000.1004) == [110.0, 111.0]
    samples = source.sample(1000.35)  # +3.5 s
    assert [s.power_w for s in samples] == [130.0, 131.0]
    assert [s.time_s for s in samples] == [1000.35, 1000.35]
    assert samples[1].utilization_ratio == 0.31 and samples[1].memory_used_bytes == 1003 * MIB
    assert samples[0].power_limit_w == 700.0 and samples[0].name == "NVIDIA H200" and samples[0].ok


def test_loops_after_the_last_rows_were_held_one_interval(tmp_path: Path) -> None:
    source = ReplaySource(recording(tmp_path), speed=10.0)
    assert source.period_s == pytest.approx(5.003)  # rows over 4.003 s + a 1 s interval
    source.sample(1000.0)
    assert powers(source, 1000.5) == [140.0, 141.0]  # +5.0 s: the last snapshot still holds
    assert powers(source, 1000.501) == [100.0, 101.0]  # +5.01 s: from the top
    assert powers(source, 1000.62) == [110.0, 111.0]  # +6.2 s = 1.197 s into the second loop
    assert powers(source, 1010.0) == [140.0, 141.0]  # +100 s = 19 loops + 4.943 s


def test_without_loop_the_last_rows_repeat(tmp_path: Path) -> None:
    source = ReplaySource(recording(tmp_path), speed=10.0, loop=False)
    source.sample(50.0)
    assert powers(source, 52.0) == [140.0, 141.0]
    assert powers(source, 5000.0) == [140.0, 141.0]


def test_start_s_skips_into_the_recording(tmp_path: Path) -> None:
    source = ReplaySource(recording(tmp_path), start_s=2.0)
    assert powers(source, 7.0) == [120.0, 111.0]  # GPU 1's snapshot-2 row is 3 ms later
    assert powers(source, 8.5) == [130.0, 131.0]
    assert powers(source, 6.0) == [120.0, 111.0]  # a clock going backwards stays at the anchor


def test_missing_or_malformed_file_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TelemetryUnavailable, match="cannot read"):
        ReplaySource(tmp_path / "absent.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "timestamp, power.draw [W]\n2025/07/27 00:00:00.000, 5 W\n2025/07/27 00:00:01.000, five W\n"
    )
    with pytest.raises(TelemetryUnavailable) as error:
        ReplaySource(bad, gpus=1)
    assert f"{bad}:3:2: power.draw" in str(error.value)
    with pytest.raises(ValueError):
        ReplaySource(bad, speed=0)


def test_missing_values_are_none(tmp_path: Path) -> None:
    path = tmp_path / "na.csv"
    path.write_text("timestamp, power.draw [W], utilization.gpu [%]\n2025/07/27 00:00:00.000, [N/A], 5 %\n")
    sample = ReplaySource(path, gpus=1).sample(0.0)[0]
    assert sample.power_w is None and sample.utilization_ratio == 0.05 and not sample.ok
    assert sample.memory_used_bytes is None and sample.name == "unknown"


def test_real_h100_trace_replays_eight_gpus() -> None:
    source = ReplaySource(require_traces() / "h100-8gpu-ckpt100.csv", speed=100.0)
    assert len(source.gpus()) == 8
    first = source.sample(0.0)
    assert [s.gpu for s in first] == list(range(8)) and all(s.ok for s in first)
    assert first[0].power_w == 72.36 and first[0].memory_used_bytes == 131 * MIB
    later = source.sample(2.0)  # 200 s into the run: training at ~550 W between two checkpoints
    assert all(s.power_w > 300 for s in later)
    source.close()
    with pytest.raises(RuntimeError):
        source.sample(4.0)
