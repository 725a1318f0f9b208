"""Scripted sample streams through the classifier: hysteresis, dwell, spikes, and the equivalence of
the streaming (daemon) and vectorised (triage) forms."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.classify.bands import raw_state, raw_states
from gpu_triage.classify.hysteresis import GpuClassifier, classify_series
from gpu_triage.classify.table_files import builtin_table
from gpu_triage.model.states import GPU_STATES, GpuState

H100 = builtin_table("H100")
NAN = math.nan

# (power fraction, utilisation) of typical samples on an H100
COMPUTE = (0.79, 0.92)
SPIN = (0.22, 1.0)
IDLE = (0.10, 0.0)
STARVED = (0.25, 0.35)
COMM = (0.35, 0.95)


def run_stream(samples: list[tuple[float, float, float]], table=H100) -> list[tuple[float, GpuState, float]]:
    """Feed (t, p, u) samples; return (t, state, since) after each."""
    clf = GpuClassifier(table)
    out = []
    for t, p, u in samples:
        clf.update(t, p, u)
        out.append((t, clf.state, clf.since_s))
    return out


def stream(*phases: tuple[tuple[float, float], float], rate_hz: float = 10.0, t0: float = 0.0):
    """Samples for consecutive phases of (point, duration_s)."""
    out, t = [], t0
    for (p, u), dur in phases:
        for _ in range(round(dur * rate_hz)):
            out.append((t, p, u))
            t = round(t + 1 / rate_hz, 9)
    return out


@pytest.mark.parametrize(
    ("point", "state"),
    [
        (COMPUTE, GpuState.COMPUTE),
        (SPIN, GpuState.CHECKPOINT_OR_DEADLOCK),
        (IDLE, GpuState.IDLE),
        (STARVED, GpuState.DATA_STARVATION),
        (COMM, GpuState.COMMUNICATION),
        ((NAN, 0.5), GpuState.UNKNOWN),
        ((0.79, NAN), GpuState.COMPUTE),
        ((0.10, NAN), GpuState.IDLE),
        ((0.22, NAN), GpuState.CHECKPOINT_OR_DEADLOCK),
    ],
)
def test_raw_bands(point, state):
    assert raw_state(H100, *point) is state
    assert GPU_STATES[raw_states(H100, np.array([point[0]]), np.array([point[1]]))[0]] is state


def test_spin_after_compute_is_dated_back_to_its_first_sample():
    out = run_stream(stream((COMPUTE, 10), (SPIN, 10)))
    spin_start = 10.0
    taken = next(t for t, s, _ in out if s is GpuState.CHECKPOINT_OR_DEADLOCK)
    # taken once 80 % of the last dwell (3 s) voted for it: after 2.4 s, not before
    assert 12.35 <= taken <= 12.45
    assert dict((round(t, 1), since) for t, _, since in out)[13.0] == spin_start


def test_with_a_unanimous_vote_the_dwell_is_exact():
    from dataclasses import replace

    out = run_stream(stream((COMPUTE, 10), (SPIN, 10)), replace(H100, vote_share=1.0))
    at = {round(t, 1): (s, since) for t, s, since in out}
    assert at[12.9][0] is GpuState.COMPUTE
    assert at[13.0] == (GpuState.CHECKPOINT_OR_DEADLOCK, 10.0)


def test_bursty_utilisation_settles_where_a_unanimous_vote_never_would():
    """Kernels in bursts: utilisation flickers between 0 and 40 % at 10 Hz at a third of the limit
    (a starved GPU). The vote settles on data_starvation; a unanimous rule stays idle forever."""
    from dataclasses import replace

    rng = np.random.default_rng(3)
    samples = stream((IDLE, 10)) + [
        (10 + i / 10, 0.33 + rng.uniform(-0.02, 0.02), float(rng.choice([0.0, 0.05, 0.2, 0.3, 0.4])))
        for i in range(600)
    ]
    # a flicker into compute every ~second breaks every unbroken run of 5 s
    samples = [(t, 0.45 if i % 9 == 0 and t > 10 else p, u) for i, (t, p, u) in enumerate(samples)]
    assert run_stream(samples)[-1][1] is GpuState.DATA_STARVATION
    assert run_stream(samples, replace(H100, vote_share=1.0))[-1][1] is GpuState.IDLE


def test_single_sample_spike_does_not_change_state():
    samples = stream((SPIN, 5), (COMPUTE, 0.1), (SPIN, 5))
    assert {s for _, s, _ in run_stream(samples)[1:]} == {GpuState.CHECKPOINT_OR_DEADLOCK}


def test_leaving_spin_for_compute_is_quick():
    out = run_stream(stream((SPIN, 20), (COMPUTE, 5)))
    first_compute = next(t for t, s, _ in out if s is GpuState.COMPUTE)
    assert first_compute - 20.0 <= 1.0 + 1e-9


def test_hovering_on_the_compute_boundary_does_not_flap():
    # compute enters at 0.40, exits below 0.35: power wandering 0.37..0.43 stays compute
    rng = np.random.default_rng(1)
    samples = [(i / 10, 0.40 + rng.uniform(-0.03, 0.03), 0.9) for i in range(600)]
    samples = stream((COMPUTE, 5)) + [(5 + t, p, u) for t, p, u in samples]
    states = {s for _, s, _ in run_stream(samples)[50:]}
    assert states == {GpuState.COMPUTE}


def test_hovering_without_hysteresis_would_flap():
    """The previous test can fail: with zero margins the same stream changes state."""
    from dataclasses import replace

    bands = {s: replace(b, margin_power=0.0, margin_util=0.0, dwell_s=0.0) for s, b in H100.bands.items()}
    bare = replace(H100, bands=bands)
    rng = np.random.default_rng(1)
    samples = stream((COMPUTE, 5)) + [(5 + i / 10, 0.40 + rng.uniform(-0.03, 0.03), 0.9) for i in range(600)]
    assert len({s for _, s, _ in run_stream(samples, bare)[50:]}) > 1


def test_failed_reads_become_unknown_only_when_they_persist():
    out = run_stream(stream((COMPUTE, 5), ((NAN, NAN), 0.5), (COMPUTE, 5), ((NAN, NAN), 5)))
    states = [s for _, s, _ in out]
    assert GpuState.UNKNOWN not in states[:105]
    assert states[-1] is GpuState.UNKNOWN


# --- equivalence of the streaming and vectorised forms -------------------------------------------

points = st.sampled_from(
    [
        COMPUTE,
        SPIN,
        IDLE,
        STARVED,
        COMM,
        (0.38, 0.9),
        (0.31, 0.85),
        (0.28, 0.93),
        (NAN, 0.5),
        (0.5, NAN),
        (0.2, NAN),
        (0.1, NAN),
        (0.42, 0.05),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    segs=st.lists(st.tuples(points, st.integers(1, 60)), min_size=1, max_size=25),
    dt=st.sampled_from([0.1, 0.5, 1.0, 0.25]),
    cuts=st.lists(st.integers(0, 2000), max_size=5),
)
def test_vectorised_equals_streaming(segs, dt, cuts):
    pts = [pt for pt, k in segs for _ in range(k)]
    n = len(pts)
    t = np.arange(n) * dt
    p = np.array([a for a, _ in pts], dtype=float)
    u = np.array([b for _, b in pts], dtype=float)
    # streaming
    clf = GpuClassifier(H100)
    expected = []
    for i in range(n):
        if clf.update(float(t[i]), float(p[i]), float(u[i])):
            expected.append((i, clf.state, clf.since_s))
    # vectorised, in chunks
    bounds = sorted({0, n, *(c % (n + 1) for c in cuts)})
    got, carry = [], None
    for a, b in itertools.pairwise(bounds):
        if a == b:
            continue
        sw, carry = classify_series(H100, t[a:b], p[a:b], u[a:b], carry)
        got += [(a + s.index, s.state, s.since_s) for s in sw]
    assert got == expected
    assert carry.state is clf.state and carry.since_s == clf.since_s


def _streamed(t: np.ndarray, p: np.ndarray, u: np.ndarray) -> tuple[list, GpuClassifier]:
    clf = GpuClassifier(H100)
    changes = []
    for i in range(len(t)):
        if clf.update(float(t[i]), float(p[i]), float(u[i])):
            changes.append((i, clf.state, clf.since_s))
    return changes, clf


def _vectorised(t: np.ndarray, p: np.ndarray, u: np.ndarray, cuts: list[int]):
    bounds = sorted({0, len(t), *(c % (len(t) + 1) for c in cuts)})
    got, carry = [], None
    for a, b in itertools.pairwise(bounds):
        if a < b:
            sw, carry = classify_series(H100, t[a:b], p[a:b], u[a:b], carry)
            got += [(a + s.index, s.state, s.since_s) for s in sw]
    return got, carry


@settings(max_examples=400, deadline=None)
@given(
    segs=st.lists(st.tuples(points, st.integers(1, 80)), min_size=1, max_size=30),
    # steps of 0 (one clock read twice), exactly a dwell (1, 2, 3, 5 s), gaps longer than any dwell,
    # and steps whose sums round (0.1); on a clock near zero or at epoch seconds
    steps=st.lists(st.sampled_from([0.0, 0.1, 0.1, 0.1, 0.25, 1.0, 2.0, 3.0, 5.0, 7.5]), min_size=1),
    t0=st.sampled_from([0.0, 1_753_576_485.155]),
    cuts=st.lists(st.integers(0, 3000), max_size=5),
)
def test_vectorised_equals_streaming_on_irregular_clocks(segs, steps, t0, cuts):
    """Repeated timestamps, steps of exactly a dwell and gaps longer than every dwell: where a window
    starts, and whether a sample lies a whole dwell after the last change, are decided at the edges
    (the vectorised form looks samples far from a change up instead of judging them)."""
    pts = [pt for pt, k in segs for _ in range(k)]
    n = len(pts)
    t = t0 + np.cumsum([steps[i % len(steps)] for i in range(n)])
    p = np.array([a for a, _ in pts], dtype=float)
    u = np.array([b for _, b in pts], dtype=float)
    expected, clf = _streamed(t, p, u)
    got, carry = _vectorised(t, p, u, cuts)
    assert got == expected
    assert carry.state is clf.state and carry.since_s == clf.since_s


def test_flickering_candidates_near_every_change_agree():
    """A long noisy stream (a sample in ten from another band, failed reads, runs of every length):
    many changes, each with other candidates within a dwell of it - the exact rule's region."""
    rng = np.random.default_rng(7)
    centres = np.array([COMPUTE, SPIN, IDLE, STARVED, COMM, (0.29, 0.95), (0.41, 0.6)])
    run_of = np.repeat(rng.integers(0, len(centres), 400), rng.integers(3, 90, 400))
    n = len(run_of)
    p = centres[run_of, 0] + rng.normal(0.0, 0.02, n)
    u = np.clip(centres[run_of, 1] + rng.normal(0.0, 0.04, n), 0.0, 1.0)
    flicker = rng.random(n) < 0.1
    u[flicker] = rng.random(flicker.sum())
    p[rng.random(n) < 0.02] = NAN
    t = np.cumsum(rng.choice([0.1, 0.1, 0.1, 0.0, 0.3], n))
    expected, clf = _streamed(t, p, u)
    assert len(expected) > 120
    for cuts in ([], [777, 5000, 5001, 9000], list(range(0, n, 1234))):
        got, carry = _vectorised(t, p, u, cuts)
        assert got == expected
        assert carry.state is clf.state and carry.since_s == clf.since_s


