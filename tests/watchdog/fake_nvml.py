"""A fake ``pynvml`` module for GPU-less tests: the one place in this project where a fake is right.

:class:`FakeNvml` has the slice of the official ``nvidia-ml-py`` API that
:class:`gpu_triage.telemetry.nvml.NvmlSource` uses - same function names, same argument forms, same
units (milliwatts, millijoules, KiB, KB/s, bytes), same error classes and value codes, same
field-value structs - and behaves like the library on the paths that matter:

- calls before ``nvmlInit`` raise ``NVMLError_Uninitialized``;
- ``nvmlDeviceGetFieldValues`` accepts bare field ids *or* ``(fieldId, scopeId)`` tuples, exactly
  like pynvml, and honours the scope: a bare NVLink throughput id reads link 0 only, scope
  ``0xFFFFFFFF`` the sum over all links (the aggregate nvml.h documents). A source that forgets the
  scope reads 1/N of the traffic, and the tests notice;
- a per-field failure comes back in the struct's ``nvmlReturn``, not as an exception.

It is driven by data: one :class:`FakeGpu` per board with its readings and its failure modes
(``lost``, ``not_supported`` API names or fields, ``hang`` API names that block until released). The
scenario fixtures at the bottom - :func:`basic`, :func:`gpu_lost`, :func:`not_supported`,
:func:`hang`, :func:`init_failure` - build the cases the tests need, after wookayin/gpustat's
GPU-less scenario fixtures. Every call is counted in :attr:`FakeNvml.calls` so a test can assert
that a NotSupported field is not asked for again.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

MIB = 1024 * 1024

# -- constants, same values as pynvml ---------------------------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6

NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_INSTANT = 186
NVML_NVLINK_MAX_LINKS = 18
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
SCOPE_ALL_LINKS = 0xFFFFFFFF
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeGpuUnavailableError = 0x4000
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
#: The PCI buses of the fake boards (an HGX-like layout): board i sits on FAKE_BUSES[i % 8].
FAKE_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

# -- errors: NVMLError(value) returns the matching subclass, as in pynvml ----------------------------


class NVMLError(Exception):
    _by_value: ClassVar[dict[int, type[NVMLError]]] = {}
    _strings: ClassVar[dict[int, str]] = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_value.get(value, NVMLError)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return self._strings.get(self.value, f"NVML error {self.value}")


def _error_class(name: str, value: int) -> type[NVMLError]:
    cls = type(f"NVMLError_{name}", (NVMLError,), {})
    NVMLError._by_value[value] = cls
    return cls


NVMLError_Uninitialized = _error_class("Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_DriverNotLoaded = _error_class("DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_Timeout = _error_class("Timeout", NVML_ERROR_TIMEOUT)
NVMLError_LibraryNotFound = _error_class("LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("Unknown", NVML_ERROR_UNKNOWN)


# -- structs -------------------------------------------------------------------------------------------


@dataclass
class c_nvmlValue_t:
    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0


@dataclass
class c_nvmlFieldValue_t:
    fieldId: int = 0
    scopeId: int = 0
    timestamp: int = 0
    latencyUsec: int = 0
    valueType: int = 0
    nvmlReturn: int = NVML_SUCCESS
    value: c_nvmlValue_t = field(default_factory=c_nvmlValue_t)


@dataclass
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass
class c_nvmlProcessInfo_t:
    pid: int
    usedGpuMemory: int


@dataclass
class c_nvmlPciInfo_t:
    busId: bytes
    busIdLegacy: bytes


@dataclass
class c_nvmlGpuFabricInfo_t:
    state: int = 0
    status: int = 0


@dataclass
class c_nvmlEventData_t:
    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


@dataclass
class FakeEventSet:
    """An event set: what the fake driver queued for the GPUs registered on it."""

    registered: dict[int, int] = field(default_factory=dict)
    """GPU index -> event type mask."""
    queue: list[c_nvmlEventData_t] = field(default_factory=list)
    ready: threading.Condition = field(default_factory=threading.Condition)
    freed: bool = False


@dataclass(frozen=True)
class FakeHandle:
    index: int


# -- the boards ----------------------------------------------------------------------------------------


@dataclass
class FakeGpu:
    """One board's readings (NVML units) and failure modes."""

    index: int
    name: str = "NVIDIA B300 SXM6 AC"
    power_mw: int = 850_000
    power_instant_mw: int = 862_500
    energy_mj: int = 4_000_000_000
    util_gpu_percent: int = 93
    memory_total_bytes: int = 275_040 * MIB
    memory_used_bytes: int = 233_000 * MIB
    sm_clock_mhz: int = 1965
    temperature_c: int = 61
    enforced_power_limit_mw: int = 1_100_000
    nvlink_tx_kib_per_link: tuple[int, ...] = tuple(range(1000, 1018))
    nvlink_rx_kib_per_link: tuple[int, ...] = tuple(range(2000, 2018))
    pcie_tx_kb_per_s: int = 2_000
    pcie_rx_kb_per_s: int = 3_000
    pids: tuple[int, ...] = ()
    uuid: str = ""
    lost: bool = False
    """Every call on this board raises NVMLError_GpuIsLost."""
    not_supported: set[str] = field(default_factory=set)
    """API names (``nvmlDeviceGetTotalEnergyConsumption``) raising NotSupported, or field ids
    (``"field:186"``) answering NOT_SUPPORTED in their struct."""
    errors: dict[str, int] = field(default_factory=dict)
    """API name -> NVML error code raised on every call."""
    hang: dict[str, threading.Event] = field(default_factory=dict)
    """API name -> event the call blocks on until set (a wedged GPU)."""
    reject_all_links_scope: bool = False
    """An older driver that answers INVALID_ARGUMENT to the all-links NVLink scope."""
    # -- health (issue 27): NVML units and states ----------------------------------------------------
    pci_bus_id: str = ""
    """NVML's busId; default ``00000000:<FAKE_BUSES[index % 8]>:00.0``."""
    ecc_corrected: int = 0
    """Volatile correctable ECC count."""
    ecc_uncorrected: int = 0
    retired_pages_pending: bool = False
    remap_pending: bool = False
    remap_failure: bool = False
    nvlink_links: int = 18
    """Links the board has (0: NVLink NotSupported, a PCIe part)."""
    nvlink_down: set[int] = field(default_factory=set)
    """Links NVML reports inactive."""
    nvlink_errors: dict[int, int] = field(default_factory=dict)
    """NVLink error counter (``NVML_NVLINK_ERROR_DL_*``) -> value on every active link."""
    throttle_reasons: int = 0
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    fabric: tuple[int, int] | None = None
    """(state, status) of the NVLink fabric registration; None: NotSupported (not an NVL system)."""
    supported_events: int = 0x8 | 0x2 | 0x4000

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-00000000-0000-4000-8000-{self.index:012d}"
        if not self.pci_bus_id:
            domain, slot = divmod(self.index, len(FAKE_BUSES))
            self.pci_bus_id = f"{domain:08X}:{FAKE_BUSES[slot]:02X}:00.0"


