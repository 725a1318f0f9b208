"""The health signal (issue 27 part A): the Xid catalog, the kernel-log parser and readers, the
verdict from findings, and NVML health reads and events through the fake NVML (the only fake)."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from gpu_triage.model.health import (
    Blame,
    FaultKind,
    FaultSource,
    GpuHealthReading,
    HardwareEvent,
    HealthLevel,
    OperatorAction,
    canonical_bus_id,
    node_health_dict,
    pci_key,
)
from gpu_triage.signals.health import catalog
from gpu_triage.signals.health.book import BookSettings, HealthBook
from gpu_triage.signals.health.kernel_log import (
    MAX_LINE_CHARS,
    MAX_TEXT_CHARS,
    FileReader,
    KmsgReader,
    parse_line,
)
from gpu_triage.signals.health.monitor import HealthConfig, HealthMonitor
from gpu_triage.telemetry.nvml import NvmlSource
from gpu_triage.telemetry.nvml_health import NvmlHealthReader
from tests.watchdog import fake_nvml

GPUS = [
    (g, f"00000000:{bus:02X}:00.0") for g, bus in enumerate((0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF))
]

# -- the catalog ------------------------------------------------------------------------------------


def test_the_catalog_lists_every_code_of_nvidias_catalog_each_with_its_source() -> None:
    entries = catalog.load_catalog()
    assert sorted(entries) == list(range(1, 173))
    for entry in entries.values():
        assert entry.source.startswith("https://docs.nvidia.com/"), entry
        assert entry.meaning and entry.mnemonic
    assert entries[79].action is OperatorAction.DRAIN_NODE and entries[79].blame is Blame.NODE
    assert entries[79].nvidia_action == "RESTART_BM"
    assert entries[13].blame is Blame.JOB and entries[13].level is HealthLevel.HEALTHY
    assert entries[74].blame is Blame.NETWORK
    assert entries[48].level is HealthLevel.UNHEALTHY and entries[95].action is OperatorAction.RESET_GPU
    assert entries[94].level is HealthLevel.DEGRADED and entries[94].action is OperatorAction.RESTART_JOB


@pytest.mark.parametrize("code", sorted(catalog.load_catalog()))
def test_each_catalog_entry_yields_its_blame_and_action_from_the_kernel_log_and_nvml_events(
    code: int, tmp_path: Path
) -> None:
    """One Xid through both sources - a kernel line in NVIDIA's format in a log file, and an NVML
    Xid event from the fake driver - gives a finding with the entry's level, blame and action."""
    entry = catalog.lookup(code)
    log = tmp_path / "kern.log"
    log.write_text(f"kernel: NVRM: Xid (PCI:0000:61:00): {code}, pid=1234, name=python, something happened\n")
    monitor = HealthMonitor(HealthConfig(kernel_log="off", kernel_log_file=log), GPUS)
    monitor.open()
    health = monitor.sample(10.0)
    (finding,) = health.gpu(3).findings
    assert (finding.xid, finding.level, finding.blame, finding.action) == (
        code,
        entry.level,
        catalog.BLAME_WORDS[entry.blame_word],
        entry.action,
    )
    assert finding.source is FaultSource.KERNEL_LOG and finding.detail.startswith(f"Xid {code}: ")
    # the same code as an NVML event on the fake driver
    fake = fake_nvml.basic(4)
    source = NvmlSource(deadline_s=2.0, nvml=fake)
    try:
        reader = NvmlHealthReader(source, wait_ms=50)
        nvml_monitor = HealthMonitor(
            HealthConfig(kernel_log="off"), [(g.gpu, g.pci_bus_id) for g in source.gpus()], reader=reader
        )
        assert fake.inject_xid(2, code) == 1
        deadline = time.monotonic() + 5
        health = nvml_monitor.sample(10.0)
        while not health.gpu(2).findings and time.monotonic() < deadline:
            time.sleep(0.02)
            health = nvml_monitor.sample(10.0)
        xids = [f for f in health.gpu(2).findings if f.kind is FaultKind.XID]
        assert [(f.xid, f.blame, f.action, f.source) for f in xids] == [
            (code, catalog.BLAME_WORDS[entry.blame_word], entry.action, FaultSource.NVML_EVENT)
        ]
        nvml_monitor.close()
    finally:
        source.close()


def test_an_unknown_code_is_reported_as_unknown_never_dropped() -> None:
    book = HealthBook(GPUS)
    book.add_event(HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, 1.0, pci_bus_id=GPUS[5][1], xid=4242))
    health = book.node_health(1.0)
    (finding,) = health.gpu(5).findings
    assert finding.detail == "Xid 4242 (not in the catalog)"
    assert finding.blame is Blame.UNKNOWN and finding.action is OperatorAction.UNKNOWN
    assert health.gpu(5).level is HealthLevel.DEGRADED and health.level is HealthLevel.DEGRADED
    assert [(x.gpu, x.xid, x.count) for x in health.xid_totals] == [(5, 4242, 1)]


def test_xid_154_takes_the_recovery_action_its_line_names() -> None:
    text = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert catalog.judge(154, text).action is OperatorAction.DRAIN_NODE
    assert (
        catalog.judge(154, "changed from 0x2 (Node Reboot Required) to 0x0 (None)").level
        is HealthLevel.HEALTHY
    )
    assert catalog.judge(154).action is OperatorAction.UNKNOWN


def test_a_malformed_catalog_names_the_entry_and_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text(
        '[sources]\nc = "https://x"\n[[xid]]\ncode = 79\nmnemonic = "M"\nmeaning = "m"\nnvidia_action = ""\n'
        'nvidia_investigation = ""\nblame = "gremlins"\nlevel = "healthy"\naction = "none"\nsource = "c"\n'
    )
    with pytest.raises(catalog.CatalogError, match=r"c\.toml: xid 79: blame: expected one of"):
        catalog.load_catalog(bad)


