"""Offline triage says what power shows: compute bursts are progress, waits are judged against the
recording's own save cadence, and a deadlock is only ever *suspected*, with its evidence.

Generated recordings (tests/watchdog/triage_corpus.py, written by the project's nvidia-smi CSV
writer): a job that checkpoints every step (sub-second bursts between ~16 s waits), long remote saves
(every GPU waits ~400 s), and real hangs spliced after them; plus every real trace in ../shared/traces.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.cli.main import main
from gpu_triage.recordings.nvsmi_csv import read_recording
from gpu_triage.triage.engine import TriageOptions, triage_file
from tests.conftest import TRACES, require_traces
from tests.watchdog.triage_corpus import REAL, Case, generated_cases, labels_of, real_cases

GENERATED = {c.name: c for c in generated_cases()}


def _factor() -> float:
    from gpu_triage.triage.deadlock_rule import CADENCE_FACTOR

    return CADENCE_FACTOR


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("triage-corpus")


def _triage(case: Case, folder: Path, **extra):
    return triage_file(case.build(folder), TriageOptions(**{**case.options, **extra}))  # type: ignore[arg-type]


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["triage", "--json", "--no-progress", *argv])
    return code, json.loads(capsys.readouterr().out)


# -- bursts -----------------------------------------------------------------------------------------


def _series(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(n) * 0.1
    p = 0.21 + rng.normal(0, 0.002, n)
    for start in rng.integers(0, n, max(1, n // 150)):
        p[start : start + rng.integers(1, 12)] = rng.uniform(0.31, 0.8)
    p[rng.random(n) < 0.01] = np.nan  # failed reads
    return t, p


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 1500), cuts=st.lists(st.integers(1, 1499), max_size=12))
def test_bursts_do_not_depend_on_where_the_chunks_are_cut(seed, n, cuts):
    from gpu_triage.triage.bursts import BurstTracker

    t, p = _series(seed, n)
    whole = BurstTracker(0.30, 0.03)
    whole.feed(t, p)
    chunked = BurstTracker(0.30, 0.03)
    edges = [0, *sorted(c for c in set(cuts) if c < n), n]
    for a, b in itertools.pairwise(edges):
        chunked.feed(t[a:b], p[a:b])
    one, other = whole.finish(), chunked.finish()
    assert np.array_equal(one.start_s, other.start_s) and np.array_equal(one.end_s, other.end_s)


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    spans=st.lists(st.tuples(st.integers(-10, 1600), st.integers(0, 300)), max_size=40),
)
def test_the_bursts_within_every_interval_at_once_are_those_within_each(seed, spans):
    """The wait analysis asks for the bursts of all of a GPU's intervals in one search
    (Bursts.within_each); each interval gets the same bursts as asking for it alone (Bursts.within)."""
    from gpu_triage.triage.bursts import BurstTracker

    t, p = _series(seed, 1500)
    tracker = BurstTracker(0.30, 0.03)
    tracker.feed(t, p)
    bursts = tracker.finish()
    intervals = [(a / 10, (a + d) / 10) for a, d in spans]  # touching, inside, around, outside bursts
    first, last = bursts.within_each(intervals)
    for (lo, hi), i, j in zip(intervals, first, last, strict=True):
        starts, ends = bursts.within(lo, hi)
        assert bursts.start_s[i:j].tolist() == starts.tolist() and bursts.end_s[i:j].tolist() == ends.tolist()


def test_a_sub_second_rise_is_a_burst_and_a_flat_spin_on_the_ceiling_is_not():
    from gpu_triage.triage.bursts import BurstTracker

    t = np.arange(600) * 0.1
    step = np.full(600, 0.215)
    step[300:305] = 0.35  # half a second above the spin band
    tracker = BurstTracker(0.30, 0.03)
    tracker.feed(t, step)
    bursts = tracker.finish()
    assert (
        len(bursts) == 1
        and bursts.start_s[0] == pytest.approx(30.0)
        and bursts.end_s[0] == pytest.approx(30.4)
    )
    # a hang whose spin draw sits on the ceiling flickers across it: no burst
    edge = 0.30 + np.random.default_rng(1).uniform(-0.01, 0.01, 600)
    tracker = BurstTracker(0.30, 0.03)
    tracker.feed(t, edge)
    assert len(tracker.finish()) == 0


# -- the generated shapes -----------------------------------------------------------------------------


def test_checkpoint_every_step_is_no_deadlock_and_its_waits_are_named_checkpoints(capsys, folder):
    case = GENERATED["ckpt-every-step"]
    path = case.build(folder)
    code, doc = run_json(capsys, str(path))
    assert code == 0 and doc["verdicts"] == []
    waits = doc["spin_episodes"]
    assert len(waits) >= 30
    saves = [w for w in waits if w["ended_by"] == "progress"]
    assert len(saves) == 30  # one per save, not one per GPU, and not one 9-minute wait
    assert all(w["gpus"] == [1, 2, 3, 4, 5, 6, 7] and w["kind"] == "checkpoint" for w in saves)
    assert all(w["writer_gpu"] == 0 for w in saves)
    assert max(w["duration_s"] for w in saves) < 50
    (cadence,) = doc["cadences"]
    assert cadence["gpus"] == [1, 2, 3, 4, 5, 6, 7] and cadence["waits"] == 30
    assert cadence["work_s"] < 1.0  # the bursts between saves are well under a second


def test_long_remote_saves_are_no_deadlock(capsys, folder):
    """Every GPU waits ~400 s per save (the writer is on another node): over the fixed 300 s, but each
    save ends in training, and the recording shows that is this job's cadence."""
    for name in ("long-remote-saves", "long-remote-saves-cut-mid-save"):
        code, doc = run_json(capsys, str(GENERATED[name].build(folder)))
        assert code == 0 and doc["verdicts"] == [], name
        saves = [w for w in doc["spin_episodes"] if w["ended_by"] == "progress"]
        assert len(saves) == 3 and all(w["duration_s"] > 300 and w["kind"] == "checkpoint" for w in saves)
    # the recording cut 450 s into a fourth save: open, within the cadence, not suspected
    (last,) = [w for w in doc["spin_episodes"] if w["ended_by"] == "open"]
    assert last["kind"] == "open" and last["duration_s"] > 300


