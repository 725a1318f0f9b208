"""Triage one recording: read it in chunks, classify every GPU's samples (state carried across
chunks), account the time in each state, and apply the power-only deadlock rule.

Accounting follows the contract: each sample holds until that GPU's next sample, gaps capped at twice
the median sampling interval (measured on the head of the file, so the answer does not depend on the
chunk size); ``states_s`` sums GPU-seconds. A state's segment starts where its signature began (the
classifier dates a change back to the first sample of the run that caused it).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpu_triage.classify.bands import CODE
from gpu_triage.classify.hysteresis import Carry, classify_series
from gpu_triage.classify.power_table import PowerTable, TableError
from gpu_triage.classify.table_files import match_model, resolve_table
from gpu_triage.model.limits import MAX_GPUS, power_limit_problem
from gpu_triage.model.states import GPU_STATES, GpuState
from gpu_triage.recordings.nvsmi_csv import PROBE_BYTES, NvsmiCsvReader, RecordingError, RecordingHeader
from gpu_triage.recordings.parse import usable_cpus
from gpu_triage.recordings.read_ahead import read_ahead
from gpu_triage.recordings.values import impossible_power_limit
from gpu_triage.triage import DEFAULT_DEADLOCK_AFTER_S
from gpu_triage.triage.bursts import Bursts, BurstTracker
from gpu_triage.triage.deadlock_rule import Cadence, DeadlockFinding, Wait, analyse

READ_AHEAD: bool | None = None
"""Read the next chunk on a thread while classifying the last: True; False (one thread; the benchmark's
baseline); None, the default: where the process may use two CPUs or more (on one, the two threads only
take turns: 3.6 M rows/s against 3.9 M on one thread, ``taskset -c 0``)."""
GIL_SWITCH_S = 0.0005
"""The interpreter's switch interval while triage reads ahead (see _quick_gil_handover)."""
#: Points kept per GPU for the plot (evenly thinned).
PLOT_POINTS_PER_GPU = 6000
_HEAD_INTERVALS = 2000
#: GPU indices as sort keys: numpy sorts 16-bit keys by radix, 2-3x faster than int32 ones.
_GPU_KEY = np.int16 if np.iinfo(np.int16).max >= MAX_GPUS else np.int32


class TriageInputError(ValueError):
    """Bad input for triage (unknown model, no power limit...); the CLI exits 2 with this message."""


@dataclass(frozen=True, slots=True)
class TriageOptions:
    model: str | None = None
    gpus: int | None = None
    power_limit_w: float | None = None
    deadlock_after_s: float = DEFAULT_DEADLOCK_AFTER_S
    table_path: str | None = None
    chunk_bytes: int = 16 << 20
    keep_plot_points: bool = False
    columns: tuple[str, ...] | None = None
    """The --query-gpu field list of a recording without a header line (``--format=csv,noheader``)."""


@dataclass(slots=True)
class _GpuTrack:
    carry: Carry | None = None
    last_t: float | None = None
    pos: float = 0.0
    """Covered seconds up to the last sample (capped gaps)."""
    samples: int = 0
    switches: list[tuple[float, float, GpuState]] = field(default_factory=list)
    plot_t: list[np.ndarray] = field(default_factory=list)
    plot_p: list[np.ndarray] = field(default_factory=list)
    plot_u: list[np.ndarray] = field(default_factory=list)
    bursts: BurstTracker | None = None