# -- PCI bus ids --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("00000000:1B:00.0", (0, 0x1B, 0)),
        ("0000:1b:00.0", (0, 0x1B, 0)),
        ("PCI:0000:1b:00", (0, 0x1B, 0)),
        ("0000:1b:00", (0, 0x1B, 0)),
        ("1b:00", (0, 0x1B, 0)),
        ("00000001:DB:1F.3", (1, 0xDB, 0x1F)),
        ("zz:00:00", None),
        ("0000:1b", None),
        ("", None),
        ("0000:1b:00:00:00", None),
        ("123456789:00:00", None),
    ],
)
def test_pci_key_reads_every_spelling_of_a_bus_id(text: str, key: tuple[int, int, int] | None) -> None:
    assert pci_key(text) == key


def test_canonical_bus_id_is_nvmls_spelling() -> None:
    assert canonical_bus_id("PCI:0000:1b:00") == "00000000:1B:00.0"
    assert canonical_bus_id("0000:db:00.1") == "00000000:DB:00.1"


# -- the kernel log: every documented line format ------------------------------------------------------

DOCUMENTED = [
    # NVIDIA's Xid documentation and GPU debug guidelines, and the surroundings each log source adds
    (
        "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        79,
        0x1B,
    ),
    (
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu.",
        63,
        0x10,
    ),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, 0x03),
    ("NVRM: Xid (PCI:0000:06:00): 41, ROBUST_CHANNEL_CE2_ERROR: Copy Engine Exception", 41, 0x06),
    ("NVRM: Xid (PCI:0000:b3:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception", 13, 0xB3),
    ("NVRM: Xid (PCI:0000:3b:00): 48, pid=2210, name=python3, An uncorrectable double bit error", 48, 0x3B),
    (
        "NVRM: Xid (PCI:0000:3b:00): 94, pid=2210, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
        94,
        0x3B,
    ),
    (
        "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to "
        "0x1 (GPU Reset Required)",
        154,
        0x3B,
    ),
    ("NVRM: Xid (PCI:0000:3b:00): 31, Ch 0000000b, engmask 00000120, intr 10000000", 31, 0x3B),
    ("NVRM: Xid (PCI:0000:3b:00.0): 74, NVLink: fatal error detected on link 3", 74, 0x3B),
    (
        "NVRM: Xid (PCI:0001:3b:00): 119, pid=91, Timeout after 6s of waiting for RPC response "
        "from GPU0 GSP!",
        119,
        0x3B,
    ),
]
WRAPPERS = [
    "{}",
    "3,1234,567890123,-;{}",  # a /dev/kmsg record
    "Nov 22 18:29:55 hostname kernel: [ 966.503025] {}",  # syslog
    "Oct 01 13:00:00 hostname kernel: {}",  # journalctl -k
    "[ 4909.922970] {}",  # dmesg
    "2025-03-01T10:00:00.123456+00:00 node1 kernel: {}",  # rsyslog ISO timestamps
]


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize(("line", "code", "bus"), DOCUMENTED)
def test_every_documented_xid_line_in_every_log_wrapper_is_read(
    wrapper: str, line: str, code: int, bus: int
) -> None:
    parsed = parse_line(wrapper.format(line))
    assert parsed is not None and parsed.kind is FaultKind.XID and parsed.xid == code
    key = pci_key(parsed.pci_bus_id)
    assert key is not None and key[1] == bus
    assert parsed.text and len(parsed.text) <= MAX_TEXT_CHARS + len("...(+99999 chars)")


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.",
        "3,99,1,-;NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) has fallen off the bus "
        "and is not responding",
    ],
)
def test_fallen_off_the_bus_lines_name_their_gpu(line: str) -> None:
    parsed = parse_line(line)
    assert parsed is not None and parsed.kind is FaultKind.FALLEN_OFF_BUS
    assert parsed.pci_bus_id == "00000000:3B:00.0"


HOSTILE = [
    "",
    "NVRM: Xid",
    "NVRM: Xid (PCI:0000:1b:00): ",
    "NVRM: Xid (PCI:0000:1b:00): 0, zero is no code",
    "NVRM: Xid (PCI:0000:1b:00): 99999999999999999999, too long",
    "NVRM: Xid (PCI:zzzz:1b:00): 79, bad hex",
    "NVRM: Xid (PCI:0000:1b:00 79",
    "NVRM: Xid (" + "0" * 100_000 + ":1b:00): 79",
    "NVRM: Xid (PCI:0000:1b:00): 79, " + "\x00\x1b[31m\u202e" * 10_000,
    "\udcff\udcfeNVRM: Xid (PCI:0000:1b:00): 79, surrogates",
    "NVRM: " + "(" * 50_000,
    "just a line that mentions nothing",
]


@pytest.mark.parametrize("line", HOSTILE)
def test_hostile_lines_never_raise_and_stay_bounded(line: str) -> None:
    start = time.perf_counter()
    parsed = parse_line(line)
    assert time.perf_counter() - start < 0.5
    if parsed is not None:
        assert parsed.kind in (FaultKind.XID, FaultKind.FALLEN_OFF_BUS)
        assert len(parsed.text) <= MAX_TEXT_CHARS + len("...(+99999 chars)") and parsed.text.isprintable()
        assert parsed.xid is None or 0 < parsed.xid < 1_000_000


def test_bytes_that_are_not_utf8_are_read() -> None:
    parsed = parse_line(b"NVRM: Xid (PCI:0000:1b:00): 79, name=\xff\xfe, GPU has fallen off the bus.")
    assert parsed is not None and parsed.xid == 79 and "\ufffd" in parsed.text


def test_a_line_longer_than_the_limit_is_cut_before_parsing() -> None:
    late = "x" * (MAX_LINE_CHARS + 10) + "NVRM: Xid (PCI:0000:1b:00): 79, late"
    assert parse_line(late) is None  # past the limit: not read, not a crash


