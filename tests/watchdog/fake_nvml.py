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

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-00000000-0000-4000-8000-{self.index:012d}"


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

    def __init__(
        self, gpus: list[FakeGpu], *, init_error: int | None = None, init_hang: threading.Event | None = None
    ) -> None:
        self.boards = gpus
        self.init_error = init_error
        self.init_hang = init_hang
        self.initialized = False
        self.calls: Counter[tuple[str, int | None]] = Counter()
        """(API name, GPU index or None) -> number of calls."""
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