@pytest.mark.parametrize(
    "name", ["ckpt-every-step+hang", "ckpt-every-step+endless-save", "long-remote-saves+hang"]
)
def test_a_hang_after_the_cadence_is_suspected_with_the_time_it_departed_from_it(capsys, folder, name):
    case = GENERATED[name]
    (hang,) = case.hangs
    code, doc = run_json(capsys, str(case.build(folder)))
    assert code == 1
    (v,) = doc["verdicts"]
    assert v["verdict"] == "deadlock" and v["confidence"] == "suspected"
    assert v["gpus"] == list(hang.gpus)
    assert abs(v["onset_s"] - hang.onset_s) < 2.0
    cadence = v["cadence"]
    assert cadence["waits"] >= 3
    assert v["departed_from_cadence_s"] == pytest.approx(
        v["onset_s"] + _factor() * cadence["longest_s"], abs=0.01
    )
    assert v["detected_s"] == pytest.approx(max(v["onset_s"] + 300, v["departed_from_cadence_s"]), abs=0.01)
    assert v["ended_s"] is None
    assert any("departed from that cadence" in e for e in v["evidence"])
    assert any("power alone cannot tell" in e for e in v["evidence"])


def test_a_save_that_never_ends_is_suspected_despite_its_writer_once_the_cadence_is_known(capsys, folder):
    code, doc = run_json(capsys, str(GENERATED["ckpt-every-step+endless-save"].build(folder)))
    (v,) = doc["verdicts"]
    assert any("GPU 0 looks like a checkpoint writer" in e for e in v["evidence"])
    # ...while a first long save with its writer beside has nothing to compare with: excused
    code, doc = run_json(capsys, str(GENERATED["slow-local-save-with-writer"].build(folder)))
    assert code == 0 and doc["verdicts"] == []
    (wait,) = doc["spin_episodes"]
    assert wait["kind"] == "checkpoint" and wait["writer_gpu"] == 0


def test_one_hung_job_beside_one_that_checkpoints_every_step(capsys, folder):
    """The stepping job's bursts are its own progress, not the hung job's; its writer is not theirs."""
    code, doc = run_json(capsys, str(GENERATED["two-jobs-one-hung"].build(folder)))
    assert code == 1
    (v,) = doc["verdicts"]
    assert v["gpus"] == [4, 5, 6, 7] and abs(v["onset_s"] - 60.5) < 2.0
    assert {tuple(c["gpus"]) for c in doc["cadences"]} == {(1, 2, 3)}


@pytest.mark.parametrize("case", generated_cases(), ids=lambda c: c.name)
def test_every_generated_case_meets_its_truth_or_its_stated_limit(folder, case):
    result = _triage(case, folder)
    found = [(tuple(v["gpus"]), v["onset_s"]) for v in result.verdicts]
    if case.limit:  # a hang triage is known to miss, by design: it must say why in the report instead
        assert found == [], (case.name, found)
        (last,) = [w for w in result.waits if w.ended_by == "open"]
        assert last.kind == "open" and not last.out_of_line
        return
    assert len(found) == len(case.hangs), (case.name, found)
    for hang in case.hangs:
        assert any(gpus == hang.gpus and abs(onset - hang.onset_s) < 2.0 for gpus, onset in found), found