# -- the readers ----------------------------------------------------------------------------------------


def test_file_reader_follows_a_growing_file_keeps_a_partial_line_and_rereads_a_truncated_one(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"first\nsecond half")
    reader = FileReader(log)
    assert reader.poll() == ["first"]
    with open(log, "ab") as f:
        f.write(b"-done\nthird\n")
    assert reader.poll() == ["second half-done", "third"]
    assert reader.poll() == []
    log.write_bytes(b"new\n")  # truncated (log rotation by copytruncate)
    assert reader.poll() == ["new"]
    log.unlink()
    assert reader.poll() == [] and reader.last_error is not None and "kern.log" in reader.last_error


def test_file_reader_cuts_a_line_that_never_ends(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"y" * (MAX_LINE_CHARS * 5))
    lines = FileReader(log).poll()
    assert len(lines) == 1 and len(lines[0]) <= MAX_LINE_CHARS * 4


def test_kmsg_reader_is_non_blocking_skips_old_records_and_counts_overruns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: os.dup(read_fd))
    monkeypatch.setattr(os, "lseek", lambda *a, **k: 0)
    reader = KmsgReader("/dev/kmsg")
    monkeypatch.setattr(os, "open", real_open)
    start = time.perf_counter()
    assert reader.poll() == []  # nothing written: EAGAIN, returned at once
    assert time.perf_counter() - start < 0.5
    records = [b"3,1,1,-;NVRM: Xid (PCI:0000:1b:00): 79, off the bus\n", b"6,2,2,-;usb 1-1: new device\n"]
    calls = iter([records[0], BrokenPipeError(errno.EPIPE, "overwritten"), records[1]])

    def fake_read(fd: int, n: int) -> bytes:
        item = next(calls, None)
        if item is None:
            raise BlockingIOError(errno.EAGAIN, "empty")
        if isinstance(item, BaseException):
            raise item
        return item

    monkeypatch.setattr(os, "read", fake_read)
    assert reader.poll() == [r.decode().rstrip("\n") for r in records]
    assert reader.overruns == 1
    reader.close()
    os.close(read_fd)
    os.close(write_fd)


def test_the_real_dev_kmsg_reader_opens_at_the_end_when_it_can() -> None:
    try:
        reader = KmsgReader()
    except OSError as e:
        pytest.skip(f"/dev/kmsg unreadable here: {e}")
    try:
        start = time.perf_counter()
        reader.poll()
        assert time.perf_counter() - start < 1.0  # never blocks, and old boot records are skipped
    finally:
        reader.close()


def test_without_any_kernel_log_the_monitor_says_why_and_goes_on() -> None:
    monitor = HealthMonitor(
        HealthConfig(), GPUS, open_log=lambda choice: (None, "/dev/kmsg: denied; journalctl: not found")
    )
    monitor.open()
    health = monitor.sample(1.0)
    assert health.level is HealthLevel.HEALTHY
    assert any("journalctl: not found" in e for e in health.read_errors)
    assert monitor.status()["kernel_log_problem"] == "/dev/kmsg: denied; journalctl: not found"


# -- the book: findings to the verdict -------------------------------------------------------------------


def reading(gpu: int, **values: object) -> GpuHealthReading:
    return GpuHealthReading(gpu=gpu, pci_bus_id=GPUS[gpu][1], **values)  # type: ignore[arg-type]


def test_an_xid_on_an_unknown_bus_is_a_node_wide_finding() -> None:
    book = HealthBook(GPUS)
    book.add_event(
        HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, 1.0, pci_bus_id="00000000:04:00.0", xid=79)
    )
    health = book.node_health(1.0)
    assert all(not g.findings for g in health.gpus)
    (finding,) = health.findings
    assert (
        finding.gpu is None
        and finding.pci_bus_id == "00000000:04:00.0"
        and health.level is HealthLevel.UNHEALTHY
    )
    assert [(x.gpu, x.pci_bus_id, x.xid) for x in health.xid_totals] == [(None, "00000000:04:00.0", 79)]


def test_repeated_xids_count_up_and_expire_after_the_hold() -> None:
    book = HealthBook(GPUS, BookSettings(event_hold_s=60.0))
    for t in (1.0, 2.0, 3.0):
        book.add_event(HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, t, gpu=1, xid=79))
    (finding,) = book.node_health(3.0).gpu(1).findings
    assert (finding.count, finding.first_seen, finding.last_seen) == (3, 1.0, 3.0)
    assert book.node_health(62.0).gpu(1).level is HealthLevel.UNHEALTHY
    later = book.node_health(63.5)
    assert later.gpu(1).level is HealthLevel.HEALTHY and later.level is HealthLevel.HEALTHY
    assert later.xid_totals[0].count == 3  # the counter never expires


def test_the_verdict_is_made_again_only_when_what_it_reads_changed_or_a_hold_ends() -> None:
    # the daemon asks 10 times a second; between changes it gets the same verdict, not a rebuilt one
    book = HealthBook(GPUS, BookSettings(event_hold_s=60.0))
    book.add_event(HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, 1.0, gpu=1, xid=79))
    first = book.node_health(2.0)
    assert book.node_health(30.0) is first and book.node_health(61.0) is first
    assert book.node_health(61.5) is not first  # the finding's hold ended: it is gone
    assert book.node_health(61.5).gpu(1).level is HealthLevel.HEALTHY
    book.add_event(HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, 70.0, gpu=2, xid=79))
    assert book.node_health(70.0).gpu(2).level is HealthLevel.UNHEALTHY
    assert book.node_health(71.0, ("kernel log: gone",)).read_errors == ("kernel log: gone",)
    assert book.node_health(71.0).read_errors == ()
    book.add_readings([reading(0, ecc_volatile_corrected=0, ecc_volatile_uncorrected=0)], 72.0)
    assert book.node_health(72.0).gpu(2).level is HealthLevel.UNHEALTHY
    book.settings = BookSettings(event_hold_s=5.0)  # a reload shortens the hold: it applies at once
    assert book.node_health(76.0).gpu(2).level is HealthLevel.HEALTHY


