"""``gpu-watchdog triage`` end to end: the real recordings in ../shared/traces, a generated symmetric
hang, chunked = whole, bad input, the JSON contract and exit codes; ``tables`` and ``calibrate``."""

from __future__ import annotations

import csv
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from gpu_triage.cli.main import main
from gpu_triage.recordings.nvsmi_csv import read_recording
from gpu_triage.telemetry.recording_writer import write_nvsmi_csv
from gpu_triage.telemetry.sim import GpuBehaviour, Phase, Scenario
from gpu_triage.triage.engine import TriageOptions, triage_file
from tests.conftest import require_traces

# GPU count and power limit per file, as ../shared/traces/README.md states them
TRACES = {
    "titanx-2gpu-a.csv": (2, 250.0),
    "titanx-2gpu-b.csv": (2, 250.0),
    "titanx-2gpu-burn.csv": (2, 250.0),
    "h100-8gpu-ckpt100.csv": (8, 700.0),
    "h100-8gpu-ckpt1000.csv": (8, 700.0),
}


def run_json(capsys, *argv: str) -> tuple[int, object]:
    code = main(["triage", "--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


@pytest.mark.parametrize("name", sorted(TRACES))
def test_real_traces_triage_clean_with_at_least_two_states(capsys, name):
    gpus, limit = TRACES[name]
    path = require_traces() / name
    code, doc = run_json(capsys, "--gpus", str(gpus), "--power-limit", str(limit), str(path))
    assert code == 0
    assert doc["verdicts"] == []
    assert doc["gpus"] == gpus and doc["power_limit_w"] == limit
    data_lines = sum(1 for line in path.read_text().splitlines()[1:] if line.strip())
    assert doc["samples"] == data_lines
    seen = [s for s, v in doc["states_s"].items() if v > 0]
    assert len(seen) >= 2, doc["states_s"]
    # accounting: GPU-seconds add up to about gpus x duration (gaps are capped, so a little less)
    total = sum(doc["states_s"].values())
    assert 0.9 * gpus * doc["duration_s"] <= total <= gpus * doc["duration_s"] + 1e-6
    for key in ("file", "model", "duration_s", "segments"):
        assert key in doc


@pytest.mark.parametrize("name", ["h100-8gpu-ckpt100.csv", "h100-8gpu-ckpt1000.csv"])
def test_waiting_gpus_are_in_the_band_through_every_labelled_checkpoint_wait(name):
    traces = require_traces()
    result = triage_file(traces / name, TriageOptions(gpus=8, power_limit_w=700.0, model="H100"))
    _, chunk = read_recording(traces / name, gpus=8)
    t = chunk.time_s - chunk.time_s.min()
    with open(traces / name.replace(".csv", ".labels.csv")) as f:
        labels = [(float(r["start_s"]), float(r["end_s"])) for r in csv.DictReader(f)]
    assert labels
    for a, b in labels:
        inside = (t >= a) & (t < b)
        # the writer is the GPU with the lowest utilisation during the wait; the others wait
        util = [np.nanmean(chunk.utilization_ratio[inside & (chunk.gpu == g)]) for g in range(8)]
        writer = int(np.argmin(util))
        for g in range(8):
            if g == writer:
                continue
            covered = sum(
                max(0.0, min(b, s["end_s"]) - max(a, s["start_s"]))
                for s in result.segments
                if s["gpu"] == g and s["state"] == "checkpoint_or_deadlock"
            )
            assert covered >= 0.8 * (b - a), (name, a, b, g, covered)


@pytest.fixture(scope="module")
def hang_recording(tmp_path_factory) -> Path:
    """10 minutes of training then a 15-minute symmetric hang on 8 B300, at 10 Hz, named in the file."""
    path = tmp_path_factory.mktemp("rec") / "hang.csv"
    write_nvsmi_csv(path, Scenario.symmetric_hang(600, 900), 1500, rate_hz=10, with_index=True)
    return path


def test_generated_15_minute_hang_is_a_deadlock_detected_within_the_rule_plus_two_samples(
    capsys, hang_recording
):
    code, doc = run_json(capsys, "--deadlock-after", "180", str(hang_recording))
    assert code == 1
    assert doc["model"] == "B300" and doc["power_limit_w"] == 1100.0  # inferred from the file
    (v,) = doc["verdicts"]
    assert v["verdict"] == "deadlock" and v["gpus"] == list(range(8))
    assert 599.0 <= v["onset_s"] <= 600.2
    interval = 0.1
    assert v["detected_s"] - v["onset_s"] <= 180 + 2 * interval
    assert v["detected_s"] >= v["onset_s"] + 180 - 1e-6
    assert v["ended_s"] is None


def test_default_rule_also_catches_it_and_a_shorter_hang_is_not_one(capsys, tmp_path, hang_recording):
    code, doc = run_json(capsys, str(hang_recording))
    assert code == 1 and doc["deadlock_after_s"] == 300
    short = tmp_path / "short.csv"
    write_nvsmi_csv(short, Scenario.symmetric_hang(120, 200), 320, rate_hz=2, with_index=True)
    code, doc = run_json(capsys, str(short))
    assert code == 0 and doc["verdicts"] == []


def test_chunked_gives_the_same_answer_as_whole(hang_recording):
    whole = triage_file(hang_recording, TriageOptions()).to_json()
    chunked = triage_file(hang_recording, TriageOptions(chunk_bytes=64 << 10)).to_json()
    assert chunked == whole


def test_malformed_line_exits_2_naming_file_line_and_column(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "timestamp, index, power.draw [W], utilization.gpu [%]\n"
        "2025/07/27 00:34:45.155, 0, 72.36 W, 0 %\n"
        "2025/07/27 00:34:45.255, 0, seventy W, 0 %\n"
        "2025/07/27 00:34:45.355, 0, 72.36 W, 0 %\n"
    )
    code = main(["triage", "--model", "H100", str(bad)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{bad}:3:3" in err


def test_several_files_give_an_array_in_order_and_the_highest_code(capsys, tmp_path, hang_recording):
    missing = tmp_path / "missing.csv"
    code, doc = run_json(capsys, str(hang_recording), str(missing))
    assert code == 2
    assert isinstance(doc, list) and len(doc) == 2
    assert doc[0]["file"] == str(hang_recording) and doc[0]["verdicts"]
    assert doc[1]["file"] == str(missing) and "error" in doc[1]


def test_unknown_gpu_without_limit_is_bad_input(capsys):
    path = require_traces() / "titanx-2gpu-a.csv"
    code = main(["triage", "--gpus", "2", str(path)])
    assert code == 2
    assert "--power-limit" in capsys.readouterr().err


def test_deadlock_after_takes_any_positive_duration(capsys, hang_recording):
    """A save whose writer is on another node can take longer than 5 minutes: no ceiling."""
    code, doc = run_json(capsys, "--deadlock-after", "1200", str(hang_recording))
    assert code == 0 and doc["deadlock_after_s"] == 1200 and doc["verdicts"] == []
    for bad in ("0", "-5"):
        with pytest.raises(SystemExit) as e:
            main(["triage", "--deadlock-after", bad, "x.csv"])
        assert e.value.code == 2


TRAIN = GpuBehaviour(0.78, 0.92, power_jitter_fraction=0.01, util_jitter=0.02, memory_used_fraction=0.4)
SPIN = GpuBehaviour(0.21, 1.0, power_jitter_fraction=0.004, memory_used_fraction=0.4)
WRITER = GpuBehaviour(0.21, 0.05, power_jitter_fraction=0.004, memory_used_fraction=0.4)


def _node(tmp_path, name: str, hung: GpuBehaviour, others: GpuBehaviour, hang_s: float, **kw) -> Path:
    """Training, then GPUs 0-3 (or 1-7) do ``hung`` while the rest do ``others``."""
    scenario = Scenario.from_phases(
        [
            Phase("train", 300.0, TRAIN, step_rate_per_s=0.2),
            Phase("event", hang_s, hung, overrides=((frozenset(kw.pop("others_gpus")), others),)),
        ],
        model=kw.pop("model", "H100"),
        power_limit_w=kw.pop("power_limit_w", 700.0),
        gpus=8,
        sample_rate_hz=2.0,
    )
    path = tmp_path / f"{name}.csv"
    write_nvsmi_csv(path, scenario, 300.0 + hang_s, rate_hz=2, with_index=True)
    return path


def test_one_hung_job_of_two_on_a_node_is_a_deadlock_of_its_gpus(capsys, tmp_path):
    path = _node(tmp_path, "two-jobs", SPIN, TRAIN, 500.0, others_gpus={4, 5, 6, 7})
    code, doc = run_json(capsys, str(path))
    assert code == 1
    (v,) = doc["verdicts"]
    assert v["gpus"] == [0, 1, 2, 3] and 299 <= v["onset_s"] <= 305


def test_a_long_local_save_with_its_writer_beside_is_not_a_deadlock(capsys, tmp_path):
    """Seven GPUs wait 500 s for the writer on GPU 0 (low utilisation, it was training before)."""
    path = _node(tmp_path, "slow-save", SPIN, WRITER, 500.0, others_gpus={0})
    code, doc = run_json(capsys, str(path))
    assert code == 0 and doc["verdicts"] == []


def test_a_hang_on_a_power_capped_node_is_found(capsys, tmp_path):
    """An H100 capped at 400 W: the spin draws ~150 W, 0.37 of the cap - still the spin band."""
    spin_w = GpuBehaviour(150.0 / 400.0, 1.0, power_jitter_fraction=0.004, memory_used_fraction=0.4)
    path = _node(tmp_path, "capped", spin_w, spin_w, 500.0, others_gpus=set(), power_limit_w=400.0)
    code, doc = run_json(capsys, "--model", "H100", str(path))
    assert code == 1
    (v,) = doc["verdicts"]
    assert v["gpus"] == list(range(8))


def test_plot_is_written(tmp_path, capsys):
    out = tmp_path / "h100.png"
    code = main(
        [
            "triage",
            "--gpus",
            "8",
            "--power-limit",
            "700",
            "--model",
            "H100",
            "--plot",
            str(out),
            str(require_traces() / "h100-8gpu-ckpt1000.csv"),
        ]
    )
    assert code == 0
    assert out.stat().st_size > 20_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tables_lists_every_model_with_sources(capsys):
    assert main(["tables"]) == 0
    out = capsys.readouterr().out
    for model in ("B300", "B200", "H200", "H100", "A100", "generic"):
        assert f"{model}:" in out
    assert "[estimate]" in out and "M: " in out
    assert main(["tables", "--json", "--model", "h100"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)
    assert doc["bands"]["checkpoint_or_deadlock"]["power_max"] == 0.30


def test_calibrate_fits_a_usable_table_from_labelled_recordings(tmp_path, capsys):
    traces = require_traces()
    out = tmp_path / "h100-fitted.toml"
    code = main(
        [
            "calibrate",
            "--model",
            "H100",
            "--gpus",
            "8",
            "--power-limit",
            "700",
            "--unlabelled",
            "compute",
            "--labels",
            str(traces / "h100-8gpu-ckpt100.labels.csv"),
            "--name",
            "H100-ours",
            "--out",
            str(out),
            str(traces / "h100-8gpu-ckpt100.csv"),
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "checkpoint_or_deadlock" in printed.out and f"wrote {out}" in printed.out
    doc = tomllib.loads(out.read_text())
    spin_max = doc["bands"]["checkpoint_or_deadlock"]["power_max"]
    compute_min = doc["bands"]["compute"]["power_min"]
    # waiters at 0.21-0.23 of the limit, training at 0.77-0.81: both edges fall in the gap between
    assert 0.23 < spin_max < compute_min < 0.77
    assert "fitted from h100-8gpu-ckpt100.csv" in doc["bands"]["compute"]["note"]
    # the fitted table triages the other recording the same way
    code, result = run_json(
        capsys,
        "--gpus",
        "8",
        "--power-limit",
        "700",
        "--table",
        str(out),
        str(traces / "h100-8gpu-ckpt1000.csv"),
    )
    assert code == 0 and result["states_s"]["checkpoint_or_deadlock"] > 100


def test_calibrate_rejects_labels_that_power_cannot_separate(tmp_path, capsys):
    traces = require_traces()
    labels = tmp_path / "wrong.labels.csv"
    # training (and the waits inside it) labelled half 'idle', half 'compute': the states overlap in power
    labels.write_text("start_s,end_s,label\n150,300,idle\n300,650,compute\n")
    out = tmp_path / "x.toml"
    code = main(
        [
            "calibrate",
            "--gpus",
            "8",
            "--power-limit",
            "700",
            "--model",
            "H100",
            "--unlabelled",
            "ignore",
            "--labels",
            str(labels),
            "--out",
            str(out),
            str(traces / "h100-8gpu-ckpt100.csv"),
        ]
    )
    assert code == 2
    assert "power cannot separate them" in capsys.readouterr().err
    assert not out.exists()  # nothing is written
    labels.write_text("start_s,end_s,label\n0,700,bogus\n")
    code = main(
        [
            "calibrate",
            "--gpus",
            "8",
            "--power-limit",
            "700",
            "--labels",
            str(labels),
            "--out",
            str(tmp_path / "x.toml"),
            str(traces / "h100-8gpu-ckpt100.csv"),
        ]
    )
    assert code == 2
    assert f"{labels}:2:3: unknown label 'bogus'" in capsys.readouterr().err


def test_report_lists_the_longest_spin_episodes_with_their_clock_times(capsys, hang_recording):
    """One episode per GPU group (the symmetric hang is one wait of all 8 GPUs, not 8 episodes)."""
    from gpu_triage.triage.report import spin_episodes, wall_clock

    result = triage_file(hang_recording, TriageOptions())
    episodes = spin_episodes(result)
    assert len(episodes) == 1
    (hang,) = episodes
    assert hang["gpus"] == list(range(8)) and hang["duration_s"] >= 890  # the 15-minute hang
    assert hang["kind"] == "suspected_deadlock" and hang["ended_by"] == "open"
    assert main(["triage", "--no-progress", str(hang_recording)]) == 1
    out = capsys.readouterr().out
    assert "longest waits (checkpoint_or_deadlock, one per GPU group, clock time as recorded):" in out
    assert "    GPUs 0-7 " in out and wall_clock(result, hang["start_s"]) in out
    assert "SUSPECTED DEADLOCK on GPUs 0-7" in out


def test_plot_has_utilisation_under_power_on_the_wall_clock(tmp_path, hang_recording):
    from gpu_triage.triage.plot import figure, plot

    result = triage_file(hang_recording, TriageOptions(keep_plot_points=True))
    fig = figure(result)
    axes = fig.axes
    assert len(axes) == 2 * result.gpus
    power, util = axes[0], axes[1]
    assert power.get_ylabel().startswith("GPU 0") and util.get_ylabel().startswith("util")
    (line,) = util.get_lines()
    assert max(line.get_ydata()) > 90  # utilisation in percent: the spin reads ~100 %
    fig.canvas.draw()
    ticks = [t.get_text() for t in axes[-1].get_xticklabels() if t.get_text()]
    assert ticks and all(len(t) == 8 and t.count(":") == 2 for t in ticks), ticks  # HH:MM:SS
    assert "clock time as recorded (started " in axes[-1].get_xlabel()
    out = plot(result, tmp_path / "hang.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_headerless_recording_points_at_the_columns_flag(capsys, tmp_path):
    lines = ["2025/07/27 00:34:45.000, 0, 600.00 W, 100 %", "2025/07/27 00:34:45.100, 1, 610.00 W, 99 %"] * 20
    path = tmp_path / "noheader.csv"
    path.write_text("\n".join(lines) + "\n")
    assert main(["triage", "--model", "H100", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--columns timestamp,index,power.draw,utilization.gpu" in err
    # ... and that flag exists and reads the file
    code, doc = run_json(
        capsys, "--model", "H100", "--columns", "timestamp,index,power.draw,utilization.gpu", str(path)
    )
    assert code == 0 and doc["gpus"] == 2
    assert main(["triage", "--model", "H100", "--columns", "timestamp,72 W", str(path)]) == 2
    assert "--columns:" in capsys.readouterr().err


@pytest.mark.parametrize("inferred", [False, True])
def test_a_recording_cut_mid_snapshot_drops_that_snapshot_with_a_warning(capsys, tmp_path, inferred):
    """Issue 28 (4): a logger killed mid-snapshot (here: three rows of the last 8-GPU snapshot, then
    half a line) - the real H100 recording cut the way it happens. The cut line and the incomplete
    snapshot are dropped, each with a warning naming file and line; the rest is triaged (exit 0)."""
    lines = (require_traces() / "h100-8gpu-ckpt100.csv").read_text().splitlines(keepends=True)
    data = lines[1:]
    assert len(data) % 8 == 0
    keep = len(data) - 8 + 3  # three rows of the last snapshot survive
    cut = tmp_path / "cut.csv"
    cut.write_text("".join(lines[: 1 + keep]) + data[keep][: len(data[keep]) // 2])
    first_dropped_line = 1 + (len(data) - 8) + 1  # the header is line 1
    argv = ["--power-limit", "700", str(cut)] + ([] if inferred else ["--gpus", "8"])
    code, doc = run_json(capsys, *argv)
    assert code == 0, capsys.readouterr().err
    assert doc["gpus"] == 8 and doc["samples"] == len(data) - 8
    warnings = "\n".join(doc["warnings"])
    assert f"{cut}:{first_dropped_line}: the last snapshot" in warnings, warnings
    assert "3 of 8 rows" in warnings
    assert f"{cut}:{first_dropped_line + 3}:" in warnings  # the half line (truncated-last-line rule)