class FakeNvml:
    """Module-like stand-in for ``pynvml``; pass it as ``NvmlSource(nvml=fake)``."""

    # errors and structs, reachable as attributes like on the real module
    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown
    c_nvmlFieldValue_t = c_nvmlFieldValue_t
    c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t

    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN
    NVML_VALUE_TYPE_DOUBLE = NVML_VALUE_TYPE_DOUBLE
    NVML_VALUE_TYPE_UNSIGNED_INT = NVML_VALUE_TYPE_UNSIGNED_INT
    NVML_VALUE_TYPE_UNSIGNED_LONG = NVML_VALUE_TYPE_UNSIGNED_LONG
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = NVML_VALUE_TYPE_SIGNED_LONG_LONG
    NVML_VALUE_TYPE_SIGNED_INT = NVML_VALUE_TYPE_SIGNED_INT
    NVML_VALUE_TYPE_UNSIGNED_SHORT = NVML_VALUE_TYPE_UNSIGNED_SHORT
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    NVML_FI_DEV_POWER_AVERAGE = NVML_FI_DEV_POWER_AVERAGE
    NVML_FI_DEV_POWER_INSTANT = NVML_FI_DEV_POWER_INSTANT
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_FEATURE_DISABLED = NVML_FEATURE_DISABLED
    NVML_FEATURE_ENABLED = NVML_FEATURE_ENABLED
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    nvmlEventTypeDoubleBitEccError = nvmlEventTypeDoubleBitEccError
    nvmlEventTypeGpuUnavailableError = nvmlEventTypeGpuUnavailableError

    def __init__(
        self, gpus: list[FakeGpu], *, init_error: int | None = None, init_hang: threading.Event | None = None
    ) -> None:
        self.boards = gpus
        self.init_error = init_error
        self.init_hang = init_hang
        self.initialized = False
        self.calls: Counter[tuple[str, int | None]] = Counter()
        """(API name, GPU index or None) -> number of calls."""
        self.event_sets: list[FakeEventSet] = []
        self.hang_entered = threading.Event()
        """Set when a call starts blocking on a ``hang`` event."""
        self._lock = threading.Lock()

    # -- helpers ---------------------------------------------------------------------------------

    def _enter(self, api: str, handle: FakeHandle | None = None) -> FakeGpu | None:
        with self._lock:
            self.calls[(api, None if handle is None else handle.index)] += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = self.boards[handle.index]
        if api in gpu.hang:
            self.hang_entered.set()
            gpu.hang[api].wait()
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if api in gpu.errors:
            raise NVMLError(gpu.errors[api])
        if api in gpu.not_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def release(self) -> None:
        """Unblock every hanging call (tests call this at teardown so no thread outlives them)."""
        if self.init_hang is not None:
            self.init_hang.set()
        for gpu in self.boards:
            for event in gpu.hang.values():
                event.set()

    def calls_to(self, api: str, gpu: int | None = None) -> int:
        return self.calls[(api, gpu)]

    # -- library -----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._lock:
            self.calls[("nvmlInit", None)] += 1
        if self.init_hang is not None:
            self.hang_entered.set()
            self.init_hang.wait()
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.boards):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    # -- static facts --------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        gpu = self._enter("nvmlDeviceGetName", handle)
        assert gpu is not None
        return gpu.name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        gpu = self._enter("nvmlDeviceGetUUID", handle)
        assert gpu is not None
        return gpu.uuid

    # -- readings -------------------------------------------------------------------------------------

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetPowerUsage", handle)
        assert gpu is not None
        return gpu.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        assert gpu is not None
        return gpu.energy_mj

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        assert gpu is not None
        return gpu.enforced_power_limit_mw

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> c_nvmlUtilization_t:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        assert gpu is not None
        return c_nvmlUtilization_t(gpu=gpu.util_gpu_percent, memory=30)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> c_nvmlMemory_t:
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        assert gpu is not None
        return c_nvmlMemory_t(
            total=gpu.memory_total_bytes,
            free=gpu.memory_total_bytes - gpu.memory_used_bytes,
            used=gpu.memory_used_bytes,
        )

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        gpu = self._enter("nvmlDeviceGetClockInfo", handle)
        assert gpu is not None
        if clock_type != NVML_CLOCK_SM:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.sm_clock_mhz

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self._enter("nvmlDeviceGetTemperature", handle)
        assert gpu is not None
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_c

    def nvmlDeviceGetPcieThroughput(self, handle: FakeHandle, counter: int) -> int:
        gpu = self._enter("nvmlDeviceGetPcieThroughput", handle)
        assert gpu is not None
        if counter == NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kb_per_s
        if counter == NVML_PCIE_UTIL_RX_BYTES:
            return gpu.pcie_rx_kb_per_s
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[c_nvmlProcessInfo_t]:
        gpu = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        assert gpu is not None
        return [c_nvmlProcessInfo_t(pid=pid, usedGpuMemory=1 << 30) for pid in gpu.pids]

    # -- health (issue 27) ------------------------------------------------------------------------

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> c_nvmlPciInfo_t:
        gpu = self._enter("nvmlDeviceGetPciInfo", handle)
        assert gpu is not None
        return c_nvmlPciInfo_t(busId=gpu.pci_bus_id.encode(), busIdLegacy=gpu.pci_bus_id[4:].encode())

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter_type: int) -> int:
        gpu = self._enter("nvmlDeviceGetTotalEccErrors", handle)
        assert gpu is not None
        if counter_type != NVML_VOLATILE_ECC:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ecc_corrected if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc_uncorrected

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        assert gpu is not None
        return NVML_FEATURE_ENABLED if gpu.retired_pages_pending else NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        gpu = self._enter("nvmlDeviceGetRemappedRows", handle)
        assert gpu is not None
        return (0, 1 if gpu.remap_pending else 0, int(gpu.remap_pending), int(gpu.remap_failure))

    def _link(self, api: str, handle: FakeHandle, link: int) -> FakeGpu:
        gpu = self._enter(api, handle)
        assert gpu is not None
        if gpu.nvlink_links == 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.nvlink_links:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        gpu = self._link("nvmlDeviceGetNvLinkState", handle, link)
        return NVML_FEATURE_DISABLED if link in gpu.nvlink_down else NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: FakeHandle, link: int, counter: int) -> int:
        gpu = self._link("nvmlDeviceGetNvLinkErrorCounter", handle, link)
        return gpu.nvlink_errors.get(counter, 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        assert gpu is not None
        return gpu.throttle_reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        assert gpu is not None
        return gpu.pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        assert gpu is not None
        return gpu.pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetCurrPcieLinkWidth", handle)
        assert gpu is not None
        return gpu.pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetMaxPcieLinkWidth", handle)
        assert gpu is not None
        return gpu.pcie_width_max

    def nvmlDeviceGetGpuFabricInfo(self, handle: FakeHandle, info: c_nvmlGpuFabricInfo_t) -> int:
        gpu = self._enter("nvmlDeviceGetGpuFabricInfo", handle)
        assert gpu is not None
        if gpu.fabric is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info.state, info.status = gpu.fabric
        return NVML_SUCCESS

    # -- the event API: a set, registrations, a bounded wait -----------------------------------------

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetSupportedEventTypes", handle)
        assert gpu is not None
        return gpu.supported_events

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, event_types: int, event_set: FakeEventSet) -> None:
        gpu = self._enter("nvmlDeviceRegisterEvents", handle)
        assert gpu is not None
        if event_types & ~gpu.supported_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        event_set.registered[handle.index] = event_types

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> c_nvmlEventData_t:
        self._enter("nvmlEventSetWait_v2")
        with event_set.ready:
            if not event_set.queue:
                event_set.ready.wait(timeout_ms / 1000.0)
            if not event_set.queue:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            return event_set.queue.pop(0)

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._enter("nvmlEventSetFree")
        event_set.freed = True

    def inject_event(self, gpu: int, event_type: int, data: int = 0) -> int:
        """The driver reports an event on ``gpu``: queued on every set it is registered on for that
        type. Returns the number of sets that got it."""
        delivered = 0
        for event_set in self.event_sets:
            if event_set.registered.get(gpu, 0) & event_type:
                with event_set.ready:
                    event_set.queue.append(c_nvmlEventData_t(FakeHandle(gpu), event_type, data))
                    event_set.ready.notify_all()
                delivered += 1
        return delivered

    def inject_xid(self, gpu: int, code: int) -> int:
        return self.inject_event(gpu, nvmlEventTypeXidCriticalError, code)

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: list[Any]) -> list[c_nvmlFieldValue_t]:
        gpu = self._enter("nvmlDeviceGetFieldValues", handle)
        assert gpu is not None
        out = []
        for item in field_ids:
            # pynvml: a (fieldId, scopeId) tuple sets both; a bare id leaves scopeId at 0.
            fid, scope = item if isinstance(item, tuple) else (item, 0)
            value = c_nvmlFieldValue_t(fieldId=fid, scopeId=scope, timestamp=1, latencyUsec=5)
            out.append(value)
            if f"field:{fid}" in gpu.not_supported:
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            elif fid == NVML_FI_DEV_POWER_INSTANT:
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.power_instant_mw
            elif fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
                links = (
                    gpu.nvlink_tx_kib_per_link
                    if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
                    else gpu.nvlink_rx_kib_per_link
                )
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                if scope == SCOPE_ALL_LINKS and not gpu.reject_all_links_scope:
                    value.value.ullVal = sum(links)
                elif scope < len(links):
                    value.value.ullVal = links[scope]
                else:
                    value.nvmlReturn = NVML_ERROR_INVALID_ARGUMENT
            else:
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return out