def test_a_healthy_gpu_through_ecc_bursts_throttle_and_pcie_drop_is_degraded_at_most() -> None:
    book = HealthBook(GPUS, BookSettings(ecc_correctable_burst=100))
    book.add_readings([reading(0, ecc_volatile_corrected=10, ecc_volatile_uncorrected=0)], 1.0)
    book.add_readings(
        [
            reading(
                0,
                ecc_volatile_corrected=510,
                ecc_volatile_uncorrected=0,
                throttle_reasons=0x40,
                pcie_width=8,
                pcie_width_max=16,
                pcie_gen=4,
                pcie_gen_max=5,
            )
        ],
        2.0,
    )
    health = book.node_health(2.0)
    g0 = health.gpu(0)
    assert g0.level is HealthLevel.DEGRADED and health.level is HealthLevel.DEGRADED
    assert {f.kind for f in g0.findings} == {
        FaultKind.ECC_CORRECTABLE,
        FaultKind.THROTTLE_THERMAL,
        FaultKind.PCIE_DEGRADED,
    }
    assert not health.faults_on([0])
    assert "500 correctable ECC errors in one poll" in g0.reasons
    assert "PCIe x8 of x16, gen 4 of 5" in g0.reasons


def test_pcie_generation_below_max_alone_is_not_judged() -> None:
    book = HealthBook(GPUS)
    book.add_readings([reading(0, pcie_gen=1, pcie_gen_max=5, pcie_width=16, pcie_width_max=16)], 1.0)
    assert book.node_health(1.0).level is HealthLevel.HEALTHY


def test_counters_that_fall_are_a_driver_reload_not_a_fault() -> None:
    book = HealthBook(GPUS)
    book.add_readings([reading(0, ecc_volatile_uncorrected=5)], 1.0)
    book.add_readings([reading(0, ecc_volatile_uncorrected=0)], 2.0)
    assert book.node_health(2.0).level is HealthLevel.HEALTHY
    book.add_readings([reading(0, ecc_volatile_uncorrected=1)], 3.0)
    health = book.node_health(3.0)
    assert (
        health.level is HealthLevel.UNHEALTHY
        and health.gpu(0).findings[0].action is OperatorAction.DRAIN_NODE
    )


def test_the_verdict_as_json_names_level_reasons_and_findings() -> None:
    book = HealthBook(GPUS)
    book.add_event(HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, 1.0, gpu=3, xid=79))
    doc = node_health_dict(book.node_health(1.0))
    assert doc["level"] == "unhealthy"
    g3 = doc["gpus"][3]  # type: ignore[index]
    assert g3["reasons"] == ["Xid 79: GPU has fallen off the bus"] and g3["pci_bus_id"] == GPUS[3][1]
    assert g3["findings"][0]["blame"] == "node" and g3["findings"][0]["action"] == "drain_node"


def test_held_findings_stay_bounded_under_a_flood_of_distinct_codes() -> None:
    from gpu_triage.signals.health import book as book_module

    book = HealthBook(GPUS)
    for code in range(book_module.MAX_HELD + 50):
        book.add_event(HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, 1.0, gpu=0, xid=code + 1))
    health = book.node_health(1.0)
    assert len(health.gpu(0).findings) == book_module.MAX_HELD and book.dropped == 50


# -- NVML health reads through the fake NVML ----------------------------------------------------------


@pytest.fixture
def nvml_open():
    opened: list[tuple[NvmlSource, fake_nvml.FakeNvml]] = []

    def open_(fake: fake_nvml.FakeNvml, **kw: object) -> tuple[NvmlSource, NvmlHealthReader, HealthMonitor]:
        source = NvmlSource(deadline_s=0.5, nvml=fake, backoff_s=30.0)
        opened.append((source, fake))
        reader = NvmlHealthReader(source, wait_ms=50)
        monitor = HealthMonitor(
            HealthConfig(kernel_log="off", poll_interval_s=1.0, **kw),  # type: ignore[arg-type]
            [(g.gpu, g.pci_bus_id) for g in source.gpus()],
            reader=reader,
        )
        monitor.open()
        return source, reader, monitor

    yield open_
    for source, fake in opened:
        fake.release()
        source.close()


def test_nvml_reads_bus_ids_and_a_healthy_board_is_healthy(nvml_open) -> None:
    source, _reader, monitor = nvml_open(fake_nvml.basic(8))
    assert [g.pci_bus_id for g in source.gpus()][:2] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert source.sample(1.0)[1].pci_bus_id == "00000000:2A:00.0"
    health = monitor.sample(1.0)
    assert health.level is HealthLevel.HEALTHY and not health.read_errors, health
    assert [g.pci_bus_id for g in health.gpus] == [g.pci_bus_id for g in source.gpus()]
    monitor.close()


