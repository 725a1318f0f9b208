"""Triage reads a recording once: the sampling intervals (the gap cap) come from the rows the reader
already parsed for its header, not from a second reader over the file's first MiB - with the same
answer, including where a short positional file ends mid-snapshot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_triage.recordings import nvsmi_csv, parse
from gpu_triage.triage import engine
from gpu_triage.triage.engine import TriageOptions, triage_file

HEADER = "timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]\n"


def _recording(path: Path, snapshots: int, gpus: int, cut: int = 0, seed: int = 0) -> Path:
    """Positional rows (no index column), snapshots 100-300 ms apart, the last one cut to ``cut``
    rows when ``cut`` is given."""
    rng = np.random.default_rng(seed)
    gaps_ms = rng.integers(100, 300, snapshots)
    lines = []
    t_ms = 45_155
    for s in range(snapshots):
        t_ms += int(gaps_ms[s])
        for g in range(gpus):
            second, ms = divmod(t_ms + g, 1000)
            minute, second = divmod(second, 60)
            hour, minute = divmod(minute, 60)
            power = 550.0 + 10 * rng.standard_normal() if (s // 300) % 2 else 150.0 + rng.standard_normal()
            util = 90 if (s // 300) % 2 else 100
            stamp = f"2025/07/27 {hour:02d}:{minute:02d}:{second:02d}.{ms:03d}"
            lines.append(f"{stamp}, {power:.2f} W, {util} %, 0 MiB")
    if cut:
        lines = lines[: len(lines) - gpus + cut]
    path.write_text(HEADER + "\n".join(lines) + "\n")
    return path


def _count_readers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    real = nvsmi_csv.NvsmiCsvReader.__init__

    def counting(self: nvsmi_csv.NvsmiCsvReader, *args: object, **kw: object) -> None:
        made.append(1)
        real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(nvsmi_csv.NvsmiCsvReader, "__init__", counting)
    return made


OPTS = TriageOptions(model="H100", gpus=4, power_limit_w=700.0, chunk_bytes=256 << 10)


def test_a_recording_is_read_by_one_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _recording(tmp_path / "long.csv", 12_000, gpus=4)  # ~2.5 MB: more than the header's MiB
    assert path.stat().st_size > 2 * nvsmi_csv.PROBE_BYTES
    made = _count_readers(monkeypatch)
    result = triage_file(path, OPTS)
    assert len(made) == 1
    again = engine._triage(str(path), OPTS, None, head_again=True)
    assert again is not None
    assert result.to_json() == again.to_json()


@pytest.mark.parametrize("cut", [0, 1, 3])
def test_a_short_positional_recording_measures_its_head_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    """A file inside the header's MiB whose last snapshot is cut: the header's rows then differ from
    the first chunk the intervals were always measured on (it lacks the cut rows), so triage
    measures them again."""
    path = _recording(tmp_path / "short.csv", 2_000, gpus=4, cut=cut, seed=cut)
    assert path.stat().st_size < nvsmi_csv.PROBE_BYTES
    made = _count_readers(monkeypatch)
    result = triage_file(path, OPTS)
    # cut: the header's reader, then a second pass, its reader of the head and the --gpus check's
    # reader (the rows do not divide by --gpus); complete snapshots: one reader
    assert len(made) == (4 if cut else 1)
    again = engine._triage(str(path), OPTS, None, head_again=True)
    assert again is not None
    assert result.to_json() == again.to_json()


def test_triage_hands_the_gil_over_quickly_while_reading_ahead_and_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader thread waits for the GIL after each numpy call: triage shortens the interpreter's
    switch interval while it runs, and gives the caller's back."""
    import sys

    path = _recording(tmp_path / "r.csv", 400, gpus=4)
    seen: list[float] = []
    real = engine._triage

    def spy(*args: object, **kw: object) -> object:
        seen.append(sys.getswitchinterval())
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_triage", spy)
    monkeypatch.setattr(engine, "READ_AHEAD", True)  # whatever this machine's CPUs would choose
    before = sys.getswitchinterval()
    triage_file(path, OPTS)
    assert seen and all(s <= engine.GIL_SWITCH_S for s in seen)
    assert sys.getswitchinterval() == before
    monkeypatch.setattr(engine, "READ_AHEAD", False)
    seen.clear()
    triage_file(path, OPTS)
    assert seen == [before]


@pytest.mark.parametrize(
    ("cpus", "reads_ahead", "direct_first"), [(1, False, True), (2, True, False), (64, True, False)]
)
def test_by_default_two_cpus_read_ahead_through_arrow_and_one_decodes_directly_on_one_thread(
    monkeypatch: pytest.MonkeyPatch, cpus: int, reads_ahead: bool, direct_first: bool
) -> None:
    """Arrow parses on its own threads without the GIL: with a second CPU it and the read-ahead win the
    wall time; on one CPU the threads only take turns and the direct decoder on one thread wins. A
    setting of either flag overrides the choice."""
    monkeypatch.setattr(engine, "READ_AHEAD", None)
    monkeypatch.setattr(parse, "DIRECT", None)
    monkeypatch.setattr(engine, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(parse, "usable_cpus", lambda: cpus)
    assert engine._reads_ahead() is reads_ahead
    assert parse.direct_first() is direct_first
    monkeypatch.setattr(engine, "READ_AHEAD", not reads_ahead)
    monkeypatch.setattr(parse, "DIRECT", not direct_first)
    assert engine._reads_ahead() is not reads_ahead
    assert parse.direct_first() is not direct_first