# -- scenario fixtures ----------------------------------------------------------------------------------


def _b300_board(index: int) -> FakeGpu:
    """A B300-like board with fixed, index-dependent readings (so a mix-up between GPUs shows)."""
    return FakeGpu(
        index=index,
        power_mw=850_000 + 1_000 * index,
        power_instant_mw=862_500 + 1_000 * index,
        energy_mj=4_000_000_000 + 1_000_000 * index,
        util_gpu_percent=90 + index,
        temperature_c=60 + index,
        pids=(10_000 + index,),
    )


def basic(gpus: int = 8) -> FakeNvml:
    """``gpus`` B300-like boards, everything supported, nothing failing."""
    return FakeNvml([_b300_board(i) for i in range(gpus)])


def gpu_lost(gpus: int = 8, lost: int = 3) -> FakeNvml:
    """Board ``lost`` raises NVMLError_GpuIsLost on every call (fell off the bus); the rest are fine."""
    fake = basic(gpus)
    fake.boards[lost].lost = True
    return fake


def not_supported(gpus: int = 8) -> FakeNvml:
    """NVLink throughput, the energy counter and instantaneous power are NotSupported on every board
    (an older or PCIe part)."""
    fake = basic(gpus)
    for board in fake.boards:
        board.not_supported |= {
            "nvmlDeviceGetTotalEnergyConsumption",
            f"field:{NVML_FI_DEV_POWER_INSTANT}",
            f"field:{NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX}",
            f"field:{NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX}",
        }
    return fake


