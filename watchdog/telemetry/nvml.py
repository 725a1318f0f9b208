"""GPU telemetry from the NVIDIA management library, through the official ``nvidia-ml-py`` binding.

The binding's import name is ``pynvml`` (the older unofficial ``pynvml`` package shadows it; either
works here as long as it exposes the functions below). Every call runs on a per-GPU worker thread
under a hard deadline (:mod:`gpu_triage.telemetry.deadline`): a wedged GPU costs one deadline, then
fails fast while it backs off, and never stops the other GPUs being read. A sample reads the healthy
GPUs in sequence on one shared worker (one thread hand-off per sample); if that worker gets stuck in a
GPU, the GPUs read before it keep their samples, the ones not reached time out for that sample only,
and the stuck GPU is read on its own worker from then on (its backoff and fail-fast as before).

Units, as NVML gives them and as :class:`~gpu_triage.model.samples.GpuSample` wants them:

===================================  ==========================  =====================================
GpuSample field                      NVML call                   conversion
===================================  ==========================  =====================================
``power_w``                          nvmlDeviceGetPowerUsage     mW -> W. A ~1 s *average* on
                                                                 Ampere (but GA100) and newer,
                                                                 instantaneous on GA100 and older
``power_instant_w``                  field 186 POWER_INSTANT     mW -> W
``energy_j``                         GetTotalEnergyConsumption   mJ -> J (counter since driver load)
``utilization_ratio``                GetUtilizationRates .gpu    % -> 0..1
``memory_used/total_bytes``          GetMemoryInfo               bytes
``sm_clock_mhz``                     GetClockInfo(SM)            MHz
``temperature_c``                    GetTemperature(GPU)         degrees C
``power_limit_w``                    GetEnforcedPowerLimit       mW -> W
``nvlink_tx/rx_bytes``               fields 138/139, all links   KiB -> bytes (counters)
``pcie_tx/rx_bytes_per_s``           GetPcieThroughput           KB/s -> bytes/s (x1024)
``pids``                             GetComputeRunningProcesses  pids (listed at most every
                                                                 ``pids_interval_s``, 1 s)
===================================  ==========================  =====================================

Failures are data, never exceptions out of :meth:`NvmlSource.sample`:

- board power is the one *essential* read: if it fails (GPU lost, any NVML error) or the GPU's read
  overruns the deadline, the GPU's sample has ``error`` set (``"GpuIsLost: ..."``, ``"timeout: ..."``,
  ``"wedged: ..."``) and no numbers; a ``GpuIsLost`` from any call does the same;
- any other field that fails is ``None`` with an entry ``"<field>: <ErrorName>"`` in ``errors``. A
  field answering NotSupported is remembered and never asked again (it is still listed in ``errors``
  each sample, as ``"<field>: NotSupported"``, so a reader sees why it is missing; those entries are a
  capability, not a fault).

NVLink throughput fields need an explicit scope: pynvml leaves ``scopeId`` at 0 for a bare field id,
which reads link 0 only (1/18 of the traffic on an 18-link board). We ask for scope ``0xFFFFFFFF``,
the all-links aggregate nvml.h documents, and fall back to summing the per-link scopes on a driver
that rejects it.

``nvmlDeviceGetPcieThroughput`` samples the bus for ~20 ms per call inside the driver, so PCIe is read
at most every ``pcie_interval_s`` per GPU; between reads the last rates are repeated.

What the classifier judges changes between samples - power, utilisation, energy and the field values
(instantaneous power, NVLink) - and is read every sample (four calls per GPU at 10 Hz). What changes
slowly - memory in use, SM clock, temperature, the enforced power limit - is read at most every
``slow_interval_s`` (1 s) per GPU and repeated between, so each sample still has it; a read that
failed is asked again at the next sample, not an interval later.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, cast

from gpu_triage.model.health import canonical_bus_id
from gpu_triage.model.samples import GpuInfo, GpuSample, TelemetryUnavailable
from gpu_triage.telemetry.deadline import DeadlineExceeded, DeadlineExecutor, KeyHealth, Wedged

__all__ = ["NvmlSource", "nvml_available"]

_LIBRARY_KEY = "nvml"
"""Deadline key for device-independent calls (init, count, shutdown)."""
_ALL_LINKS = 0xFFFFFFFF
_FI_POWER_INSTANT = 186
_FI_NVLINK_TX = 138
_FI_NVLINK_RX = 139
_KIB = 1024


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise TelemetryUnavailable(
            "the NVIDIA management library binding is not installed (pip install nvidia-ml-py)"
        ) from exc
    return cast(ModuleType, pynvml)


def _error_name(nvml: Any, exc: BaseException) -> str:
    """``NVMLError_GpuIsLost`` -> ``GpuIsLost``; the class name carries the meaning in pynvml."""
    name = type(exc).__name__
    if name.startswith("NVMLError_"):
        return name[len("NVMLError_") :]
    value = getattr(exc, "value", None)
    return f"NVMLError({value})" if value is not None else name


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _field_number(nvml: Any, fv: Any) -> float:
    """The numeric value of one ``c_nvmlFieldValue_t``, by its ``valueType``."""
    member = {
        getattr(nvml, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(fv.valueType, "ullVal")
    return float(getattr(fv.value, member))


class _GpuLost(Exception):
    """Internal: a GpuIsLost seen on an optional read aborts the whole GPU read."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