def test_a_failed_read_is_no_vote():
    """One read in four timing out must not hold a hung GPU in compute (nor keep it from leaving)."""
    clf = GpuClassifier(H100)
    t = 0.0
    for _ in range(30):  # training
        clf.update(t, 0.8, 0.95)
        t += 1.0
    assert clf.state is GpuState.COMPUTE
    for i in range(30):  # the hang, with every fourth read failing
        clf.update(t, NAN if i % 4 == 0 else 0.22, NAN if i % 4 == 0 else 1.0)
        t += 1.0
    assert clf.state is GpuState.CHECKPOINT_OR_DEADLOCK
    # the vectorised form agrees on the same stream
    times = np.arange(60, dtype=float)
    p = np.array([0.8] * 30 + [NAN if i % 4 == 0 else 0.22 for i in range(30)])
    u = np.array([0.95] * 30 + [NAN if i % 4 == 0 else 1.0 for i in range(30)])
    switches, carry = classify_series(H100, times, p, u)
    assert carry.state is GpuState.CHECKPOINT_OR_DEADLOCK and switches[-1].since_s == clf.since_s


def test_reads_that_keep_failing_still_make_the_gpu_unknown():
    clf = GpuClassifier(H100)
    for t in range(10):
        clf.update(float(t), 0.8, 0.95)
    for t in range(10, 20):
        clf.update(float(t), NAN, NAN)
    assert clf.state is GpuState.UNKNOWN