def hang(gpus: int = 8, stuck: int = 5, api: str = "nvmlDeviceGetPowerUsage") -> FakeNvml:
    """``api`` on board ``stuck`` blocks until :meth:`FakeNvml.release` (a wedged GPU)."""
    fake = basic(gpus)
    fake.boards[stuck].hang[api] = threading.Event()
    return fake


def init_failure(code: int = NVML_ERROR_DRIVER_NOT_LOADED) -> FakeNvml:
    """``nvmlInit`` raises ``code`` (no driver loaded, library missing...)."""
    return FakeNvml([], init_error=code)


# -- health scenarios (issue 27): one board changed, the rest basic -----------------------------------


def ecc(gpus: int = 8, gpu: int = 2, corrected: int = 0, uncorrected: int = 0) -> FakeNvml:
    """Board ``gpu`` has these volatile ECC counts (raise them between polls for a burst)."""
    fake = basic(gpus)
    fake.boards[gpu].ecc_corrected, fake.boards[gpu].ecc_uncorrected = corrected, uncorrected
    return fake


def row_remap(gpus: int = 8, gpu: int = 4, pending: bool = True, failure: bool = False) -> FakeNvml:
    """Board ``gpu`` has a row remap pending (reset to apply) and/or a remap failure."""
    fake = basic(gpus)
    fake.boards[gpu].remap_pending, fake.boards[gpu].remap_failure = pending, failure
    return fake