@dataclass
class TriageResult:
    file: str
    model: str
    table: PowerTable
    power_limit_w: float
    gpus: int
    samples: int
    duration_s: float
    states_s: dict[str, float]
    per_gpu_states_s: list[dict[str, float]]
    segments: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]
    deadlock_after_s: float
    warnings: list[str]
    start_time: float
    """Epoch seconds of the first sample (times in the result are relative to it)."""
    plot: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] | None = None
    """Per GPU: thinned (time_s, power_w, state code, utilization_ratio) for plotting."""
    waits: list[Wait] = field(default_factory=list)
    """Spin episodes, one per GPU group and stretch without a compute burst (deadlock_rule)."""
    cadences: list[tuple[tuple[int, ...], Cadence]] = field(default_factory=list)
    """Per GPU group: the cadence of the waits it came back from."""
    bursts: list[Bursts] = field(default_factory=list)

    @property
    def deadlock(self) -> bool:
        return bool(self.verdicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "model": self.model,
            "power_limit_w": self.power_limit_w,
            "gpus": self.gpus,
            "samples": self.samples,
            "duration_s": round(self.duration_s, 3),
            "states_s": {k: round(v, 3) for k, v in self.states_s.items()},
            "segments": self.segments,
            "verdicts": self.verdicts,
            "per_gpu_states_s": [{k: round(v, 3) for k, v in d.items()} for d in self.per_gpu_states_s],
            "deadlock_after_s": self.deadlock_after_s,
            "table": self.table.path,
            "start_time": self.start_time,
            "warnings": self.warnings,
            "spin_episodes": [w.to_json() for w in self.waits],
            "cadences": [{"gpus": list(g), **c.to_json()} for g, c in self.cadences],
            "bursts": [len(b) for b in self.bursts],
        }


def _pick_table(
    opts: TriageOptions, header_names: tuple[str, ...] | None, header_limit_w: float | None
) -> tuple[PowerTable, float]:
    device = header_names[0] if header_names else None
    try:
        table = resolve_table(model=opts.model, device_name=device, path=opts.table_path)
    except TableError as e:
        raise TriageInputError(str(e)) from None
    limit = opts.power_limit_w or header_limit_w or table.power_limit_w
    if not limit:
        named = (
            f"the file names the GPU {device!r}, which no table matches"
            if device
            else "the file does not name the GPU model"
        )
        raise TriageInputError(
            f"{named}: pass --model (one of B300, B200, H200, H100, A100) or "
            "--power-limit WATTS for the generic table"
        )
    # A capped node keeps its spin band in watts (PowerTable.at_limit); a table without a reference
    # limit (generic) only takes the limit.
    return table.at_limit(float(limit)), float(limit)


def _reader(path: str, gpus: int | None, chunk_bytes: int, columns: tuple[str, ...] | None) -> NvsmiCsvReader:
    try:
        return NvsmiCsvReader(path, gpus=gpus, chunk_bytes=chunk_bytes, columns=columns)
    except RecordingError:
        raise
    except ValueError as e:  # a bad columns= list, --gpus out of bounds
        text = str(e)
        if text.startswith("columns= "):
            text = "--columns: " + text.removeprefix("columns= ")
        raise TriageInputError(text) from None


def _median_intervals(
    path: str, gpus: int | None, columns: tuple[str, ...] | None = None
) -> tuple[int, np.ndarray]:
    """Median sampling interval per GPU from the head of the file (chunk-size independent), read
    again: the first chunk of a reader with 1 MiB chunks (see :func:`_head_intervals`)."""
    reader = _reader(path, gpus, PROBE_BYTES, columns)
    for chunk in reader.chunks():
        return reader.header.gpus, _intervals(chunk.gpu, chunk.time_s, reader.header.gpus)
    return reader.header.gpus, _intervals(np.zeros(0, np.int32), np.zeros(0), reader.header.gpus)


def _head_intervals(reader: NvsmiCsvReader) -> tuple[int, np.ndarray]:
    """:func:`_median_intervals` from the rows the reader already parsed for its header (the file
    read once): the same rows unless the reader says otherwise (``head``), which the caller checks
    once it knows how many rows follow."""
    gpu, time_s = reader.head
    return reader.header.gpus, _intervals(gpu, time_s, reader.header.gpus)


def _intervals(gpu: np.ndarray, time_s: np.ndarray, n: int) -> np.ndarray:
    """Per GPU, the median of the positive gaps between its first samples."""
    med = np.full(n, np.nan)
    for g in range(n):
        t = time_s[gpu == g][: _HEAD_INTERVALS + 1]
        d = np.diff(t)
        d = d[d > 0]
        if len(d):
            med[g] = float(np.median(d))
    fallback = np.nanmedian(med) if np.isfinite(med).any() else 1.0
    med[~np.isfinite(med)] = fallback
    return med