@pytest.mark.parametrize(
    ("fake", "gpu", "kind", "level"),
    [
        (
            lambda: fake_nvml.row_remap(gpu=4, pending=True),
            4,
            FaultKind.ROW_REMAP_PENDING,
            HealthLevel.DEGRADED,
        ),
        (
            lambda: fake_nvml.row_remap(gpu=4, pending=False, failure=True),
            4,
            FaultKind.ROW_REMAP_FAILURE,
            HealthLevel.UNHEALTHY,
        ),
        (
            lambda: fake_nvml.retired_pages_pending(gpu=1),
            1,
            FaultKind.RETIRED_PAGES_PENDING,
            HealthLevel.DEGRADED,
        ),
        (
            lambda: fake_nvml.throttle(gpu=0, reasons=0x8),
            0,
            FaultKind.THROTTLE_HW_SLOWDOWN,
            HealthLevel.DEGRADED,
        ),
        (
            lambda: fake_nvml.throttle(gpu=0, reasons=0x40),
            0,
            FaultKind.THROTTLE_THERMAL,
            HealthLevel.DEGRADED,
        ),
        (
            lambda: fake_nvml.throttle(gpu=0, reasons=0x80),
            0,
            FaultKind.THROTTLE_POWER_BRAKE,
            HealthLevel.DEGRADED,
        ),
        (lambda: fake_nvml.pcie_degraded(gpu=7, width=8), 7, FaultKind.PCIE_DEGRADED, HealthLevel.DEGRADED),
        (lambda: fake_nvml.fabric(gpu=5, state=2), 5, FaultKind.FABRIC, HealthLevel.DEGRADED),
        (lambda: fake_nvml.fabric(gpu=5, state=3, status=999), 5, FaultKind.FABRIC, HealthLevel.UNHEALTHY),
        (lambda: fake_nvml.gpu_lost(lost=3), 3, FaultKind.GPU_LOST, HealthLevel.UNHEALTHY),
    ],
)
def test_each_nvml_health_state_yields_its_finding_on_its_gpu_only(nvml_open, fake, gpu, kind, level) -> None:
    _source, _reader, monitor = nvml_open(fake())
    health = monitor.sample(1.0)
    g = health.gpu(gpu)
    assert [f.kind for f in g.findings] == [kind] and g.level is level, g
    assert all(not other.findings for other in health.gpus if other.gpu != gpu), health
    assert g.findings[0].source is FaultSource.NVML_POLL and g.findings[0].pci_bus_id == g.pci_bus_id
    monitor.close()


def test_ecc_and_nvlink_counters_count_from_the_first_poll(nvml_open) -> None:
    fake = fake_nvml.ecc(gpu=2, corrected=1_000, uncorrected=3)  # old counts: not news
    _source, _reader, monitor = nvml_open(fake, ecc_correctable_burst=50, nvlink_error_burst=10)
    assert monitor.sample(1.0).level is HealthLevel.HEALTHY
    fake.boards[2].ecc_corrected += 60
    fake.boards[6].nvlink_errors = {fake_nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 1}  # +1 on each of 18 links
    health = monitor.sample(2.0)
    assert [f.kind for f in health.gpu(2).findings] == [FaultKind.ECC_CORRECTABLE]
    (link,) = health.gpu(6).findings
    assert link.kind is FaultKind.NVLINK_ERRORS and link.blame is Blame.NETWORK and "+18" in link.detail
    fake.boards[2].ecc_uncorrected += 1
    health = monitor.sample(3.0)
    assert health.gpu(2).level is HealthLevel.UNHEALTHY and health.level is HealthLevel.UNHEALTHY
    monitor.close()


def test_a_link_that_goes_down_is_a_fabric_fault_a_link_never_up_is_not(nvml_open) -> None:
    fake = fake_nvml.nvlink(gpu=6, down={17})  # link 17 was never up: this board uses 17 links
    _source, _reader, monitor = nvml_open(fake)
    assert monitor.sample(1.0).level is HealthLevel.HEALTHY
    fake.boards[6].nvlink_down = {3, 17}
    (finding,) = monitor.sample(3.0).gpu(6).findings
    assert finding.kind is FaultKind.NVLINK_DOWN and finding.detail == "NVLink down: link 3"
    assert finding.blame is Blame.NETWORK and finding.level is HealthLevel.UNHEALTHY
    monitor.close()


def test_not_supported_reads_are_not_asked_again(nvml_open) -> None:
    fake = fake_nvml.no_nvlink(2)
    for board in fake.boards:
        board.not_supported.add("nvmlDeviceGetRemappedRows")
    _source, reader, monitor = nvml_open(fake)
    monitor.sample(1.0)
    monitor.sample(2.0)
    monitor.sample(3.0)
    assert fake.calls_to("nvmlDeviceGetRemappedRows", 0) == 1
    assert fake.calls_to("nvmlDeviceGetNvLinkState", 0) == 1
    assert monitor.latest.level is HealthLevel.HEALTHY and not monitor.latest.read_errors
    assert "remap" in reader.status()["unsupported"]["0"]  # type: ignore[index]
    monitor.close()


def test_a_hung_health_read_costs_one_deadline_and_the_others_are_read(nvml_open) -> None:
    fake = fake_nvml.hang(gpus=4, stuck=1, api="nvmlDeviceGetRemappedRows")
    fake.boards[2].remap_pending = True
    _source, _reader, monitor = nvml_open(fake)
    start = time.monotonic()
    health = monitor.sample(1.0)
    assert time.monotonic() - start < 0.5 + 1.0
    assert any(e.startswith("gpu 1: health: timeout") for e in health.read_errors), health.read_errors
    assert [f.kind for f in health.gpu(2).findings] == [FaultKind.ROW_REMAP_PENDING]
    start = time.monotonic()
    health = monitor.sample(3.0)  # the wedged GPU now fails fast
    assert time.monotonic() - start < 0.3
    assert any("wedged" in e for e in health.read_errors)


def test_nvml_events_never_block_the_cycle_and_ecc_and_lost_events_count(nvml_open) -> None:
    fake = fake_nvml.basic(4)
    _source, reader, monitor = nvml_open(fake)
    start = time.monotonic()
    monitor.sample(1.0)
    assert time.monotonic() - start < 0.3  # the event wait runs on its own thread
    fake.inject_event(1, fake_nvml.nvmlEventTypeDoubleBitEccError)
    fake.inject_event(2, fake_nvml.nvmlEventTypeGpuUnavailableError)
    deadline = time.monotonic() + 5
    while reader.events_total < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    health = monitor.sample(1.5)
    assert [f.kind for f in health.gpu(1).findings] == [FaultKind.ECC_UNCORRECTABLE]
    assert health.gpu(1).findings[0].last_seen == 1.5  # on the daemon's timeline, not the reader's clock
    assert [f.kind for f in health.gpu(2).findings] == [FaultKind.GPU_LOST]
    assert reader.status()["events"] is True
    monitor.close()
    assert reader.status()["events"] is False and fake.event_sets[0].freed


