"""NvmlSource against the fake NVML module: units, per-GPU failures as data, deadlines, NotSupported.

Scenario fixtures (tests/watchdog/fake_nvml.py): basic, gpu_lost, not_supported, hang, init_failure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from gpu_triage.model.samples import GpuSample, TelemetrySource, TelemetryUnavailable
from gpu_triage.telemetry.nvml import NvmlSource, nvml_available
from tests.watchdog import fake_nvml

DEADLINE_S = 0.2
SLACK_S = 0.2
MIB = 1024 * 1024


@pytest.fixture
def opened() -> Iterator[list[tuple[NvmlSource, fake_nvml.FakeNvml]]]:
    """Sources opened by a test; closed (and their fakes released) at teardown."""
    items: list[tuple[NvmlSource, fake_nvml.FakeNvml]] = []
    yield items
    for source, fake in items:
        fake.release()
        source.close()


def open_source(opened, fake: fake_nvml.FakeNvml, **kwargs) -> NvmlSource:
    source = NvmlSource(deadline_s=DEADLINE_S, nvml=fake, **kwargs)
    opened.append((source, fake))
    return source


def test_basic_readings_and_units(opened) -> None:
    fake = fake_nvml.basic()
    source = open_source(opened, fake)
    assert isinstance(source, TelemetrySource)
    assert source.name == "nvml"
    infos = source.gpus()
    assert [i.gpu for i in infos] == list(range(8))
    assert infos[0].name == "NVIDIA B300 SXM6 AC"
    assert infos[0].uuid == "GPU-00000000-0000-4000-8000-000000000000"
    assert infos[0].power_limit_w == pytest.approx(1100.0)
    assert infos[0].memory_total_bytes == 275_040 * MIB

    samples = source.sample(1234.5)
    assert [s.gpu for s in samples] == list(range(8))
    s = samples[2]
    assert s.ok and s.error is None and s.errors == ()
    assert s.time_s == 1234.5
    assert s.power_w == pytest.approx(852.0)  # 852_000 mW
    assert s.power_instant_w == pytest.approx(864.5)  # field 186, mW
    assert s.energy_j == pytest.approx(4_002_000.0)  # 4_002_000_000 mJ
    assert s.utilization_ratio == pytest.approx(0.92)  # 92 %
    assert s.memory_used_bytes == 233_000 * MIB
    assert s.memory_total_bytes == 275_040 * MIB
    assert s.sm_clock_mhz == 1965
    assert s.temperature_c == 62
    assert s.power_limit_w == pytest.approx(1100.0)
    # All 18 links summed (the all-links scope), KiB -> bytes.
    assert s.nvlink_tx_bytes == sum(range(1000, 1018)) * 1024
    assert s.nvlink_rx_bytes == sum(range(2000, 2018)) * 1024
    assert s.pcie_tx_bytes_per_s == 2_000 * 1024
    assert s.pcie_rx_bytes_per_s == 3_000 * 1024
    assert s.pids == (10_002,)
    assert s.name == "NVIDIA B300 SXM6 AC" and s.uuid == infos[2].uuid


def test_nvlink_uses_the_all_links_scope_not_link_0(opened) -> None:
    """pynvml reads link 0 alone for a bare field id; the fake honours that, so a missing scope shows."""
    source = open_source(opened, fake_nvml.basic(1))
    (s,) = source.sample(0.0)
    assert s.nvlink_tx_bytes != 1000 * 1024


def test_driver_refusing_the_all_links_scope_falls_back_to_per_link_sum(opened) -> None:
    fake = fake_nvml.basic(2)
    fake.boards[1].reject_all_links_scope = True
    source = open_source(opened, fake)
    first = source.sample(0.0)
    assert first[0].nvlink_tx_bytes == sum(range(1000, 1018)) * 1024
    assert first[1].nvlink_tx_bytes is None
    assert any(e.startswith("nvlink: InvalidArgument") for e in first[1].errors)
    second = source.sample(1.0)
    assert second[1].nvlink_tx_bytes == sum(range(1000, 1018)) * 1024
    assert second[1].nvlink_rx_bytes == sum(range(2000, 2018)) * 1024
    assert second[1].errors == ()


def test_lost_gpu_is_an_error_sample_and_the_others_read_fine(opened) -> None:
    source = open_source(opened, fake_nvml.gpu_lost(lost=3))
    infos = source.gpus()
    assert infos[3].name == "unknown" and infos[4].name == "NVIDIA B300 SXM6 AC"
    samples = source.sample(10.0)
    lost = samples[3]
    assert lost.error is not None and lost.error.startswith("GpuIsLost")
    assert not lost.ok
    assert lost.power_w is None and lost.utilization_ratio is None and lost.pids == ()
    for s in samples[:3] + samples[4:]:
        assert s.ok and s.errors == ()
        assert s.power_w == pytest.approx(850.0 + s.gpu)


def test_gpu_lost_on_an_optional_read_still_marks_the_whole_gpu(opened) -> None:
    fake = fake_nvml.basic(2)
    fake.boards[0].errors["nvmlDeviceGetMemoryInfo"] = fake_nvml.NVML_ERROR_GPU_IS_LOST
    source = open_source(opened, fake)
    samples = source.sample(0.0)
    assert samples[0].error is not None and samples[0].error.startswith("GpuIsLost")
    assert samples[0].power_w is None
    assert samples[1].ok


def test_not_supported_fields_are_none_listed_in_errors_and_never_asked_again(opened) -> None:
    fake = fake_nvml.not_supported()
    source = open_source(opened, fake)
    for t in range(3):
        for s in source.sample(float(t)):
            assert s.ok  # power is still there: the sample is usable
            assert s.energy_j is None and s.power_instant_w is None
            assert s.nvlink_tx_bytes is None and s.nvlink_rx_bytes is None
            assert set(s.errors) == {
                "energy: NotSupported",
                "power_instant: NotSupported",
                "nvlink: NotSupported",
            }
            assert s.utilization_ratio is not None and s.memory_used_bytes is not None
    # The energy counter was asked once per GPU; the field-values call stopped once both fields
    # answered NotSupported.
    assert all(fake.calls_to("nvmlDeviceGetTotalEnergyConsumption", g) == 1 for g in range(8))
    assert all(fake.calls_to("nvmlDeviceGetFieldValues", g) == 1 for g in range(8))
    assert all(fake.calls_to("nvmlDeviceGetPowerUsage", g) == 3 for g in range(8))


def test_transient_optional_error_is_reported_but_retried(opened) -> None:
    fake = fake_nvml.basic(1)
    fake.boards[0].errors["nvmlDeviceGetTemperature"] = fake_nvml.NVML_ERROR_UNKNOWN
    source = open_source(opened, fake)
    (s,) = source.sample(0.0)
    assert s.ok and s.temperature_c is None and s.errors == ("temperature: Unknown",)
    del fake.boards[0].errors["nvmlDeviceGetTemperature"]
    (s,) = source.sample(1.0)
    assert s.temperature_c == 60 and s.errors == ()


def test_essential_power_failure_sets_error(opened) -> None:
    fake = fake_nvml.basic(2)
    fake.boards[1].not_supported.add("nvmlDeviceGetPowerUsage")
    source = open_source(opened, fake)
    samples = source.sample(0.0)
    assert samples[0].ok
    assert samples[1].error is not None and samples[1].error.startswith("NotSupported")


def test_whole_field_values_call_failing_marks_its_fields(opened) -> None:
    fake = fake_nvml.basic(1)
    fake.boards[0].not_supported.add("nvmlDeviceGetFieldValues")  # an old driver without the field API
    source = open_source(opened, fake)
    (s,) = source.sample(0.0)
    assert s.ok and s.power_instant_w is None and s.nvlink_tx_bytes is None
    assert "power_instant: NotSupported" in s.errors and "nvlink: NotSupported" in s.errors
    source.sample(1.0)
    assert fake.calls_to("nvmlDeviceGetFieldValues", 0) == 1


def test_hung_gpu_costs_one_deadline_then_fails_fast_and_the_others_keep_reading(opened) -> None:
    """GPU 5 wedges mid-batch (the healthy GPUs are read in sequence on one worker): GPUs 0-4 keep
    their samples that cycle, 6-7 (not reached) time out that cycle only and are read fresh the next,
    and the stuck GPU fails fast while it backs off, on its own key."""
    fake = fake_nvml.hang(stuck=5)
    source = open_source(opened, fake)

    start = time.monotonic()
    samples = source.sample(1.0)
    elapsed = time.monotonic() - start
    assert elapsed < DEADLINE_S + SLACK_S
    assert fake.hang_entered.is_set()
    assert samples[5].error is not None and samples[5].error.startswith("timeout")
    assert samples[5].power_w is None and samples[5].name == "NVIDIA B300 SXM6 AC"
    assert all(s.ok and s.power_w == pytest.approx(850.0 + s.gpu) for s in samples[:5])
    assert all(s.error is not None and s.error.startswith("timeout") for s in samples[6:])
    health = source.health()
    assert health[5].wedged and health[5].abandoned_alive == 1
    assert not any(h.wedged or h.abandoned_alive for h in health[:5] + health[6:])

    for t in range(2, 5):  # later samples: the wedged GPU fails fast during its backoff
        start = time.monotonic()
        samples = source.sample(float(t))
        assert time.monotonic() - start < 0.1
        assert samples[5].error is not None and samples[5].error.startswith("wedged")
        assert all(s.ok for s in samples if s.gpu != 5)
    assert source.per_gpu(lambda handle, index: index)[5][2] is not None  # health reads back off too


def test_healthy_gpus_are_read_in_sequence_on_one_worker(opened, monkeypatch) -> None:
    """One thread hand-off per sample for 16 GPUs, not 16 (issue 30: the hand-offs cost ~6x the reads)."""
    fake = fake_nvml.basic(16)
    source = open_source(opened, fake)
    readers: list[set[str]] = []
    power = fake.nvmlDeviceGetPowerUsage

    def recording(handle):
        readers[-1].add(threading.current_thread().name)
        return power(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetPowerUsage", recording)
    for t in range(5):
        readers.append(set())
        handoffs = source._ex.handoffs
        assert all(s.ok for s in source.sample(float(t)))
        assert source._ex.handoffs - handoffs == 1  # jobs handed to worker threads
    assert [len(r) for r in readers] == [1] * 5
    assert threading.current_thread().name not in readers[0]


def test_a_gpu_wedging_in_the_batch_keeps_the_thread_count_bounded(opened) -> None:
    """Backoff over at once, so the stuck GPU is retried on a fresh worker each sample: the cap on its
    abandoned threads holds, and the other 15 GPUs are read on time every sample after the first."""
    fake = fake_nvml.hang(gpus=16, stuck=7)
    source = open_source(opened, fake, backoff_s=0.0)
    threads_before = threading.active_count()
    for t in range(30):
        samples = source.sample(float(t))
        if t:
            assert all(s.ok for s in samples if s.gpu != 7)
        assert samples[7].error is not None
    assert source.health()[7].abandoned_alive == 2  # the batch thread stuck in it, then one of its own
    assert threading.active_count() - threads_before <= 2 + 1


def test_hung_gpu_recovers_after_release_and_backoff(opened) -> None:
    fake = fake_nvml.hang(gpus=2, stuck=1, api="nvmlDeviceGetUtilizationRates")
    source = open_source(opened, fake, backoff_s=0.05)
    assert source.sample(0.0)[1].error.startswith("timeout")
    fake.release()
    time.sleep(0.06)
    samples = source.sample(1.0)
    assert all(s.ok for s in samples)


def test_init_failure_raises_telemetry_unavailable(opened) -> None:
    with pytest.raises(TelemetryUnavailable, match="DriverNotLoaded"):
        NvmlSource(deadline_s=DEADLINE_S, nvml=fake_nvml.init_failure())
    with pytest.raises(TelemetryUnavailable, match="LibraryNotFound"):
        NvmlSource(deadline_s=DEADLINE_S, nvml=fake_nvml.init_failure(fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND))


def test_init_that_hangs_raises_telemetry_unavailable_within_the_deadline() -> None:
    import threading

    fake = fake_nvml.FakeNvml([], init_hang=threading.Event())
    try:
        start = time.monotonic()
        with pytest.raises(TelemetryUnavailable, match="timed out"):
            NvmlSource(deadline_s=DEADLINE_S, nvml=fake)
        assert time.monotonic() - start < DEADLINE_S + SLACK_S
    finally:
        fake.release()


def test_nvml_available_probe() -> None:
    fake = fake_nvml.basic(1)
    assert nvml_available(nvml=fake)
    assert not fake.initialized  # the probe shut the library down again
    assert not nvml_available(nvml=fake_nvml.init_failure())


def test_real_binding_without_a_driver_is_unavailable_not_a_crash() -> None:
    """On this machine (no NVIDIA driver) the real nvidia-ml-py fails at init: TelemetryUnavailable.
    Where a driver answers, the real source must read at least one GPU."""
    try:
        source = NvmlSource(deadline_s=2.0)
    except TelemetryUnavailable as exc:
        assert "NVML" in str(exc) or "nvidia-ml-py" in str(exc)
        assert nvml_available(deadline_s=2.0) is False
        return
    try:
        samples = source.sample(time.time())
        assert all(isinstance(s, GpuSample) for s in samples)
    finally:
        source.close()


def test_close_shuts_nvml_down_and_is_idempotent() -> None:
    fake = fake_nvml.basic(2)
    source = NvmlSource(deadline_s=DEADLINE_S, nvml=fake)
    source.close()
    source.close()
    assert not fake.initialized
    assert fake.calls_to("nvmlShutdown") == 1
    with pytest.raises(RuntimeError, match="closed"):
        source.sample(0.0)


def test_compute_processes_are_listed_once_per_process_period_not_per_sample(opened) -> None:
    """The daemon reads the pids each process period (1 s) while it samples at 10 Hz: the process list
    (a walk of the driver's process table) is asked once per interval, its pids repeated between."""
    fake = fake_nvml.basic(2)
    fake.boards[0].pids, fake.boards[1].pids = (), (4242,)
    source = open_source(opened, fake, pids_interval_s=60.0)
    for t in range(10):
        samples = source.sample(float(t))
        assert [s.pids for s in samples] == [(), (4242,)]
    assert fake.calls_to("nvmlDeviceGetComputeRunningProcesses", 1) == 1
    assert fake.calls_to("nvmlDeviceGetPowerUsage", 1) == 10  # every sample reads the power
    fresh = open_source(opened, fake_nvml.basic(1), pids_interval_s=0.0)
    for t in range(3):
        fresh.sample(float(t))
    assert fresh.binding.calls_to("nvmlDeviceGetComputeRunningProcesses", 0) == 3


def test_pcie_is_read_at_most_once_per_interval(opened) -> None:
    fake = fake_nvml.basic(1)
    source = open_source(opened, fake, pcie_interval_s=60.0)
    for t in range(4):
        (s,) = source.sample(float(t))
        assert s.pcie_tx_bytes_per_s == 2_000 * 1024
    assert fake.calls_to("nvmlDeviceGetPcieThroughput", 0) == 2  # tx + rx, once


def test_a_10_hz_sample_makes_four_calls_per_gpu_the_slow_reads_once_per_interval(opened) -> None:
    """Power, utilisation, energy and the field values (what the classifier judges) are read every
    sample; memory, SM clock, temperature and the power limit once per ``slow_interval_s``, their last
    values repeated between - each sample still has every field filled."""
    fake = fake_nvml.basic(2)
    source = open_source(opened, fake, slow_interval_s=60.0, pcie_interval_s=60.0, pids_interval_s=60.0)
    before = fake.calls.copy()
    samples = [source.sample(0.1 * t) for t in range(10)]  # one second at 10 Hz
    per_gpu = {api: n for (api, gpu), n in (fake.calls - before).items() if gpu == 1}
    assert per_gpu == {
        "nvmlDeviceGetPowerUsage": 10,
        "nvmlDeviceGetTotalEnergyConsumption": 10,
        "nvmlDeviceGetUtilizationRates": 10,
        "nvmlDeviceGetFieldValues": 10,
        "nvmlDeviceGetMemoryInfo": 1,
        "nvmlDeviceGetClockInfo": 1,
        "nvmlDeviceGetTemperature": 1,
        "nvmlDeviceGetEnforcedPowerLimit": 1,
        "nvmlDeviceGetPcieThroughput": 2,  # tx and rx
        "nvmlDeviceGetComputeRunningProcesses": 1,
    }
    assert sum(per_gpu.values()) == 47  # calls in a second per GPU at 10 Hz (83 before)
    for s in samples[-1]:
        assert s.ok and s.errors == ()
        assert s.memory_used_bytes == samples[0][s.gpu].memory_used_bytes is not None
        assert (s.sm_clock_mhz, s.temperature_c, s.power_limit_w) == (
            samples[0][s.gpu].sm_clock_mhz,
            samples[0][s.gpu].temperature_c,
            samples[0][s.gpu].power_limit_w,
        )
        assert None not in (s.sm_clock_mhz, s.temperature_c, s.power_limit_w, s.memory_total_bytes)
    # a slow read that fails is asked again at the next sample, not an interval later
    flaky = fake_nvml.basic(1)
    flaky.boards[0].errors["nvmlDeviceGetTemperature"] = fake_nvml.NVML_ERROR_UNKNOWN
    retried = open_source(opened, flaky, slow_interval_s=60.0)
    (s,) = retried.sample(2.0)
    assert s.temperature_c is None and s.errors == ("temperature: Unknown",)
    del flaky.boards[0].errors["nvmlDeviceGetTemperature"]
    (s,) = retried.sample(2.1)
    assert s.temperature_c == 60 and s.errors == ()
    (s,) = retried.sample(2.2)
    assert s.temperature_c == 60 and flaky.calls_to("nvmlDeviceGetTemperature", 0) == 2