def retired_pages_pending(gpus: int = 8, gpu: int = 1) -> FakeNvml:
    fake = basic(gpus)
    fake.boards[gpu].retired_pages_pending = True
    return fake


def nvlink(
    gpus: int = 8, gpu: int = 6, down: set[int] | None = None, errors: dict[int, int] | None = None
) -> FakeNvml:
    """Board ``gpu``'s NVLink: ``down`` links inactive, ``errors`` counter -> value per active link."""
    fake = basic(gpus)
    fake.boards[gpu].nvlink_down = set(down or ())
    fake.boards[gpu].nvlink_errors = dict(errors or {})
    return fake


def throttle(gpus: int = 8, gpu: int = 0, reasons: int = nvmlClocksEventReasonHwThermalSlowdown) -> FakeNvml:
    """Board ``gpu`` is clock-throttled for ``reasons`` (a ``nvmlClocksEventReason*`` mask)."""
    fake = basic(gpus)
    fake.boards[gpu].throttle_reasons = reasons
    return fake


def pcie_degraded(gpus: int = 8, gpu: int = 7, width: int = 8, gen: int = 5) -> FakeNvml:
    """Board ``gpu``'s PCIe link trained below its maximum (x8 of x16 by default)."""
    fake = basic(gpus)
    fake.boards[gpu].pcie_width, fake.boards[gpu].pcie_gen = width, gen
    return fake


def fabric(
    gpus: int = 8, gpu: int = 5, state: int = NVML_GPU_FABRIC_STATE_COMPLETED, status: int = 0
) -> FakeNvml:
    """An NVL system: every board reports a completed fabric registration; ``gpu`` reports (state, status)."""
    fake = basic(gpus)
    for board in fake.boards:
        board.fabric = (NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS)
    fake.boards[gpu].fabric = (state, status)
    return fake


def no_nvlink(gpus: int = 8) -> FakeNvml:
    """A PCIe part: NVLink state and counters answer NotSupported on every board."""
    fake = basic(gpus)
    for board in fake.boards:
        board.nvlink_links = 0
    return fake