def test_chunked_gives_the_same_waits_as_whole(folder):
    case = GENERATED["ckpt-every-step+hang"]
    whole = _triage(case, folder).to_json()
    chunked = _triage(case, folder, chunk_bytes=64 << 10).to_json()
    assert chunked == whole


# -- the real traces ----------------------------------------------------------------------------------


#: Every real recording present (a new one without an entry in REAL fails until it gets one).
REAL_NAMES = sorted({p.name for p in TRACES.glob("*.csv") if not p.name.endswith(".labels.csv")} | set(REAL))


@pytest.mark.parametrize("name", REAL_NAMES)
def test_real_traces_have_no_suspected_deadlock_and_their_labelled_waits_are_checkpoints(name):
    (case,) = [c for c in real_cases(require_traces()) if c.name == f"real:{name}"]
    assert name in REAL, f"{name}: add its GPU count and power limit to triage_corpus.REAL"
    result = triage_file(case.build(Path(".")), TriageOptions(**case.options))  # type: ignore[arg-type]
    assert result.verdicts == []
    assert all(w.kind != "suspected_deadlock" for w in result.waits)
    for a, b in case.checkpoint_waits:
        named = [
            w
            for w in result.waits
            if w.kind == "checkpoint" and abs(w.start_s - a) < 2.0 and abs(w.end_s - b) < 2.0
        ]
        assert len(named) == 1, (case.name, a, b)
        assert named[0].gpus == (1, 2, 3, 4, 5, 6, 7) and named[0].writer_gpu == 0


def test_real_h100_trace_with_a_hang_spliced_after_its_saves_is_suspected(tmp_path, capsys):
    """The real recording of a job saving every 100 steps, cut 10 s after its last save ended (it is
    training again), then every GPU spinning flat at ~151 W and 100 % for 20 minutes."""
    traces = require_traces()
    source = traces / "h100-8gpu-ckpt100.csv"
    last_save_end_s = max(b for _, b in labels_of(source))
    lines = source.read_text().splitlines()
    _, chunk = read_recording(source, gpus=8)
    t0 = float(chunk.time_s.min())
    keep = int(np.searchsorted(chunk.time_s[::8] - t0, last_save_end_s + 10.0)) * 8
    cut_s = float(chunk.time_s[keep - 1])
    spliced = lines[: 1 + keep]
    for k in range(1, 12_001):
        ms = round((cut_s + 0.1 * k) * 1000)
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}"
        spliced += [f"{stamp}, 151.{g}0 W, 100 %, 61000 MiB" for g in range(8)]
    path = tmp_path / "ckpt100+hang.csv"
    path.write_text("\n".join(spliced) + "\n")
    code, doc = run_json(capsys, "--gpus", "8", "--model", "H100", str(path))
    assert code == 1
    (v,) = doc["verdicts"]
    assert v["gpus"] == list(range(8)) and v["ended_s"] is None
    assert abs(v["onset_s"] - (cut_s - t0)) < 2.0
    assert v["cadence"]["waits"] == 9 and v["cadence"]["longest_s"] > 50
    assert v["departed_from_cadence_s"] == pytest.approx(
        v["onset_s"] + _factor() * v["cadence"]["longest_s"], abs=0.01
    )


# -- input and wording --------------------------------------------------------------------------------


def test_gpus_that_do_not_divide_the_rows_is_bad_input_naming_the_file(capsys):
    path = require_traces() / "titanx-2gpu-a.csv"  # 6,570 rows: 2 GPUs, not 4
    code = main(["triage", "--no-progress", "--gpus", "4", "--power-limit", "250", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert str(path) in err and "--gpus 4 does not divide" in err and "suggest 2" in err
    assert main(["triage", "--no-progress", "--gpus", "2", "--power-limit", "250", str(path)]) == 0


def test_the_report_says_suspected_and_states_the_rule_as_a_rule(capsys, folder):
    assert main(["triage", "--no-progress", str(GENERATED["long-remote-saves"].build(folder))]) == 0
    out = capsys.readouterr().out
    assert "no suspected deadlock (rule: " in out and "every GPU in checkpoint_or_deadlock" not in out
    assert "checkpoint (then computed)" in out
    assert main(["triage", "--no-progress", str(GENERATED["long-remote-saves+hang"].build(folder))]) == 1
    out = capsys.readouterr().out
    assert "SUSPECTED DEADLOCK on GPUs 0-7" in out and "out of line with its cadence from" in out
    assert "suspected: power cannot prove a hang" in out