def test_the_docs_xid_table_is_the_catalog() -> None:
    """docs/health.md's table is generated from the catalog: a changed entry must change the docs."""
    from tests.conftest import REPO

    text = (REPO / "docs" / "health.md").read_text()
    table = text.split("<!-- xid-table: generated from xid_catalog.toml -->\n", 1)[1].split(
        "\n<!-- /xid-table -->"
    )[0]
    rows = table.splitlines()[2:]
    expected = []
    for c, e in sorted(catalog.load_catalog().items()):
        nv = " / ".join(x for x in (e.nvidia_action, e.nvidia_investigation) if x) or "-"
        expected.append(f"| {c} | {e.meaning} | {e.level} | {e.blame_word} | {e.action} | {nv} |")
    assert rows == expected


def test_the_status_command_shows_bus_ids_health_and_each_reason() -> None:
    from gpu_triage.cli.status import render
    from gpu_triage.model.health import node_health_dict

    book = HealthBook(GPUS[:2])
    book.add_event(HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, 1.0, gpu=1, xid=79))
    gpus = [
        {
            "gpu": g,
            "pci_bus_id": bus,
            "model": "B300",
            "state": "compute",
            "power_w": 900.0,
            "power_limit_w": 1100.0,
        }
        for g, bus in GPUS[:2]
    ]
    status = {
        "node": "node-a",
        "time": 1_700_000_000.0,
        "gpus": gpus,
        "jobs": [],
        "node_health": node_health_dict(book.node_health(1.0)),
    }
    text = render(status, "http://x")
    gpu_lines = [line for line in text.splitlines() if line.startswith(("GPU ", "0 ", "1 "))]
    assert "PCI" in gpu_lines[0] and "HEALTH" in gpu_lines[0]
    assert "00000000:43:00.0" in gpu_lines[2] and "unhealthy" in gpu_lines[2] and "healthy" in gpu_lines[1]
    assert "Node health: unhealthy" in text
    (reason,) = [line for line in text.splitlines() if "Xid 79" in line]
    assert reason.split()[:5] == ["1", "unhealthy", "node", "drain_node", "1"]
    # a daemon without the health signal (older) still renders
    del status["node_health"]
    assert "Node health" not in render(status, "http://x")


# -- in the daemon: the registered signal, every cycle ----------------------------------------------------


def test_a_daemon_on_the_fake_nvml_publishes_the_node_verdict_every_cycle(tmp_path: Path) -> None:
    """The registered ``health`` signal with the NVML health reader the daemon builds for an NVML
    source: a row-remap failure on GPU 4 and an Xid 48 event on GPU 1 make the node unhealthy in the
    snapshot with no job at all, and the change is an event."""
    from gpu_triage.daemon.config import load_config, override
    from gpu_triage.daemon.loop import Daemon

    config = override(
        load_config(None, {}),
        {
            "daemon.state_dir": str(tmp_path / "state"),
            "progress.dir": str(tmp_path / "progress"),
            "health.kernel_log": "off",
            "health.poll_interval_s": 0.5,
            "stacks.enabled": False,
        },
        origin="test",
    )
    fake = fake_nvml.row_remap(gpus=8, gpu=4, pending=False, failure=True)
    source = NvmlSource(deadline_s=1.0, nvml=fake)
    daemon = Daemon(config, source, serve_http=False)
    daemon.start()
    try:
        snap = daemon.cycle(daemon.clock())
        assert snap.jobs == () and snap.node_health.level is HealthLevel.UNHEALTHY
        assert [f.kind for f in snap.node_health.gpu(4).findings] == [FaultKind.ROW_REMAP_FAILURE]
        assert snap.gpus[4].pci_bus_id == snap.node_health.gpu(4).pci_bus_id == fake.boards[4].pci_bus_id
        assert snap.signals["health"]["nvml"]["events"] is True
        fake.inject_xid(1, 48)
        deadline = time.monotonic() + 5
        while not daemon.node_health.gpu(1).findings and time.monotonic() < deadline:
            time.sleep(0.05)
            snap = daemon.cycle(daemon.clock())
        (xid,) = snap.node_health.gpu(1).findings
        assert (xid.xid, xid.source, xid.action) == (48, FaultSource.NVML_EVENT, OperatorAction.DRAIN_NODE)
        assert daemon.store is not None
        events = [e for e in daemon.store.since(0, 1000) if e.kind == "health"]
        assert any(e.gpu == 4 and e.payload["level"] == "unhealthy" for e in events), events
    finally:
        daemon.close()
    assert fake.event_sets and fake.event_sets[0].freed


def test_a_node_signal_that_raises_or_sets_a_foreign_field_is_reported_and_the_others_go_on() -> None:
    from gpu_triage.daemon.config import Config
    from gpu_triage.daemon.observe import SignalSet
    from gpu_triage.signals.signal import SignalEnv, SignalKind

    class Broken:
        def __init__(self, settings: object, env: SignalEnv) -> None:
            self.started = False

        def start(self) -> None:
            self.started = True

        def node_facts(self, now: float) -> dict[str, object]:
            raise RuntimeError("the driver is gone")

        def contribute(self, now: float, jobs: object) -> dict[str, object]:
            return {}

        def status(self) -> dict[str, object]:
            return {}

        def reload(self, settings: object, env: SignalEnv) -> Broken:
            return self

        def close(self) -> None:
            pass

    class Sneaky(Broken):
        def node_facts(self, now: float) -> dict[str, object]:
            return {"mode": "kill"}

    class Fine(Broken):
        def node_facts(self, now: float) -> dict[str, object]:
            return {"node_health": "ok"}

    kinds = [
        SignalKind("broken", "health", Broken, ("broken",)),
        SignalKind("sneaky", "health", Sneaky, ("sneaky",)),
        SignalKind("fine", "health", Fine, ("fine",)),
    ]
    signals = SignalSet(Config(), SignalEnv(), kinds)
    signals.start()
    assert all(s.started for s in signals.signals.values())  # type: ignore[attr-defined]
    assert signals.node_facts(1.0) == {"node_health": "ok"}
    assert signals.node_errors["broken"] == "RuntimeError: the driver is gone"
    assert "not fields a signal may set" in signals.node_errors["sneaky"]