def test_a_capped_gpu_still_spins_in_the_spin_band_and_trains_in_compute():
    """An H100 capped at 400 W (or 500 W): the spin draws ~155 W whatever the cap, training runs at
    the cap, and an idle GPU holding memory stays idle."""
    from gpu_triage.classify.bands import raw_state

    for cap in (400.0, 500.0, 700.0):
        table = H100.at_limit(cap)
        assert raw_state(table, 155.0 / cap, 1.0) is GpuState.CHECKPOINT_OR_DEADLOCK, cap
        assert raw_state(table, 0.97, 0.95) is GpuState.COMPUTE, cap
        assert raw_state(table, 133.0 / cap, 0.0) is GpuState.IDLE, cap
        # a GPU that was computing leaves compute for the spin band when it hangs
        clf = GpuClassifier(table)
        for t in range(10):
            clf.update(float(t), 0.97, 0.95)
        for t in range(10, 30):
            clf.update(float(t), 155.0 / cap, 1.0)
        assert clf.state is GpuState.CHECKPOINT_OR_DEADLOCK, cap
    assert H100.at_limit(700.0).bands == H100.bands
    # without utilisation (MIG, vGPU), an idle GPU holding memory is idle, never spinning
    assert raw_state(H100, 145.0 / 700.0, NAN) is GpuState.IDLE