def _check_options(opts: TriageOptions) -> None:
    """Numbers a caller passes must be finite: a NaN deadline or limit would hide every deadlock."""
    for name in ("deadlock_after_s", "power_limit_w"):
        value = getattr(opts, name)
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise TriageInputError(f"{name}: expected a finite number above 0, got {value!r}")
    if opts.power_limit_w is not None and power_limit_problem(opts.power_limit_w) is not None:
        raise TriageInputError(f"--power-limit: {power_limit_problem(opts.power_limit_w)}")


def triage_file(
    path: str | Path, opts: TriageOptions = TriageOptions(), progress: Callable[[int], None] | None = None
) -> TriageResult:
    """Triage one recording. Raises RecordingError / TriageInputError on bad input."""
    _check_options(opts)
    with _quick_gil_handover():
        result = _triage(str(path), opts, progress, head_again=False)
        if result is None:  # a short positional file cut mid-snapshot: measure its head as it always was
            result = _triage(str(path), opts, None, head_again=True)
    assert result is not None
    return result


def _reads_ahead() -> bool:
    return READ_AHEAD if READ_AHEAD is not None else usable_cpus() >= 2


@contextlib.contextmanager
def _quick_gil_handover() -> Iterator[None]:
    """With the read-ahead, the reader thread needs the GIL back after each of its numpy calls, which
    the classifier (Python over state changes) holds until the interpreter's switch interval asks it
    to let go: 5 ms by default, :data:`GIL_SWITCH_S` while triage runs (restored after). Measured on
    the 4.8 M-row benchmark file (2-core machine, shared): best of 3 1.09 s against 1.23 s, and 1.31 s
    against 1.43 s in a second run with more load; CPU time unchanged."""
    before = sys.getswitchinterval()
    if _reads_ahead():
        sys.setswitchinterval(min(before, GIL_SWITCH_S))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _triage(
    path: str, opts: TriageOptions, progress: Callable[[int], None] | None, head_again: bool
) -> TriageResult | None:
    """:func:`triage_file`, with the sampling intervals measured on the rows the reader parsed for its
    header (``head_again=False``: the file read once; None when those rows may differ from the first
    chunk of a 1 MiB reader - rows are GPUs by position, fewer than gpus - 1 rows follow them and
    the last snapshot was cut - and the caller asks again), or on the first chunk of a second reader
    (``head_again=True``)."""
    reader = _reader(path, opts.gpus, opts.chunk_bytes, opts.columns)
    header = reader.header
    if header.power_limit_w is not None and power_limit_problem(header.power_limit_w) is not None:
        raise TriageInputError(f"{path}: power.limit: {power_limit_problem(header.power_limit_w)}")
    table, limit_w = _pick_table(opts, header.gpu_names, header.power_limit_w)
    model = (
        table.model
        if table.model != "generic"
        else (match_model(header.gpu_names[0]) if header.gpu_names else None) or "generic"
    )
    if head_again:
        n_gpus, med = _median_intervals(path, header.gpus, opts.columns)
    else:
        n_gpus, med = _head_intervals(reader)
    cap = 2.0 * med
    spin = table.band(GpuState.CHECKPOINT_OR_DEADLOCK)
    tracks = [_GpuTrack(bursts=BurstTracker(spin.power_max, spin.margin_power)) for _ in range(n_gpus)]
    t0: float | None = None
    total = 0
    thin = 1
    if opts.keep_plot_points:
        est_rows = max(1, header.size_bytes // 40)
        thin = max(1, est_rows // max(1, n_gpus * PLOT_POINTS_PER_GPU))
    use_file_limit = opts.power_limit_w is None

    # the reader parses the next chunk while this thread classifies the last one (recordings.read_ahead)
    for chunk in read_ahead(reader.chunks()) if _reads_ahead() else reader.chunks():
        n = len(chunk.gpu)
        if n == 0:
            continue
        if t0 is None:
            t0 = float(np.nanmin(chunk.time_s))
        total += n
        order = np.argsort(chunk.gpu.astype(_GPU_KEY), kind="stable")
        gpu_sorted = chunk.gpu[order]
        bounds = np.searchsorted(gpu_sorted, np.arange(n_gpus + 1))
        t_all = chunk.time_s[order] - t0
        p_all = chunk.power_w[order]
        u_all = chunk.utilization_ratio[order]
        if use_file_limit and np.isfinite(chunk.power_limit_w).any():
            impossible_w = impossible_power_limit(chunk.power_limit_w)
            if impossible_w is not None:
                raise TriageInputError(f"{path}: power.limit: {power_limit_problem(impossible_w)}")
            lim_all = np.where(np.isfinite(chunk.power_limit_w[order]), chunk.power_limit_w[order], limit_w)
        else:
            lim_all = None
        for g in range(n_gpus):
            a, b = int(bounds[g]), int(bounds[g + 1])
            if a == b:
                continue
            tr = tracks[g]
            t = t_all[a:b]
            floor = tr.last_t if tr.last_t is not None else -np.inf
            t = np.maximum.accumulate(np.maximum(t, floor))  # clock glitches: never go back in time
            lim = limit_w if lim_all is None else lim_all[a:b]
            pf = p_all[a:b] / lim
            u = u_all[a:b]
            gaps = np.diff(t, prepend=t[0] if tr.last_t is None else tr.last_t)
            gaps = np.minimum(gaps, cap[g])
            pos = tr.pos + np.cumsum(gaps)
            switches, tr.carry = classify_series(table, t, pf, u, tr.carry, pos)
            assert tr.bursts is not None
            tr.bursts.feed(t, pf)
            tr.switches.extend((s.since_s, s.since_pos, s.state) for s in switches)
            tr.last_t = float(t[-1])
            tr.pos = float(pos[-1])
            tr.samples += b - a
            if opts.keep_plot_points:
                tr.plot_t.append(t[::thin].copy())
                tr.plot_p.append(p_all[a:b][::thin].copy())
                tr.plot_u.append(u[::thin].copy())
        if progress is not None:
            progress(chunk.end_offset)

    if t0 is None:
        raise RecordingError(path, 1, 1, "the recording has no samples")
    # the header's rows are the first 1 MiB chunk but where a cut last snapshot came that close
    after_head = total + reader.dropped_rows - len(reader.head[0])
    if not head_again and reader.positional and reader.dropped_rows and after_head < n_gpus - 1:
        return None
    _check_snapshots(path, header, total + reader.dropped_rows, opts.columns)
    end_s = max((tr.last_t for tr in tracks if tr.last_t is not None), default=0.0)
    states_s, per_gpu, segments, band_intervals, gpu_segments = _tally(tracks)
    segments.sort(key=lambda s: (s["start_s"], s["gpu"]))
    # an interval reaching the last sample of every GPU is still open at the end of the recording
    open_end = min((tr.last_t for tr in tracks if tr.last_t is not None), default=end_s)
    bursts = [tr.bursts.finish() if tr.bursts is not None else Bursts() for tr in tracks]
    rule = analyse(band_intervals, open_end, opts.deadlock_after_s, gpu_segments, bursts)
    verdicts = _verdict_dicts(rule.findings)
    plot = _plot_points(tracks) if opts.keep_plot_points else None
    return TriageResult(
        file=path,
        model=model,
        table=table,
        power_limit_w=limit_w,
        gpus=n_gpus,
        samples=total,
        duration_s=end_s,
        states_s=states_s,
        per_gpu_states_s=per_gpu,
        segments=segments,
        verdicts=verdicts,
        deadlock_after_s=opts.deadlock_after_s,
        warnings=list(reader.warnings),
        start_time=t0,
        plot=plot,
        waits=rule.waits,
        cadences=rule.cadences,
        bursts=bursts,
    )


def _verdict_dicts(findings: Sequence[DeadlockFinding]) -> list[dict[str, Any]]:
    """The power-only rule's findings as the report's ``verdicts``."""
    return [
        {
            "verdict": "deadlock",
            "confidence": "suspected",
            "gpus": list(f.gpus),
            "onset_s": round(f.onset_s, 3),
            "detected_s": round(f.detected_s, 3),
            "ended_s": None if f.ended_s is None else round(f.ended_s, 3),
            "departed_from_cadence_s": (
                None if f.departed_from_cadence_s is None else round(f.departed_from_cadence_s, 3)
            ),
            "cadence": None if f.cadence is None else f.cadence.to_json(),
            "evidence": list(f.evidence),
        }
        for f in findings
    ]


def _tally(
    tracks: list[_GpuTrack],
) -> tuple[
    dict[str, float],
    list[dict[str, float]],
    list[dict[str, Any]],
    list[list[tuple[float, float]]],
    list[list[tuple[float, float, str]]],
]:
    """From each GPU's switches: seconds per state (all GPUs, and per GPU), the segments, each GPU's
    intervals in the checkpoint-or-deadlock band, and each GPU's (start, end, state) segments."""
    states_s = {str(s): 0.0 for s in GPU_STATES}
    per_gpu: list[dict[str, float]] = []
    segments: list[dict[str, Any]] = []
    band_intervals: list[list[tuple[float, float]]] = []
    gpu_segments: list[list[tuple[float, float, str]]] = []
    for g, tr in enumerate(tracks):
        mine = {str(s): 0.0 for s in GPU_STATES}
        spans: list[tuple[float, float]] = []
        mine_segments: list[tuple[float, float, str]] = []
        sw = tr.switches
        for i, (since_s, since_pos, state) in enumerate(sw):
            end_t, end_pos = (sw[i + 1][0], sw[i + 1][1]) if i + 1 < len(sw) else (tr.last_t or 0.0, tr.pos)
            mine[str(state)] += end_pos - since_pos
            segments.append(
                {"gpu": g, "state": str(state), "start_s": round(since_s, 3), "end_s": round(end_t, 3)}
            )
            mine_segments.append((since_s, end_t, str(state)))
            if state is GpuState.CHECKPOINT_OR_DEADLOCK:
                spans.append((since_s, end_t))
        for k, v in mine.items():
            states_s[k] += v
        per_gpu.append(mine)
        band_intervals.append(spans)
        gpu_segments.append(mine_segments)
    return states_s, per_gpu, segments, band_intervals, gpu_segments


def _plot_points(tracks: list[_GpuTrack]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per GPU, the thinned (time, power, state code, utilization) points kept for the plot."""
    plot = []
    for tr in tracks:
        t = np.concatenate(tr.plot_t) if tr.plot_t else np.empty(0)
        p = np.concatenate(tr.plot_p) if tr.plot_p else np.empty(0)
        u = np.concatenate(tr.plot_u) if tr.plot_u else np.empty(0)
        since = np.array([s[0] for s in tr.switches])
        codes = np.array([CODE[s[2]] for s in tr.switches], dtype=np.int8)
        idx = np.searchsorted(since, t, side="right") - 1
        state_codes = codes[np.clip(idx, 0, None)] if len(codes) else np.zeros(len(t), np.int8)
        plot.append((t, p, state_codes, u))
    return plot


def _check_snapshots(path: str, header: RecordingHeader, rows: int, columns: tuple[str, ...] | None) -> None:
    """Without an index (or uuid) column a row's GPU is its position in the snapshot, so a caller's
    --gpus must divide the rows: otherwise every "GPU" would be a mix of real ones. Rows that divide
    but for the last snapshot are a logger stopped mid-snapshot (the reader dropped that snapshot with
    a warning) unless the first rows suggest another GPU count: then --gpus is wrong."""
    gpus = header.gpus
    positional = not header.has_index and not {"uuid", "pci.bus_id"} & set(header.columns)
    if header.gpus_from != "caller" or not positional or gpus <= 1 or rows % gpus == 0:
        return
    try:
        suggested: int | None = _reader(path, None, 1 << 20, columns).header.gpus
    except (RecordingError, TriageInputError):
        suggested = None
    if suggested is None or suggested == gpus:
        return
    raise TriageInputError(
        f"{path}: --gpus {gpus} does not divide its {rows:,} data rows ({rows:,} = {gpus} x "
        f"{rows // gpus:,} + {rows % gpus}): without an index column every snapshot is one row per GPU, so "
        f"the recording has another GPU count (its timestamps or readings suggest {suggested})"
    )