def test_a_replayed_recording_and_its_kernel_log_file_give_the_node_verdict(tmp_path: Path) -> None:
    """The replay source's GPUs carry the made-up bus ids (an nvidia-smi CSV names none); the
    recording's kernel log, given as ``kernel_log_file``, is read from its start onto them."""
    from gpu_triage.daemon.build import signal_env
    from gpu_triage.daemon.config import load_config, override
    from gpu_triage.signals.health.signal import HealthSignal
    from gpu_triage.telemetry.bus_ids import sim_bus_id
    from gpu_triage.telemetry.recording_writer import write_nvsmi_csv
    from gpu_triage.telemetry.replay import ReplaySource
    from gpu_triage.telemetry.sim import Scenario

    rec = tmp_path / "hang.csv"
    write_nvsmi_csv(
        rec,
        Scenario.symmetric_hang(5, 30, model="H100", gpus=4, power_limit_w=700.0),
        10,
        rate_hz=1,
        with_index=True,
    )
    log = tmp_path / "kern.log"
    log.write_text(
        "Dec  6 01:00:00 node kernel: [ 12.5] NVRM: Xid (PCI:0000:43:00): 95, pid=7, Uncontained: FBHUB\n"
    )
    source = ReplaySource(rec)
    assert [g.pci_bus_id for g in source.gpus()] == [sim_bus_id(g) for g in range(4)]
    assert source.sample(0.0)[1].pci_bus_id == sim_bus_id(1)
    config = override(
        load_config(None, {}), {"health.kernel_log": "off", "health.kernel_log_file": str(log)}, origin="test"
    )
    signal = HealthSignal(config.health, signal_env(config, source, time.monotonic))
    signal.start()
    health = signal.node_facts(3.0)["node_health"]
    (finding,) = health.gpu(1).findings  # type: ignore[attr-defined]
    assert (finding.xid, finding.action, finding.level) == (
        95,
        OperatorAction.RESET_GPU,
        HealthLevel.UNHEALTHY,
    )
    assert signal.status()["kernel_log"][0]["source"] == "file"
    signal.close()


def test_the_status_documents_node_health_matches_its_openapi_schema() -> None:
    """/status with every kind of finding validates against StatusDoc (extra fields forbidden): the
    OpenAPI description and the document cannot drift apart."""
    from gpu_triage.model.snapshot import Snapshot
    from gpu_triage.model.states import Mode
    from gpu_triage.serving.api import status_document
    from gpu_triage.serving.health_doc import NodeHealthDoc
    from gpu_triage.serving.status_doc import StatusDoc

    book = HealthBook(GPUS)
    book.add_event(HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, 1.0, gpu=3, xid=79))
    book.add_event(
        HardwareEvent(FaultKind.XID, FaultSource.NVML_EVENT, 1.0, pci_bus_id="00000000:04:00.0", xid=4242)
    )
    book.add_readings(
        [reading(0, remap_pending=True, throttle_reasons=0xE8, pcie_width=4, pcie_width_max=16)], 1.0
    )
    snapshot = Snapshot(
        node="n", source="sim", mode=Mode.OBSERVE, armed=False, cycle=1, time=1.0, period_s=1.0,
        node_health=book.node_health(1.0),
    )  # fmt: skip
    document = json.loads(json.dumps(status_document(snapshot)))
    StatusDoc.model_validate(document)
    NodeHealthDoc.model_validate(document["node_health"])
    assert document["node_health"]["level"] == "unhealthy"
    assert document["node_health"]["findings"][0]["xid"] == 4242


def test_the_journal_fallback_reads_a_real_child_without_blocking_and_stops_it(tmp_path: Path) -> None:
    """Where /dev/kmsg cannot be read, ``journalctl -k -f`` is the kernel log: a real child process
    (a stand-in script with journalctl's output form) read from a non-blocking pipe, partial lines
    kept, stopped at close."""
    from gpu_triage.signals.health.kernel_log import JournalReader

    script = tmp_path / "journalctl"
    script.write_text(
        "#!/bin/sh\n"
        'echo "$@" > "$(dirname "$0")/args"\n'
        "printf 'NVRM: Xid (PCI:0000:61:00): 79, pid=1, off the bus.\\nNVRM: Xid (PCI:0000:1b'\n"
        "sleep 0.5\n"
        "printf ':00): 13, Graphics Exception\\n'\n"
        "exec sleep 60\n"
    )
    script.chmod(0o755)
    reader = JournalReader(str(script))
    try:
        start = time.perf_counter()
        lines: list[str] = reader.poll()  # whatever is there now (maybe nothing yet): never waits
        assert time.perf_counter() - start < 0.5
        deadline = time.monotonic() + 10
        while len(lines) < 2 and time.monotonic() < deadline:
            lines += reader.poll()
            time.sleep(0.05)
        assert [parse_line(line).xid for line in lines] == [79, 13]  # type: ignore[union-attr]
        assert (tmp_path / "args").read_text().split() == ["-k", "-f", "-n", "0", "-o", "cat", "--no-pager"]
        proc = reader._proc
        assert proc is not None and proc.poll() is None
    finally:
        reader.close()
    assert proc.poll() is not None  # stopped, not left behind


