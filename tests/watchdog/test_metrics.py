"""Prometheus exposition of a snapshot: names, labels, one-hot encodings, and promtool's lint."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import prometheus_client
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpu_triage.model.snapshot import Snapshot
from gpu_triage.model.states import GPU_STATES, VERDICTS, GpuState, Mode, Verdict
from gpu_triage.serving.metrics import METRIC_NAMES, MetricsExposition, _check_unit, make_registry, render
from gpu_triage.serving.publish import SnapshotHolder
from gpu_triage.signals.pods import PodRef
from tests.conftest import require_binary
from tests.watchdog.snapshots import T0, rank_status, snapshot


def full_snapshot() -> Snapshot:
    """Every metric family has samples: a deadlocked job with a rank on a lease, an idle second job."""
    snap = snapshot(gpus=4, verdict=Verdict.DEADLOCK_SUSPECTED, jobs=2, mode=Mode.KILL, armed=True)
    job = snap.jobs[0]
    pod = PodRef("3f2a91c4-1b2d-4e5f-8a9b-0c1d2e3f4a5b", "ml-team", "qwen3-ft-worker-0", "trainer", "ab" * 32)
    ranks = (replace(rank_status(0, phase="epoch_end"), pod=pod), *job.ranks[1:])
    return replace(snap, jobs=(replace(job, ranks=ranks), snap.jobs[1]))


def scrape(snap: Snapshot | None, *, process_metrics: bool = False) -> str:
    body, _content_type = render(make_registry(SnapshotHolder(snap), process_metrics=process_metrics))
    return body.decode()


def samples(text: str) -> dict[str, list[Sample]]:
    by_name: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            by_name.setdefault(sample.name, []).append(sample)
    return by_name


def types(text: str) -> dict[str, str]:
    found = {}
    for family in text_string_to_metric_families(text):
        # The text parser strips "_total" from counter family names; the samples keep it.
        name = family.name + "_total" if family.type == "counter" else family.name
        found[name] = "info" if name.endswith("_info") else family.type
    return found


def test_every_documented_family_is_exposed_with_its_type() -> None:
    assert types(scrape(full_snapshot())) == METRIC_NAMES


def test_contract_names_from_design() -> None:
    names = samples(scrape(full_snapshot())).keys()
    for name in (
        "gpu_watchdog_power_watts",
        "gpu_watchdog_energy_joules_total",
        "gpu_watchdog_utilization_ratio",
        "gpu_watchdog_state",
        "gpu_watchdog_verdict",
        "gpu_watchdog_rank_step",
        "gpu_watchdog_actions_total",
        "gpu_watchdog_sample_duration_seconds",
        "gpu_watchdog_last_sample_timestamp_seconds",
        "gpu_watchdog_info",
    ):
        assert name in names
    assert not [n for n in names if "_watts_watts" in n or "_seconds_seconds" in n or "_total_total" in n]


def test_per_gpu_series_carry_dcgm_exporters_gpu_uuid_and_hostname_labels() -> None:
    snap = full_snapshot()
    by_name = samples(scrape(snap))
    power = {s.labels["gpu"]: s for s in by_name["gpu_watchdog_power_watts"]}
    assert sorted(power) == ["0", "1", "2", "3"]
    # dcgm-exporter's spelling: gpu (index), UUID (NVML's GPU-... string), Hostname, pci_bus_id.
    assert power["2"].labels == {
        "gpu": "2",
        "UUID": "GPU-00000002-0000-4000-8000-000000000000",
        "Hostname": snap.node,
        "pci_bus_id": "00000000:1A:00.0",
    }
    assert power["2"].value == 230.0
    limits = {s.labels["gpu"]: s.value for s in by_name["gpu_watchdog_power_limit_watts"]}
    assert limits == {str(g): 1100.0 for g in range(4)}
    energy = {s.labels["gpu"]: s.value for s in by_name["gpu_watchdog_energy_joules_total"]}
    assert energy["3"] == 1_000_003.0
    assert {s.value for s in by_name["gpu_watchdog_memory_used_bytes"]} == {150.0 * 2**30}
    assert {s.value for s in by_name["gpu_watchdog_temperature_celsius"]} == {61.0}
    assert {s.value for s in by_name["gpu_watchdog_sm_clock_hertz"]} == {1965e6}
    assert {s.value for s in by_name["gpu_watchdog_state_since_timestamp_seconds"]} == {T0 - 60.0}
    assert {s.labels["gpu"] for s in by_name["gpu_watchdog_read_errors_total"]} == {"0", "1", "2", "3"}


def test_gpu_state_is_one_hot_over_every_state() -> None:
    snap = snapshot(gpus=3)
    gpus = (
        snap.gpus[0],
        replace(snap.gpus[1], state=GpuState.COMMUNICATION),
        replace(snap.gpus[2], state=GpuState.UNKNOWN, power_w=None),
    )
    state = samples(scrape(replace(snap, gpus=gpus)))["gpu_watchdog_state"]
    assert len(state) == 3 * len(GPU_STATES)
    hot = {(s.labels["gpu"], s.labels["state"]) for s in state if s.value == 1.0}
    assert hot == {("0", "compute"), ("1", "communication"), ("2", "unknown")}
    assert {s.value for s in state} == {0.0, 1.0}
    assert {s.labels["state"] for s in state} == {s.value for s in GPU_STATES}


def test_unknown_values_are_left_out_not_invented() -> None:
    snap = snapshot(gpus=2)
    lost = replace(
        snap.gpus[1],
        power_w=None,
        utilization_ratio=float("nan"),
        temperature_c=None,
        state=GpuState.UNKNOWN,
        read_errors_total=7,
        impossible_power_limits_total=3,
    )
    by_name = samples(scrape(replace(snap, gpus=(snap.gpus[0], lost), last_sample_time=None)))
    assert [s.labels["gpu"] for s in by_name["gpu_watchdog_power_watts"]] == ["0"]
    assert [s.labels["gpu"] for s in by_name["gpu_watchdog_utilization_ratio"]] == ["0"]
    assert [s.labels["gpu"] for s in by_name["gpu_watchdog_temperature_celsius"]] == ["0"]
    errors = {s.labels["gpu"]: s.value for s in by_name["gpu_watchdog_read_errors_total"]}
    assert errors == {"0": 0.0, "1": 7.0}
    impossible = {s.labels["gpu"]: s.value for s in by_name["gpu_watchdog_impossible_power_limit_total"]}
    assert impossible == {"0": 0.0, "1": 3.0}
    assert "gpu_watchdog_last_sample_timestamp_seconds" not in by_name


def test_verdicts_are_one_hot_per_job_with_onset_and_ranks() -> None:
    by_name = samples(scrape(full_snapshot()))
    verdict = by_name["gpu_watchdog_verdict"]
    assert len(verdict) == 2 * len(VERDICTS)
    hot = {(s.labels["training_job"], s.labels["verdict"]) for s in verdict if s.value == 1.0}
    assert hot == {("qwen3-32b-ft", "deadlock_suspected"), ("job-1", "healthy")}
    onset = {
        s.labels["training_job"]: s.value for s in by_name["gpu_watchdog_verdict_onset_timestamp_seconds"]
    }
    assert onset == {"qwen3-32b-ft": T0 - 60.0}  # the healthy job has no onset
    raised = {
        s.labels["training_job"]: s.value for s in by_name["gpu_watchdog_verdict_raised_timestamp_seconds"]
    }
    assert raised == {"qwen3-32b-ft": T0 - 20.0}
    steps = {(s.labels["training_job"], s.labels["rank"]): s.value for s in by_name["gpu_watchdog_rank_step"]}
    assert steps[("qwen3-32b-ft", "3")] == 1200.0
    assert len(steps) == 4 + 1
    leases = by_name["gpu_watchdog_rank_lease_until_timestamp_seconds"]
    assert [(s.labels, s.value) for s in leases] == [
        ({"training_job": "qwen3-32b-ft", "rank": "0"}, T0 + 30.0)
    ]


def test_a_rank_in_a_pod_has_a_pod_info_series() -> None:
    info = samples(scrape(full_snapshot()))["gpu_watchdog_rank_pod_info"]
    assert [(s.labels, s.value) for s in info] == [
        (
            {
                "training_job": "qwen3-32b-ft",
                "rank": "0",
                "pod_uid": "3f2a91c4-1b2d-4e5f-8a9b-0c1d2e3f4a5b",
                "namespace": "ml-team",
                "pod": "qwen3-ft-worker-0",
                "container": "trainer",
            },
            1.0,
        )
    ]


def test_kill_worthy_is_a_per_job_gauge_as_in_status() -> None:
    snap = full_snapshot()
    by_name = samples(scrape(snap))
    assert {s.labels["training_job"]: s.value for s in by_name["gpu_watchdog_kill_worthy"]} == {
        "qwen3-32b-ft": 0.0,
        "job-1": 0.0,
    }
    confirmed = replace(snap.jobs[0], verdict=Verdict.DEADLOCK_CONFIRMED, kill_worthy=True)
    by_name = samples(scrape(replace(snap, jobs=(confirmed, snap.jobs[1]))))
    assert {s.labels["training_job"]: s.value for s in by_name["gpu_watchdog_kill_worthy"]} == {
        "qwen3-32b-ft": 1.0,
        "job-1": 0.0,
    }


def test_daemon_health_mode_and_info() -> None:
    by_name = samples(scrape(full_snapshot()))

    def value(name: str) -> float:
        (sample,) = by_name[name]
        return sample.value

    assert value("gpu_watchdog_sample_duration_seconds") == 0.0021
    assert value("gpu_watchdog_last_sample_timestamp_seconds") == T0 - 0.01
    assert value("gpu_watchdog_last_cycle_timestamp_seconds") == T0
    assert value("gpu_watchdog_period_seconds") == 1.0
    assert value("gpu_watchdog_cycles_total") == 42.0
    assert value("gpu_watchdog_armed") == 1.0
    mode = {s.labels["mode"]: s.value for s in by_name["gpu_watchdog_mode"]}
    assert mode == {"observe": 0.0, "alert": 0.0, "kill": 1.0}
    (info,) = by_name["gpu_watchdog_info"]
    assert info.labels == {"version": "0.1.0", "node": "node-a", "source": "sim"}
    assert info.value == 1.0
    actions = {
        (s.labels["action"], s.labels["result"]): s.value for s in by_name["gpu_watchdog_actions_total"]
    }
    assert actions == {("capture", "ok"): 2.0, ("alert", "failed"): 1.0}


def test_nothing_of_ours_before_the_first_cycle() -> None:
    assert scrape(None) == ""


def test_each_scrape_renders_the_latest_snapshot() -> None:
    holder = SnapshotHolder(snapshot(cycle=1))
    registry = make_registry(holder, process_metrics=False)
    assert "gpu_watchdog_cycles_total 1.0" in render(registry)[0].decode()
    holder.publish(snapshot(cycle=2))
    assert "gpu_watchdog_cycles_total 2.0" in render(registry)[0].decode()


OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
def test_the_cached_exposition_is_the_fresh_rendering(accept: str | None) -> None:
    """/metrics' cache gives byte for byte what rendering the registry gives, in either format."""
    holder = SnapshotHolder(full_snapshot())
    exposition = MetricsExposition(holder, process_metrics=False)
    fresh = render(make_registry(holder, process_metrics=False), accept)
    assert exposition.render(accept) == fresh
    assert exposition.render(accept) == fresh  # from the cache now


