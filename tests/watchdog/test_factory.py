"""``--source`` specs: each form builds the right source; ``auto`` never falls back to simulated data."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpu_triage.model.samples import TelemetrySource, TelemetryUnavailable
from gpu_triage.telemetry import factory
from gpu_triage.telemetry.factory import make_source
from gpu_triage.telemetry.none import NoneSource
from gpu_triage.telemetry.nvml import nvml_available
from gpu_triage.telemetry.sim import Scenario, SimSource

# This machine has the nvidia-ml-py binding but no NVIDIA driver; tests that depend on which
# case holds say so and check the other branch where a driver answers.
HAS_NVML = nvml_available()


def test_none_source() -> None:
    source = make_source("none")
    assert isinstance(source, NoneSource) and isinstance(source, TelemetrySource)
    assert source.name == "none" and source.gpus() == [] and source.sample(1.0) == []
    source.close()


def test_sim_defaults_to_the_builtin_reference_scenario() -> None:
    source = make_source("sim")
    assert isinstance(source, SimSource) and source.name == "sim"
    assert source.scenario.name == "reference-b300" and len(source.gpus()) == 8


def test_sim_with_a_named_or_given_scenario(tmp_path: Path) -> None:
    assert make_source("sim:reference-b300").scenario.name == "reference-b300"
    custom = Scenario.symmetric_hang(10, 10, gpus=2)
    source = make_source("sim", sim_scenario=custom, sim_gpus=3, sim_seed=9)
    assert source.scenario is custom and len(source.gpus()) == 3 and source.seed == 9
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "s"\nmodel = "H100"\ngpus = 2\npower_limit_w = 700\n'
        '[[phases]]\nname = "x"\nduration_s = 1\ngpu = { power_fraction = 0.5, utilization_ratio = 1.0 }\n'
    )
    assert make_source(f"sim:{path}").scenario.model == "H100"


def test_sim_with_a_missing_scenario_is_unavailable() -> None:
    with pytest.raises(TelemetryUnavailable, match="unknown scenario"):
        make_source("sim:does-not-exist")
    with pytest.raises(TelemetryUnavailable, match="does not exist"):
        make_source("sim:/nowhere/x.toml")


def test_auto_without_nvml_is_none_with_a_warning_never_sim(caplog: pytest.LogCaptureFixture) -> None:
    if HAS_NVML:
        pytest.skip("an NVIDIA driver answers here: auto is nvml (covered below)")
    with caplog.at_level(logging.WARNING, logger="gpu_triage.telemetry"):
        source = make_source("auto")
    assert isinstance(source, NoneSource) and source.name == "none"
    assert source.reason
    assert any("--source none" in r.getMessage() for r in caplog.records)


def test_auto_logs_on_the_given_logger() -> None:
    if HAS_NVML:
        pytest.skip("an NVIDIA driver answers here")
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    log = logging.getLogger("test-factory-auto")
    log.addHandler(Collect())
    log.propagate = False
    assert make_source("auto", log=log).name == "none"
    assert len(messages) == 1 and "without GPU telemetry" in messages[0]


def test_nvml_explicitly_fails_loudly_without_a_driver() -> None:
    if HAS_NVML:
        source = make_source("nvml")
        assert source.name == "nvml"
        source.close()
        assert make_source("auto").name == "nvml"
        return
    with pytest.raises(TelemetryUnavailable):
        make_source("nvml")


def test_replay_needs_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(TelemetryUnavailable, match="does not exist"):
        make_source(f"replay:{tmp_path / 'missing.csv'}")


def test_replay_of_a_written_recording(tmp_path: Path) -> None:
    pytest.importorskip("gpu_triage.telemetry.replay")
    from gpu_triage.telemetry.recording_writer import write_nvsmi_csv

    info = write_nvsmi_csv(tmp_path / "rec.csv", "reference-b300", 2.0, with_index=True)
    source = make_source(f"replay:{info.path}")
    try:
        assert source.name == "replay"
    finally:
        source.close()


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("gpu", "unknown kind 'gpu'"),
        ("nvml:0", "'nvml' takes no argument"),
        ("none:x", "'none' takes no argument"),
        ("auto:", "'auto' takes no argument"),
        ("replay", "needs a file"),
        ("replay:", "needs a file"),
        ("sim:", "needs a scenario"),
    ],
)
def test_bad_specs_list_the_forms(spec: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as info:
        make_source(spec)
    message = str(info.value)
    for form in factory.SOURCE_FORMS:
        assert form in message


def test_kind_is_case_insensitive_and_trimmed() -> None:
    assert make_source(" None ").name == "none"
    assert make_source("SIM").name == "sim"