def test_auto_falls_back_to_the_journal_when_dev_kmsg_cannot_be_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpu_triage.signals.health import kernel_log, monitor

    def denied(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    class Journal:
        name = "journal"

        def __init__(self) -> None:
            pass

    monkeypatch.setattr(kernel_log.KmsgReader, "__init__", denied)
    monkeypatch.setattr(monitor, "JournalReader", Journal)
    source, problem = monitor.open_kernel_log("auto")
    assert isinstance(source, Journal) and problem is None
    source, problem = monitor.open_kernel_log("kmsg")
    assert source is None and problem == "/dev/kmsg: Permission denied"


def test_the_journal_child_dies_with_the_daemon(tmp_path: Path) -> None:
    """A daemon killed outright (SIGKILL: no close) leaves no journalctl behind."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "journalctl"
    script.write_text('#!/bin/sh\necho $$ > "$(dirname "$0")/pid"\nexec sleep 60\n')
    script.chmod(0o755)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from gpu_triage.signals.health.kernel_log import JournalReader\n"
            f"r = JournalReader({str(script)!r})\n"
            "print('started', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "started"
        pid_file = tmp_path / "pid"
        deadline = time.monotonic() + 10
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        child = int(pid_file.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            status = (
                Path(f"/proc/{child}/stat").read_text().split()[2] if Path(f"/proc/{child}").exists() else "X"
            )
            if status == "Z":
                break  # dead, waiting for its new parent to reap it
            time.sleep(0.05)
        alive = Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z"
        assert not alive, "journalctl outlived the daemon"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_board_with_fewer_links_than_nvmls_maximum_is_probed_once_and_reads_clean(nvml_open) -> None:
    """An A100 has 12 NVLinks, NVML's maximum is 18: link 12 answers InvalidArgument. That is the
    board's link count, learnt once - not a read error every poll."""
    fake = fake_nvml.basic(2)
    for board in fake.boards:
        board.nvlink_links = 12
    _source, _reader, monitor = nvml_open(fake)
    for t in (1.0, 2.0, 3.0):
        health = monitor.sample(t)
        assert not health.read_errors, health.read_errors
    assert fake.calls_to("nvmlDeviceGetNvLinkState", 0) == 13 + 12 + 12
    fake.boards[0].nvlink_down = {11}
    (finding,) = monitor.sample(4.0).gpu(0).findings
    assert finding.detail == "NVLink down: link 11"
    monitor.close()


def test_an_xid_reported_by_both_nvml_and_the_kernel_log_counts_once() -> None:
    """On an NVML node with a readable kernel log every Xid arrives twice: as an NVML event and as a
    kernel line. The count is the most any one source saw, not the sum."""
    book = HealthBook(GPUS)
    for t in (1.0, 5.0):
        book.add_event(HardwareEvent(FaultKind.XID, FaultSource.NVML_EVENT, t, gpu=2, xid=48))
        book.add_event(
            HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, t + 0.5, pci_bus_id=GPUS[2][1], xid=48)
        )
    health = book.node_health(6.0)
    (finding,) = health.gpu(2).findings
    assert finding.count == 2 and finding.last_seen == 5.5
    assert [(x.gpu, x.xid, x.count) for x in health.xid_totals] == [(2, 48, 2)]


def test_a_sites_xid_catalog_replaces_the_builtin_one_and_a_bad_one_is_refused_at_start(
    tmp_path: Path,
) -> None:
    from gpu_triage.daemon.build import validate_health
    from gpu_triage.daemon.config import ConfigError, load_config, override
    from tests.conftest import REPO

    mine = tmp_path / "xid.toml"
    text = (REPO / "watchdog" / "signals" / "health" / "xid_catalog.toml").read_text()
    # this site drains on Xid 13 (say, a known-bad batch of boards)
    start = text.index("code = 13\n")
    entry_end = text.index("[[xid]]", start)
    entry = text[start:entry_end]
    changed = entry.replace('blame = "application"', 'blame = "gpu"').replace(
        'level = "healthy"', 'level = "unhealthy"'
    )
    changed = changed.replace('action = "restart_job"', 'action = "drain_node"')
    mine.write_text(text[:start] + changed + text[entry_end:])
    config = override(
        load_config(None, {}), {"health.kernel_log": "off", "health.xid_catalog": str(mine)}, origin="t"
    )
    validate_health(config)
    monitor = HealthMonitor(config.health, GPUS)
    monitor.book.add_event(HardwareEvent(FaultKind.XID, FaultSource.KERNEL_LOG, 1.0, gpu=0, xid=13))
    (finding,) = monitor.book.node_health(1.0).gpu(0).findings
    assert (finding.blame, finding.level, finding.action) == (
        Blame.NODE,
        HealthLevel.UNHEALTHY,
        OperatorAction.DRAIN_NODE,
    )
    mine.write_text(text.replace('blame = "fabric"', 'blame = "cosmic rays"', 1))
    with pytest.raises(
        ConfigError, match=r"health\.xid_catalog: .*xid\.toml: xid 74: blame: expected one of"
    ):
        validate_health(config)


@pytest.mark.parametrize(
    ("choice_", "simulated", "opened"),
    [
        ("auto", True, "off"),  # a simulation reads no kernel log of the machine by default
        ("auto", False, "auto"),
        ("kmsg", True, "kmsg"),  # ... unless the config names one
        ("journal", True, "journal"),
    ],
)
def test_auto_reads_the_machines_kernel_log_only_for_real_gpus(choice_: str, simulated: bool, opened: str):
    asked: list[str] = []

    def open_log(name: str) -> tuple[None, str]:
        asked.append(name)
        return None, "off"

    monitor = HealthMonitor(
        HealthConfig(kernel_log=choice_), [(0, "00000000:1B:00.0")], open_log=open_log, simulated=simulated
    )
    monitor.open()
    assert asked == [opened]
    monitor.close()