def test_rescaled_tables_still_cover_every_point():
    from gpu_triage.classify.table_files import _check_coverage, all_tables

    for table in all_tables():
        for cap in (0.4, 0.6, 0.8, 1.3):
            limit = (table.power_limit_w or 500.0) * cap
            _check_coverage(table.at_limit(limit), f"{table.model}@{limit:.0f}W")


def test_the_trackers_status_rows_carry_each_reading_in_its_own_field() -> None:
    """GpuTracker.statuses builds its rows positionally (10 times a second per GPU): each value lands
    in the field it names, and a failed read keeps the static facts but no numbers."""
    from gpu_triage.classify.tracker import GpuTracker
    from gpu_triage.model.samples import GpuSample

    tracker = GpuTracker()
    good = GpuSample(
        gpu=0, time_s=1.0, power_w=900.0, energy_j=5.0, utilization_ratio=0.97, memory_used_bytes=7.0,
        memory_total_bytes=8.0, sm_clock_mhz=1900.0, temperature_c=61.0, power_limit_w=1100.0,
        uuid="GPU-0", name="NVIDIA B300", pci_bus_id="00000000:1B:00.0",
    )  # fmt: skip
    tracker.update(1.0, [good, GpuSample(gpu=1, time_s=1.0, power_limit_w=0.0, name="NVIDIA B300")])
    s0, s1 = tracker.statuses()
    table = tracker.tables()[0]
    assert (s0.gpu, s0.uuid, s0.name, s0.model, s0.pci_bus_id) == (
        0, "GPU-0", "NVIDIA B300", table.model, "00000000:1B:00.0"
    )  # fmt: skip
    assert (s0.power_w, s0.power_limit_w, s0.utilization_ratio, s0.memory_used_bytes) == (
        900.0,
        1100.0,
        0.97,
        7.0,
    )
    assert (s0.energy_j, s0.temperature_c, s0.sm_clock_mhz) == (5.0, 61.0, 1900.0)
    assert (s0.state, s0.state_since) == (GpuState.COMPUTE, 1.0)
    assert (s0.read_errors_total, s0.impossible_power_limits_total) == (0, 0)
    assert s0.compute_floor_w == table.bands[GpuState.COMPUTE].power_min * 1100.0
    assert s0.spin_ceiling_w == table.bands[GpuState.CHECKPOINT_OR_DEADLOCK].power_max * 1100.0
    assert s1.impossible_power_limits_total == 1 and s1.power_limit_w == table.power_limit_w
    tracker.update(2.0, [replace(good, time_s=2.0, error="timeout", power_w=None)])
    s0 = tracker.statuses()[0]
    assert (s0.power_w, s0.energy_j, s0.uuid, s0.read_errors_total) == (None, None, "GPU-0", 1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # which GPU
            st.sampled_from([COMPUTE, SPIN, IDLE, STARVED, COMM]),
            st.sampled_from(["ok", "ok", "ok", "error", "limit", "impossible", "name"]),
            st.integers(1, 8),  # that many samples in a row
        ),
        min_size=1,
        max_size=40,
    )
)
def test_the_trackers_rows_follow_every_change_although_their_facts_are_kept_between(
    stream: list[tuple[int, tuple[float, float], str, int]],
) -> None:
    """GpuTracker.status_inputs remakes a GPU's facts (state, since, limit, edges, error counts) only
    after update changed one of them: whatever the stream - state changes, failed reads, a new or an
    impossible power limit, a new GPU name - the rows equal rows made afresh from the tracker's GPUs."""
    from gpu_triage.classify.tracker import GpuTracker, status_rows
    from gpu_triage.model.samples import GpuSample

    tracker = GpuTracker(dwell_s={"compute": 0.2, "idle": 0.3})
    steps = [(gpu, reading, what) for gpu, reading, what, n in stream for _ in range(n)]
    for i, (gpu, (frac, util), what) in enumerate(steps):
        now = 0.1 * i
        limit = {"limit": 600.0, "impossible": 0.0}.get(what, 700.0)
        sample = GpuSample(
            gpu=gpu,
            time_s=now,
            power_w=None if what == "error" else frac * 700.0,
            utilization_ratio=None if what == "error" else util,
            power_limit_w=limit,
            name="NVIDIA A100" if what == "name" else "NVIDIA H100",
            error="timeout" if what == "error" else None,
        )
        tracker.update(now, [sample])
        fresh = tuple(GpuTracker._facts_of(tracker._gpus[g]) for g in sorted(tracker._gpus))
        samples = tuple(tracker._gpus[g].last for g in sorted(tracker._gpus))
        assert tracker.statuses() == status_rows((samples, fresh))  # type: ignore[arg-type]