def test_the_exposition_is_encoded_once_per_snapshot_and_format() -> None:
    holder = SnapshotHolder(snapshot(cycle=1))
    exposition = MetricsExposition(holder, process_metrics=False)
    for _ in range(5):
        assert "gpu_watchdog_cycles_total 1.0" in exposition.render()[0].decode()
    assert exposition.renders == 1
    exposition.render(OPENMETRICS)
    assert exposition.renders == 2
    holder.publish(snapshot(cycle=2))  # a new snapshot: rendered anew, never the old bytes
    assert "gpu_watchdog_cycles_total 2.0" in exposition.render()[0].decode()
    assert exposition.renders == 3


def test_the_cached_exposition_keeps_process_metrics_live_and_one_openmetrics_eof() -> None:
    exposition = MetricsExposition(SnapshotHolder(full_snapshot()))
    text = exposition.render()[0].decode()
    assert "process_resident_memory_bytes" in text and "gpu_watchdog_power_watts" in text
    assert types(text).items() >= METRIC_NAMES.items()
    body, content_type = exposition.render(OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text")
    assert body.count(b"# EOF") == 1 and body.endswith(b"# EOF\n")
    families = {f.name for f in parse_openmetrics(body.decode())}  # the parser refuses a mid-body EOF
    assert {"process_resident_memory_bytes", "gpu_watchdog_power_watts"} <= families


def test_the_cached_exposition_is_empty_of_ours_before_the_first_cycle() -> None:
    exposition = MetricsExposition(SnapshotHolder(None), process_metrics=False)
    assert exposition.render() == (b"", exposition.render()[1])


def test_the_global_registry_is_left_alone() -> None:
    make_registry(SnapshotHolder(full_snapshot()))
    global_text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "gpu_watchdog_" not in global_text


def test_process_metrics_are_included_by_default() -> None:
    assert "process_resident_memory_bytes" in scrape(full_snapshot(), process_metrics=True)


def test_openmetrics_rendering_parses() -> None:
    registry = make_registry(SnapshotHolder(full_snapshot()), process_metrics=False)
    body, content_type = render(registry, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    families = {f.name: f for f in parse_openmetrics(body.decode())}
    assert families["gpu_watchdog_energy_joules"].type == "counter"
    assert families["gpu_watchdog_energy_joules"].unit == "joules"
    assert families["gpu_watchdog_power_watts"].unit == "watts"
    assert families["gpu_watchdog"].type == "info"


def test_a_name_without_its_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="unit"):
        _check_unit("gpu_watchdog_power", "watts")
    _check_unit("gpu_watchdog_energy_joules_total", "joules")


def test_promtool_finds_nothing_to_complain_about() -> None:
    promtool = require_binary("promtool", "Debian package 'prometheus' (.ci/install-system-deps.sh)")
    text = scrape(full_snapshot(), process_metrics=True)
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_promtool_would_complain_about_a_bad_exposition() -> None:
    # The check above can fail: promtool does flag a counter without _total and a non-base unit.
    promtool = require_binary("promtool", "Debian package 'prometheus' (.ci/install-system-deps.sh)")
    bad = "# HELP x_power_milliwatts p\n# TYPE x_power_milliwatts counter\nx_power_milliwatts 1\n"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    assert "_total" in result.stdout + result.stderr


def test_gpus_held_idle_say_for_how_long_and_by_which_job() -> None:
    """Issue 19: a GPU idle with memory held by a live process (a hung loader, a paused job) has a
    series with the seconds it has been so, labelled with the job tied to it (empty: none)."""
    snap = snapshot(gpus=4)
    job = replace(snap.jobs[0], ranks=snap.jobs[0].ranks[:2])  # ranks on GPUs 0 and 1 only
    held = replace(snap.gpus[1], state=GpuState.IDLE, state_since=T0 - 2000.0, power_w=190.0)
    freed = replace(snap.gpus[2], state=GpuState.IDLE, state_since=T0 - 2000.0, memory_used_bytes=0.2 * 2**30)
    orphan = replace(snap.gpus[3], state=GpuState.IDLE, state_since=T0 - 100.0)
    snap = replace(snap, gpus=(snap.gpus[0], held, freed, orphan), jobs=(job,))
    got = {
        (s.labels["gpu"], s.labels["training_job"]): s.value
        for s in samples(scrape(snap))["gpu_watchdog_gpu_held_idle_seconds"]
    }
    assert got == {("1", "qwen3-32b-ft"): 2000.0, ("3", ""): 100.0}


def test_process_series_are_reused_only_up_to_their_age() -> None:
    """/metrics reuses the encoded process_* series for at most process_max_age_s (a flood costs no
    render per request), then reads them anew; the snapshot's part is unaffected by the age."""
    now = [100.0]
    exposition = MetricsExposition(
        SnapshotHolder(full_snapshot()), process_max_age_s=1.0, monotonic=lambda: now[0]
    )
    first = exposition.render()[0]
    calls = []
    real_collect = exposition._process.collect  # type: ignore[union-attr]

    def counting_collect():  # the process collector is the boundary read here
        calls.append(now[0])
        return real_collect()

    exposition._process.collect = counting_collect  # type: ignore[union-attr,method-assign]
    now[0] = 100.5
    assert exposition.render()[0] == first and calls == []  # within the second: the same bytes
    now[0] = 101.2
    exposition.render()
    assert calls == [101.2]  # past it: read again
    assert exposition.renders == 1  # the snapshot was encoded once all along
