"""The sim source, the scenario format, the built-in reference-b300 scenario, and the CSV writer."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest

from gpu_triage.model.samples import TelemetrySource, TelemetryUnavailable
from gpu_triage.telemetry.recording_writer import RecordingInfo, write_nvsmi_csv
from gpu_triage.telemetry.scenarios import DEFAULT_SCENARIO, find, names
from gpu_triage.telemetry.sim import GpuBehaviour, Phase, Scenario, ScenarioError, SimSource

LIMIT_W = 1100.0


@pytest.fixture(scope="module")
def reference() -> Scenario:
    return Scenario.load(DEFAULT_SCENARIO)


def render_phase(scenario: Scenario, start_s: float, end_s: float, seed: int = 0):
    t = np.arange(start_s, end_s, 0.1)
    return scenario.render(t, seed=seed)


# -- the source ---------------------------------------------------------------------------------------


def test_sim_source_implements_the_protocol() -> None:
    source = SimSource()
    assert isinstance(source, TelemetrySource)
    assert source.name == "sim"
    infos = source.gpus()
    assert len(infos) == 8
    assert {i.name for i in infos} == {"NVIDIA B300 SXM6 AC"}
    assert all(i.power_limit_w == LIMIT_W for i in infos)
    assert len({i.uuid for i in infos}) == 8 and all(i.uuid.startswith("GPU-") for i in infos)
    samples = source.sample(100.0)
    assert [s.gpu for s in samples] == list(range(8))
    s = samples[0]
    assert s.ok and s.time_s == 100.0 and s.uuid == infos[0].uuid
    assert s.power_limit_w == LIMIT_W and s.memory_total_bytes == 275_040 * 1024 * 1024
    for value in (s.power_w, s.energy_j, s.utilization_ratio, s.memory_used_bytes, s.nvlink_tx_bytes):
        assert value is not None and value >= 0
    source.close()


def test_same_seed_same_readings_whatever_the_call_history() -> None:
    a, b = SimSource(seed=3, start_s=0.0), SimSource(seed=3, start_s=0.0)
    for t in (0.0, 5.0, 12.3):
        a.sample(t)
    assert a.sample(42.0) == b.sample(42.0)
    other = SimSource(seed=4, start_s=0.0)
    assert [x.power_w for x in other.sample(42.0)] != [x.power_w for x in b.sample(42.0)]


def test_start_anchors_on_first_use_and_truth_follows_the_loop_clock() -> None:
    source = SimSource()
    source.sample(5000.0)
    assert source.truth(5000.0).phase_name == "train"
    assert source.truth(5000.0 + 35.0).phase_name == "checkpoint"
    assert source.truth(5000.0 + 115.0).phase_name == "epoch-end-deadlock"


def test_gpu_count_override_and_attached_pids() -> None:
    source = SimSource(gpus=16)
    assert len(source.gpus()) == 16
    source.attach_pids({3: [1234, 1235]})
    samples = source.sample(0.0)
    assert len(samples) == 16 and samples[3].pids == (1234, 1235) and samples[4].pids == ()
    assert len(source.truth(0.0).job_phases) == 16


def test_unknown_scenario_name_is_unavailable() -> None:
    with pytest.raises(TelemetryUnavailable, match="reference-b300"):
        SimSource("no-such-scenario")


# -- the built-in scenario --------------------------------------------------------------------------


def test_builtin_scenario_is_listed_and_found() -> None:
    assert DEFAULT_SCENARIO in names()
    assert find(DEFAULT_SCENARIO).name == "reference-b300.toml"
    with pytest.raises(FileNotFoundError, match="built-in scenarios are"):
        find("nope")


def test_reference_scenario_shape(reference: Scenario) -> None:
    assert reference.model == "B300" and reference.gpus == 8 and reference.power_limit_w == LIMIT_W
    assert reference.sample_rate_hz == 10.0 and reference.loop
    assert 540 <= reference.duration_s <= 660  # loops every ~10 minutes
    names_in_order = [p.name for p in reference.phases]
    assert names_in_order[0] == "train" and names_in_order[-1] == "epoch-end-deadlock"
    assert {"checkpoint", "data-stall"} <= set(names_in_order)
    deadlock_start = reference.phase_spans(reference.duration_s)[-1].start_s
    assert deadlock_start < 120.0  # the epoch-end deadlock begins within the first two minutes


def test_every_number_in_the_reference_scenario_has_a_note(reference: Scenario) -> None:
    for key in (
        "model",
        "device_name",
        "gpus",
        "power_limit_w",
        "memory_total_mib",
        "sample_rate_hz",
        "loop",
    ):
        assert reference.notes.get(key), f"top-level {key} has no note"
    for name, behaviour in reference.behaviours.items():
        assert len(behaviour.note) > 40, f"behaviour {name} has no real note"
    for phase in reference.phases:
        assert len(phase.note) > 20, f"phase {phase.name} has no note"
    text = find(DEFAULT_SCENARIO).read_text()
    assert "estimate" in text.lower() and "E:" in text and "M:" in text


def test_reference_training_matches_public_figures(reference: Scenario) -> None:
    frame = render_phase(reference, 0.0, 30.0)
    fraction = frame.power_w / LIMIT_W
    assert fraction.min() >= 0.745 and fraction.max() <= 0.805  # 0.75-0.80 of limit
    assert frame.utilization_ratio.min() >= 0.85 and frame.utilization_ratio.max() <= 0.97
    assert 0.007 < np.std(fraction) < 0.01  # jittered, not flat


def test_reference_checkpoint_writer_and_waiters(reference: Scenario) -> None:
    frame = render_phase(reference, 31.0, 69.0)
    writer_fraction = frame.power_w[:, 0] / LIMIT_W
    assert abs(writer_fraction.mean() - 0.14) < 0.005
    assert frame.utilization_ratio[:, 0].max() <= 0.10
    waiters = frame.power_w[:, 1:] / LIMIT_W
    assert abs(waiters.mean() - 0.17) < 0.003 and waiters.max() < 0.18
    assert (frame.utilization_ratio[:, 1:] == 1.0).all()
    assert (frame.pcie_tx_bytes_per_s[:, 0] > 0).all() and (frame.pcie_tx_bytes_per_s[:, 1:] == 0).all()


def test_reference_data_stall(reference: Scenario) -> None:
    frame = render_phase(reference, 80.0, 88.0)
    assert frame.utilization_ratio.min() >= 0.20 and frame.utilization_ratio.max() <= 0.45
    assert abs((frame.power_w / LIMIT_W).mean() - 0.30) < 0.02


def test_reference_epoch_end_deadlock(reference: Scenario) -> None:
    frame = render_phase(reference, 111.0, 599.0)
    assert (frame.utilization_ratio == 1.0).all()
    assert abs((frame.power_w / LIMIT_W).mean() - 0.17) < 0.003
    # NVLink counters frozen on every GPU: the hung-collective evidence.
    assert np.ptp(frame.nvlink_bytes, axis=0).max() == 0.0
    truth_a, truth_b = reference.truth(120.0), reference.truth(590.0)
    assert truth_a.step == truth_b.step  # steps frozen
    assert truth_a.job_phases == ("epoch_end",) * 6 + ("train",) * 2  # the phase disagreement


def test_truth_steps_advance_in_training_and_freeze_elsewhere(reference: Scenario) -> None:
    t0, t1 = reference.truth(0.0), reference.truth(29.9)
    assert t0.step == 0 and t1.step == 5 and t0.job_phase == "train"
    ckpt = reference.truth(50.0)
    assert ckpt.job_phase == "checkpoint" and ckpt.step == reference.truth(35.0).step
    assert ckpt.phase_elapsed_s == pytest.approx(20.0) and ckpt.phase_remaining_s == pytest.approx(20.0)
    # Loop restart: time wraps, steps keep counting (a job resumed from its checkpoint).
    again = reference.truth(reference.duration_s + 1.0)
    assert again.loop == 1 and again.phase_name == "train" and again.step > reference.truth(599.0).step


def test_counters_are_monotonic_and_energy_integrates_power(reference: Scenario) -> None:
    t = np.arange(0.0, 1300.0, 0.5)
    frame = reference.render(t)
    assert (np.diff(frame.energy_j, axis=0) >= 0).all()
    assert (np.diff(frame.nvlink_bytes, axis=0) >= 0).all()
    mean_power = (frame.energy_j[-1] - frame.energy_j[0]) / (t[-1] - t[0])
    assert np.allclose(mean_power, frame.power_w.mean(axis=0), rtol=0.02)


# -- scenarios built in code and from TOML -------------------------------------------------------


def test_from_phases_symmetric_hang() -> None:
    hang = Scenario.from_phases(
        [
            {
                "name": "train",
                "duration_s": 600,
                "step_rate_per_s": 0.2,
                "gpu": {"power_fraction": 0.78, "utilization_ratio": 0.92},
            },
            {"name": "hang", "duration_s": 900, "gpu": {"power_fraction": 0.22, "utilization_ratio": 1.0}},
        ],
        model="H100",
        power_limit_w=700.0,
    )
    assert hang.duration_s == 1500 and not hang.loop and hang.device_name == "NVIDIA H100"
    frame = hang.render(np.array([10.0, 700.0, 5000.0]))
    assert np.allclose(frame.power_w[0], 0.78 * 700) and np.allclose(frame.power_w[1:], 0.22 * 700)
    last = hang.truth(5000.0)  # the last phase holds forever without loop
    assert last.phase_name == "hang" and math.isinf(last.phase_remaining_s) and last.step == 120


def test_symmetric_hang_helper_and_phase_objects() -> None:
    scenario = Scenario.symmetric_hang(600, 900, model="H100", power_limit_w=700, spin_fraction=0.22)
    spans = scenario.phase_spans(1500)
    assert [(s.name, s.start_s, s.end_s) for s in spans] == [("train", 0, 600), ("hang", 600, 1500)]
    spin = GpuBehaviour(power_fraction=0.2, utilization_ratio=1.0)
    writer = GpuBehaviour(power_fraction=0.1, utilization_ratio=0.05, job_phase="checkpoint")
    custom = Scenario.from_phases([Phase("wait", 10.0, spin, overrides=((frozenset({0}), writer),))], gpus=2)
    assert custom.truth(1.0).job_phases == ("checkpoint", "train")
    assert custom.render(np.array([1.0])).utilization_ratio.tolist() == [[0.05, 1.0]]


def test_scenario_from_a_toml_path_with_named_behaviours_and_partial_overrides(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        """
name = "mine"
model = "H100"
gpus = 4
power_limit_w = 700
[behaviours.busy]
power_fraction = 0.8
utilization_ratio = 0.9
note = "test"
[[phases]]
name = "work"
duration_s = 10
gpu = "busy"
[[phases.overrides]]
gpus = [3]
power_fraction = 0.5
"""
    )
    scenario = Scenario.load(str(path))
    assert scenario.gpus == 4 and scenario.origin == str(path)
    frame = scenario.render(np.array([1.0]))
    assert frame.power_w[0].tolist() == [560.0, 560.0, 560.0, 350.0]
    assert frame.utilization_ratio[0, 3] == 0.9  # inherited from the phase's behaviour
    assert SimSource(path).gpus()[0].name == "NVIDIA H100"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"gpus": 0}, "gpus: expected an integer"),
        ({"power_limit_w": "lots"}, "power_limit_w: expected a number"),
        ({"colour": "red"}, "colour: unknown key"),
        ({"phases": []}, "phases: expected a non-empty list"),
        (
            {"phases": [{"name": "x", "duration_s": 0, "gpu": "b"}]},
            r"phases\[0\]\.duration_s: expected a number in \(0",
        ),
        ({"phases": [{"name": "x", "duration_s": 1, "gpu": "nope"}]}, "unknown behaviour 'nope'"),
        (
            {"phases": [{"name": "x", "duration_s": 1, "gpu": "b", "job_phase": "lunch"}]},
            "job_phase: expected one of",
        ),
        (
            {"phases": [{"name": "x", "duration_s": 1, "gpu": {"power_fraction": 0.5}}]},
            "utilization_ratio: missing",
        ),
        (
            {
                "phases": [
                    {"name": "x", "duration_s": 1, "gpu": {"power_fraction": 0.5, "utilization_ratio": 2}}
                ]
            },
            r"utilization_ratio: expected a number in \[0.0, 1.0\]",
        ),
        (
            {
                "phases": [
                    {
                        "name": "x",
                        "duration_s": 1,
                        "gpu": "b",
                        "overrides": [{"gpus": [], "power_fraction": 0.1}],
                    }
                ]
            },
            "overrides\\[0\\]\\.gpus",
        ),
        (
            {
                "phases": [
                    {"name": "x", "duration_s": 1, "gpu": "b", "overrides": [{"gpus": [0], "wattage": 1}]}
                ]
            },
            "wattage: unknown key",
        ),
    ],
)
def test_malformed_scenarios_name_the_key(patch: dict, message: str) -> None:
    data = {
        "name": "t",
        "model": "B300",
        "gpus": 2,
        "power_limit_w": 1100,
        "behaviours": {"b": {"power_fraction": 0.5, "utilization_ratio": 0.5}},
        "phases": [{"name": "x", "duration_s": 1, "gpu": "b"}],
    }
    data.update(patch)
    with pytest.raises(ScenarioError, match=message) as info:
        Scenario.from_dict(data, origin="bad.toml")
    assert str(info.value).startswith("bad.toml: ")


def test_invalid_toml_syntax_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("name = \n")
    with pytest.raises(ScenarioError, match=r"broken\.toml"):
        Scenario.load(path)


# -- the nvidia-smi CSV writer ---------------------------------------------------------------------

TIMESTAMP = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{3}$")


def test_writer_header_and_cells_match_nvidia_smi(tmp_path: Path) -> None:
    info = write_nvsmi_csv(tmp_path / "rec.csv", "reference-b300", duration_s=60.0)
    assert isinstance(info, RecordingInfo)
    assert info.rows == 600 * 8 and info.snapshots == 600 and info.gpus == 8
    lines = info.path.read_text().splitlines()
    assert lines[0] == "timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]"
    assert len(lines) == 1 + info.rows
    assert lines[1].startswith("2026/01/01 00:00:00.000, ")
    for line in lines[1:]:
        ts, power, util, mem = line.split(", ")
        assert TIMESTAMP.match(ts)
        assert re.fullmatch(r"\d+\.\d{2} W", power)
        assert re.fullmatch(r"\d{1,3} %", util)
        assert re.fullmatch(r"\d+ MiB", mem)


def test_writer_values_equal_the_rendered_scenario(tmp_path: Path) -> None:
    scenario = Scenario.load()
    info = write_nvsmi_csv(tmp_path / "rec.csv", scenario, duration_s=120.0, seed=5)
    with info.path.open() as fh:
        rows = list(csv.reader(fh, skipinitialspace=True))[1:]
    power = np.array([float(r[1].removesuffix(" W")) for r in rows]).reshape(-1, 8)
    util = np.array([int(r[2].removesuffix(" %")) for r in rows]).reshape(-1, 8)
    frame = scenario.render(np.arange(1200) / 10.0, seed=5)
    assert np.allclose(power, np.round(frame.power_w, 2), atol=0.006)
    assert (util == np.round(frame.utilization_ratio * 100)).all()


def test_writer_timestamps_increase_within_and_across_snapshots(tmp_path: Path) -> None:
    info = write_nvsmi_csv(
        tmp_path / "rec.csv", "reference-b300", duration_s=5.0, start_epoch_s=86_400.0 - 2.0
    )
    stamps = [line.split(", ")[0] for line in info.path.read_text().splitlines()[1:]]
    assert stamps == sorted(stamps)  # fixed-width, so lexical order is time order
    assert stamps[0] == "1970/01/01 23:59:58.000" and stamps[-1].startswith("1970/01/02 00:00:02.9")
    snapshot_1 = stamps[8:16]
    assert snapshot_1[0] == "1970/01/01 23:59:58.100" and snapshot_1[-1] <= "1970/01/01 23:59:58.120"


def test_writer_with_index_and_without_units(tmp_path: Path) -> None:
    info = write_nvsmi_csv(
        tmp_path / "rec.csv", SimSource(gpus=3, seed=1), duration_s=1.0, with_index=True, units_in_cells=False
    )
    lines = info.path.read_text().splitlines()
    assert lines[0] == (
        "timestamp, index, name, power.draw [W], power.limit [W], utilization.gpu [%], memory.used [MiB]"
    )
    assert info.rows == 30
    first = lines[1].split(", ")
    assert first[1:3] == ["0", "NVIDIA B300 SXM6 AC"] and first[4] == "1100.00"
    assert re.fullmatch(r"\d+\.\d\d", first[3]) and first[5].isdigit() and first[6].isdigit()
    assert [line.split(", ")[1] for line in lines[1:7]] == ["0", "1", "2", "0", "1", "2"]


def test_writer_is_reproducible_and_returns_ground_truth(tmp_path: Path) -> None:
    scenario = Scenario.symmetric_hang(600, 900)
    a = write_nvsmi_csv(tmp_path / "a.csv", scenario, duration_s=1500.0, chunk_rows=50_000)
    b = write_nvsmi_csv(tmp_path / "b.csv", scenario, duration_s=1500.0)
    assert a.path.read_bytes() == b.path.read_bytes()  # chunking does not change a byte
    assert [(p.name, p.start_s, p.end_s) for p in a.phases] == [
        ("train", 0.0, 600.0),
        ("hang", 600.0, 1500.0),
    ]
    assert a.rows == 15_000 * 8 and a.power_limit_w == LIMIT_W and a.model == "B300"


def test_writer_writes_a_million_rows(tmp_path: Path) -> None:
    """1 M rows written in chunks come out complete (its speed is measured in benchmarks/, not here)."""
    info = write_nvsmi_csv(tmp_path / "big.csv", "reference-b300", duration_s=12_500.0, chunk_rows=300_000)
    assert info.rows == 1_000_000
    with open(tmp_path / "big.csv", "rb") as f:
        assert sum(1 for _ in f) == 1_000_001  # header + rows


def test_writer_rejects_other_sources(tmp_path: Path) -> None:
    from gpu_triage.telemetry.none import NoneSource

    with pytest.raises(TypeError, match="SimSource"):
        write_nvsmi_csv(tmp_path / "x.csv", NoneSource(), 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="> 0"):
        write_nvsmi_csv(tmp_path / "x.csv", "reference-b300", 0.0)


def test_writer_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_triage.telemetry.recording_writer import main

    assert main([str(tmp_path / "cli.csv"), "--duration", "2", "--gpus", "2", "--nounits"]) == 0
    assert "wrote 40 rows" in capsys.readouterr().out
    assert (tmp_path / "cli.csv").read_text().splitlines()[1].count(" W") == 0


def test_recording_replays_through_the_replay_source(tmp_path: Path) -> None:
    """Round trip with the replay reader, once it exists: what we write is what people record."""
    replay = pytest.importorskip("gpu_triage.telemetry.replay")
    info = write_nvsmi_csv(tmp_path / "rec.csv", "reference-b300", duration_s=3.0, with_index=True)
    source = replay.ReplaySource(info.path)
    try:
        assert len(source.gpus()) == 8
    finally:
        source.close()


@pytest.mark.parametrize("kw", [{}, {"with_index": True}, {"units_in_cells": False}])
def test_recording_round_trips_through_the_csv_reader(tmp_path: Path, kw: dict) -> None:
    """The project's nvidia-smi reader gets back the values the scenario rendered."""
    reader = pytest.importorskip("gpu_triage.recordings.nvsmi_csv")
    scenario = Scenario.load()
    info = write_nvsmi_csv(tmp_path / "rec.csv", scenario, duration_s=30.0, **kw)
    header, chunk = reader.read_recording(info.path, gpus=None if kw.get("with_index") else 8)
    assert header.gpus == 8
    frame = scenario.render(np.arange(300) / 10.0)
    assert np.allclose(chunk.power_w.reshape(-1, 8), frame.power_w, atol=0.006)
    assert np.allclose(chunk.utilization_ratio.reshape(-1, 8), frame.utilization_ratio)
    if kw.get("with_index"):
        assert header.power_limit_w == LIMIT_W and set(header.gpu_names) == {"NVIDIA B300 SXM6 AC"}