@dataclass
class _Board:
    """Per-GPU state, touched only by the one thread reading that GPU (the batch worker or its own)."""

    index: int
    info: GpuInfo
    handle: Any = None
    unsupported: set[str] = field(default_factory=set)
    nvlink_per_link: bool = False
    """The driver rejected the all-links scope: sum per-link scopes instead."""
    pcie_read_at: float = -1e18
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    pids_read_at: float = -1e18
    pids: tuple[int, ...] | None = None
    """The compute processes last read (None: the read failed)."""
    slow_read_at: float = -1e18
    slow: dict[str, Any] = field(default_factory=dict)
    """The slowly changing reads (memory, sm_clock, temperature, power_limit) as last answered; a
    feature whose last read failed is absent (asked again at the next sample)."""


class NvmlSource:
    """Reads every GPU the driver lists on deadline-guarded worker threads.

    ``deadline_s`` bounds a whole sample (all GPUs are read against one deadline: the healthy ones in
    sequence on one worker, any that overran before each on its own).
    ``nvml`` is the binding module (default ``import pynvml``); tests pass a fake. Construction
    runs ``nvmlInit`` under the deadline and raises :class:`TelemetryUnavailable` when the binding or
    the library is missing or init fails.
    """

    name = "nvml"

    def __init__(
        self,
        deadline_s: float = 0.5,
        nvml: Any = None,
        *,
        backoff_s: float = 5.0,
        max_backoff_s: float = 300.0,
        pcie_interval_s: float = 1.0,
        pids_interval_s: float = 1.0,
        slow_interval_s: float = 1.0,
    ) -> None:
        self._nvml = _import_pynvml() if nvml is None else nvml
        self.deadline_s = float(deadline_s)
        self.pcie_interval_s = float(pcie_interval_s)
        self.pids_interval_s = float(pids_interval_s)
        """How often each GPU's compute processes are listed (the daemon's process period: only the
        process work reads them); between lists the last one is repeated."""
        self.slow_interval_s = float(slow_interval_s)
        """How often memory, SM clock, temperature and power limit are read per GPU (repeated between)."""
        self._ex = DeadlineExecutor(deadline_s, backoff_s=backoff_s, max_backoff_s=max_backoff_s, name="nvml")
        self._closed = False
        self._close_lock = threading.Lock()
        nv = self._nvml
        try:
            self._ex.call(_LIBRARY_KEY, nv.nvmlInit)
            count = int(self._ex.call(_LIBRARY_KEY, nv.nvmlDeviceGetCount))
        except (DeadlineExceeded, nv.NVMLError) as exc:
            self._ex.close()
            kind = "timed out" if isinstance(exc, DeadlineExceeded) else f"failed: {_error_name(nv, exc)}"
            raise TelemetryUnavailable(f"NVML initialisation {kind} ({exc})") from exc
        self._boards = [_Board(i, GpuInfo(gpu=i, name="unknown")) for i in range(count)]
        outcomes = self._ex.wait_all([self._ex.submit(b.index, self._read_info, b) for b in self._boards])
        for board, outcome in zip(self._boards, outcomes, strict=True):
            if outcome.ok:
                board.info = cast(GpuInfo, outcome.value)

    # -- static facts -------------------------------------------------------------------------------

    def _read_info(self, board: _Board) -> GpuInfo:
        nv = self._nvml
        board.handle = nv.nvmlDeviceGetHandleByIndex(board.index)

        def optional(fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except nv.NVMLError:
                return None

        name = optional(nv.nvmlDeviceGetName, board.handle)
        uuid = optional(nv.nvmlDeviceGetUUID, board.handle)
        pci = optional(nv.nvmlDeviceGetPciInfo, board.handle)
        limit_mw = optional(nv.nvmlDeviceGetEnforcedPowerLimit, board.handle)
        memory = optional(nv.nvmlDeviceGetMemoryInfo, board.handle)
        return GpuInfo(
            gpu=board.index,
            name=_text(name) if name is not None else "unknown",
            uuid=_text(uuid) if uuid is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            memory_total_bytes=float(memory.total) if memory is not None else None,
            pci_bus_id=canonical_bus_id(_text(pci.busId)) if pci is not None else None,
        )

    def gpus(self) -> list[GpuInfo]:
        return [b.info for b in self._boards]

    @property
    def binding(self) -> Any:
        """The NVML binding module (``pynvml``, or a test's fake)."""
        return self._nvml

    def per_gpu(self, fn: Any, *args: Any) -> list[tuple[int, Any, BaseException | None]]:
        """``fn(handle, index, *args)`` on every GPU's worker, under one shared deadline - the same
        per-GPU keys as :meth:`sample`, so a wedged GPU fails fast here too. Returns (index, value,
        error) per GPU; the error is the call's own or a :class:`DeadlineExceeded`."""
        if self._closed:
            raise RuntimeError("NvmlSource is closed")
        pendings = [self._ex.submit(b.index, self._with_handle, b, fn, args) for b in self._boards]
        return [
            (b.index, o.value, o.error)
            for b, o in zip(self._boards, self._ex.wait_all(pendings), strict=True)
        ]

    def library_call(self, fn: Any, *args: Any) -> Any:
        """A device-independent call (an event set) under the deadline; raises DeadlineExceeded."""
        return self._ex.call(_LIBRARY_KEY, fn, *args)

    def _with_handle(self, board: _Board, fn: Any, args: tuple[Any, ...]) -> Any:
        if board.handle is None:
            board.handle = self._nvml.nvmlDeviceGetHandleByIndex(board.index)
        return fn(board.handle, board.index, *args)

    def health(self) -> list[KeyHealth]:
        """Per-GPU deadline state (wedged, consecutive overruns, stuck threads), for logs and metrics."""
        return [self._ex.health(b.index) for b in self._boards]

    # -- sampling -------------------------------------------------------------------------------------

    def sample(self, now_s: float) -> list[GpuSample]:
        """Read every GPU; returns within ``deadline_s`` (plus scheduling slack).

        The healthy GPUs are read in sequence on one worker (one thread hand-off per sample, not one
        per GPU); a GPU that once overran is read on its own worker (see
        :meth:`DeadlineExecutor.run_each <gpu_triage.telemetry.deadline.DeadlineExecutor.run_each>`).
        """
        if self._closed:
            raise RuntimeError("NvmlSource is closed")
        outcomes = self._ex.run_each([(b.index, self._read_gpu, (b, now_s)) for b in self._boards])
        samples: list[GpuSample] = []
        for board, outcome in zip(self._boards, outcomes, strict=True):
            if outcome.ok:
                samples.append(cast(GpuSample, outcome.value))
            else:
                samples.append(self._failed(board, now_s, outcome.error))
        return samples

    def _failed(self, board: _Board, now_s: float, exc: BaseException | None) -> GpuSample:
        if isinstance(exc, _GpuLost):
            exc = exc.exc
        if isinstance(exc, Wedged):
            error = f"wedged: {exc}"
        elif isinstance(exc, DeadlineExceeded):
            error = f"timeout: NVML read exceeded the {self.deadline_s:.3g} s deadline"
        elif isinstance(exc, self._nvml.NVMLError):
            error = f"{_error_name(self._nvml, exc)}: {exc}"
        else:
            error = f"error: {type(exc).__name__}: {exc}"
        info = board.info
        return GpuSample(
            gpu=board.index,
            time_s=now_s,
            uuid=info.uuid,
            name=info.name,
            pci_bus_id=info.pci_bus_id,
            error=error,
        )

    def _read_gpu(self, board: _Board, now_s: float) -> GpuSample:
        """All reads of one GPU, on that GPU's worker thread. Raises only for an essential failure."""
        nv = self._nvml
        if board.handle is None:
            board.handle = nv.nvmlDeviceGetHandleByIndex(board.index)
        handle = board.handle
        errors: list[str] = []
        power_w = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0  # essential: errors propagate

        def optional(feature: str, fn: Any, *args: Any) -> Any:
            if feature in board.unsupported:
                errors.append(f"{feature}: NotSupported")
                return None
            try:
                return fn(*args)
            except nv.NVMLError as exc:
                return self._optional_failed(board, feature, exc, errors)

        energy_mj = optional("energy", nv.nvmlDeviceGetTotalEnergyConsumption, handle)
        util = optional("utilization", nv.nvmlDeviceGetUtilizationRates, handle)
        slow = board.slow
        now = time.monotonic()
        if now - board.slow_read_at >= self.slow_interval_s:
            board.slow_read_at = now
            slow.clear()  # all four asked again
        for feature, fn, *args in (
            ("memory", nv.nvmlDeviceGetMemoryInfo, handle),
            ("sm_clock", nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
            ("temperature", nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
            ("power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, handle),
        ):
            if feature not in slow:  # due, or its last read failed (NotSupported: never stored)
                value = optional(feature, fn, *args)
                if value is not None:
                    slow[feature] = value
        memory, sm_clock = slow.get("memory"), slow.get("sm_clock")
        temperature, limit_mw = slow.get("temperature"), slow.get("power_limit")
        pids = self._read_pids(board, optional)
        fields = self._read_fields(board, errors)
        pcie_tx, pcie_rx = self._read_pcie(board, errors)
        info = board.info
        return GpuSample(
            gpu=board.index,
            time_s=now_s,
            power_w=power_w,
            power_instant_w=fields.get("power_instant"),
            energy_j=energy_mj / 1000.0 if energy_mj is not None else None,
            utilization_ratio=util.gpu / 100.0 if util is not None else None,
            memory_used_bytes=float(memory.used) if memory is not None else None,
            memory_total_bytes=float(memory.total) if memory is not None else info.memory_total_bytes,
            sm_clock_mhz=float(sm_clock) if sm_clock is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else info.power_limit_w,
            nvlink_tx_bytes=fields.get("nvlink_tx"),
            nvlink_rx_bytes=fields.get("nvlink_rx"),
            pcie_tx_bytes_per_s=pcie_tx,
            pcie_rx_bytes_per_s=pcie_rx,
            pids=pids,
            uuid=info.uuid,
            name=info.name,
            pci_bus_id=info.pci_bus_id,
            errors=tuple(errors),
        )

    def _optional_failed(self, board: _Board, feature: str, exc: BaseException, errors: list[str]) -> None:
        """Record a failed optional read; a lost GPU aborts the whole read."""
        nv = self._nvml
        value = getattr(exc, "value", None)
        if value == nv.NVML_ERROR_GPU_IS_LOST:
            raise _GpuLost(exc)
        if value == nv.NVML_ERROR_NOT_SUPPORTED:
            board.unsupported.add(feature)
        errors.append(f"{feature}: {_error_name(nv, exc)}")
        return None

    def _read_fields(self, board: _Board, errors: list[str]) -> dict[str, float]:
        """Instantaneous power and NVLink counters in one ``nvmlDeviceGetFieldValues`` call."""
        nv = self._nvml
        wanted: list[tuple[str, tuple[int, int]]] = []
        if "power_instant" in board.unsupported:
            errors.append("power_instant: NotSupported")
        else:
            wanted.append(("power_instant", (_FI_POWER_INSTANT, 0)))
        if "nvlink" in board.unsupported:
            errors.append("nvlink: NotSupported")
        elif board.nvlink_per_link:
            links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
            wanted += [("nvlink_tx", (_FI_NVLINK_TX, link)) for link in range(links)]
            wanted += [("nvlink_rx", (_FI_NVLINK_RX, link)) for link in range(links)]
        else:
            wanted += [("nvlink_tx", (_FI_NVLINK_TX, _ALL_LINKS)), ("nvlink_rx", (_FI_NVLINK_RX, _ALL_LINKS))]
        if not wanted:
            return {}
        try:
            values = nv.nvmlDeviceGetFieldValues(board.handle, [fid for _, fid in wanted])
        except nv.NVMLError as exc:
            for feature in sorted({"power_instant", "nvlink"} - board.unsupported):
                self._optional_failed(board, feature, exc, errors)
            return {}
        out: dict[str, float] = {}
        nvlink_codes: list[int] = []
        for (key, _), fv in zip(wanted, values, strict=True):
            code = int(fv.nvmlReturn)
            if key == "power_instant":
                if code == nv.NVML_SUCCESS:
                    out[key] = _field_number(nv, fv) / 1000.0  # mW -> W
                elif code == nv.NVML_ERROR_NOT_SUPPORTED:
                    board.unsupported.add(key)
                    errors.append(f"{key}: NotSupported")
                else:
                    errors.append(f"{key}: {_error_name(nv, nv.NVMLError(code))}")
                continue
            nvlink_codes.append(code)
            if code == nv.NVML_SUCCESS:
                out[key] = out.get(key, 0.0) + _field_number(nv, fv) * _KIB  # KiB -> bytes
        if nvlink_codes and not ({"nvlink_tx", "nvlink_rx"} <= out.keys()):
            self._nvlink_failed(board, nvlink_codes, errors)
            out.pop("nvlink_tx", None)
            out.pop("nvlink_rx", None)
        return out

    def _nvlink_failed(self, board: _Board, codes: list[int], errors: list[str]) -> None:
        """Decide what a failed NVLink read means: no counters on this board, an older driver that
        refuses the all-links scope, or a transient error."""
        nv = self._nvml
        failed = [c for c in codes if c != nv.NVML_SUCCESS] or [nv.NVML_ERROR_NOT_SUPPORTED]
        if all(c == nv.NVML_ERROR_NOT_SUPPORTED for c in failed) or board.nvlink_per_link:
            # A NotSupported answer, or per-link reads that all failed: this board has no NVLink counters.
            board.unsupported.add("nvlink")
            errors.append("nvlink: NotSupported")
        elif nv.NVML_ERROR_INVALID_ARGUMENT in failed:
            # The all-links scope was refused (older driver): sum per-link scopes from the next sample on.
            board.nvlink_per_link = True
            errors.append("nvlink: InvalidArgument (all-links scope refused; reading per link from now on)")
        else:
            bad = next(c for c in failed if c != nv.NVML_ERROR_NOT_SUPPORTED)
            errors.append(f"nvlink: {_error_name(nv, nv.NVMLError(bad))}")

    def _read_pids(self, board: _Board, optional: Any) -> tuple[int, ...]:
        """The GPU's compute processes, listed at most every ``pids_interval_s`` (the call walks the
        driver's process table; the daemon reads the pids once per process period, not per sample)."""
        now = time.monotonic()
        if now - board.pids_read_at >= self.pids_interval_s or board.pids is None:
            board.pids_read_at = now
            procs = optional("processes", self._nvml.nvmlDeviceGetComputeRunningProcesses, board.handle)
            board.pids = tuple(int(p.pid) for p in procs) if procs is not None else None
        return board.pids or ()

    def _read_pcie(self, board: _Board, errors: list[str]) -> tuple[float | None, float | None]:
        nv = self._nvml
        if "pcie" in board.unsupported:
            errors.append("pcie: NotSupported")
            return None, None
        now = time.monotonic()
        if now - board.pcie_read_at >= self.pcie_interval_s:
            board.pcie_read_at = now
            try:
                tx = nv.nvmlDeviceGetPcieThroughput(board.handle, nv.NVML_PCIE_UTIL_TX_BYTES)
                rx = nv.nvmlDeviceGetPcieThroughput(board.handle, nv.NVML_PCIE_UTIL_RX_BYTES)
            except nv.NVMLError as exc:
                board.pcie_tx_bytes_per_s = board.pcie_rx_bytes_per_s = None
                self._optional_failed(board, "pcie", exc, errors)
                return None, None
            board.pcie_tx_bytes_per_s = float(tx) * _KIB
            board.pcie_rx_bytes_per_s = float(rx) * _KIB
        return board.pcie_tx_bytes_per_s, board.pcie_rx_bytes_per_s

    # -- lifecycle --------------------------------------------------------------------------------------

    def close(self) -> None:
        """``nvmlShutdown`` under the deadline (best effort), then stop the workers. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(DeadlineExceeded, self._nvml.NVMLError):
            self._ex.call(_LIBRARY_KEY, self._nvml.nvmlShutdown)
        self._ex.close()

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def nvml_available(nvml: Any = None, deadline_s: float = 0.5) -> bool:
    """True when the binding imports and ``nvmlInit`` succeeds within ``deadline_s`` (then shuts down).

    For deciding ``auto``; :func:`gpu_triage.telemetry.factory.make_source` itself just tries
    :class:`NvmlSource` and falls back on :class:`TelemetryUnavailable`.
    """
    try:
        nv = _import_pynvml() if nvml is None else nvml
    except TelemetryUnavailable:
        return False
    ex = DeadlineExecutor(deadline_s, name="nvml-probe")
    try:
        ex.call(_LIBRARY_KEY, nv.nvmlInit)
    except (DeadlineExceeded, nv.NVMLError):
        return False
    else:
        with contextlib.suppress(DeadlineExceeded, nv.NVMLError):
            ex.call(_LIBRARY_KEY, nv.nvmlShutdown)
        return True
    finally:
        ex.close()