def test_the_fast_single_sample_equals_the_vectorised_render() -> None:
    """SimSource.sample computes one time point on rows (the daemon's 10 Hz path); it must give what
    Scenario.render gives, to the last digit, in every phase, across loops and before the start."""
    source = SimSource("reference-b300", gpus=16, start_s=0.0, seed=7)
    for t in [*np.arange(-3.0, 1300.0, 0.7), 98765.43]:
        assert source.sample(float(t)) == source._sample_by_render(float(t))
    # and each field is the frame's own (the samples are built positionally)
    source.attach_pids({3: (42,)})
    frame = source.scenario.render(np.array([500.0]), gpus=16, seed=7)
    for s in source.sample(500.0):
        g, info = s.gpu, source.gpus()[s.gpu]
        assert (s.time_s, s.power_w, s.power_instant_w) == (500.0, frame.power_w[0][g], frame.power_w[0][g])
        assert (s.energy_j, s.utilization_ratio) == (frame.energy_j[0][g], frame.utilization_ratio[0][g])
        assert (s.memory_used_bytes, s.memory_total_bytes) == (
            frame.memory_used_bytes[0][g],
            info.memory_total_bytes,
        )
        assert (s.sm_clock_mhz, s.temperature_c) == (frame.sm_clock_mhz[0][g], frame.temperature_c[0][g])
        assert (s.nvlink_tx_bytes, s.nvlink_rx_bytes) == (frame.nvlink_bytes[0][g], frame.nvlink_bytes[0][g])
        assert s.pcie_tx_bytes_per_s == frame.pcie_tx_bytes_per_s[0][g]
        assert s.pcie_rx_bytes_per_s == frame.pcie_rx_bytes_per_s[0][g]
        assert (s.power_limit_w, s.pids) == (info.power_limit_w, (42,) if g == 3 else ())
        assert (s.uuid, s.name, s.pci_bus_id, s.error) == (info.uuid, info.name, info.pci_bus_id, None)
