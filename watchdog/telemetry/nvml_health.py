"""NVML health reads and events for the health signal (``signals/health``), behind the same hard
deadlines as the telemetry reads (:meth:`~gpu_triage.telemetry.nvml.NvmlSource.per_gpu`: each GPU's
own worker and deadline key, so a GPU wedged in a telemetry read fails fast here too, and back).

Polled per GPU (:meth:`NvmlHealthReader.read`, all GPUs in parallel against one deadline):

==========================================  ===================================================
GpuHealthReading field                      NVML call
==========================================  ===================================================
``ecc_volatile_corrected/uncorrected``      nvmlDeviceGetTotalEccErrors(type, VOLATILE)
``retired_pages_pending``                   nvmlDeviceGetRetiredPagesPendingStatus
``remap_pending``, ``remap_failure``        nvmlDeviceGetRemappedRows
``nvlink_crc/replay/recovery_errors``       nvmlDeviceGetNvLinkErrorCounter, summed over links
``nvlink_links_down``                       nvmlDeviceGetNvLinkState (links up at the first read)
``throttle_reasons``                        nvmlDeviceGetCurrentClocksEventReasons
``pcie_gen/_max``, ``pcie_width/_max``      Get{Curr,Max}PcieLink{Generation,Width}
``fabric_state``, ``fabric_status``         nvmlDeviceGetGpuFabricInfo (NVL systems)
``lost``                                    any of them answering NVML_ERROR_GPU_IS_LOST
==========================================  ===================================================

A read answering NotSupported is remembered per GPU and not asked again (an older board, a PCIe
part without NVLink); any other failure is named in the reading's ``errors``.

Events (:meth:`NvmlHealthReader.events`): one event set, registered for Xid, double-bit ECC and
GPU-unavailable events on every GPU that supports them, is waited on by a daemon thread in waits of
``wait_ms`` (1 s): the cycle only drains what the thread queued (at most ``max_queued``; the rest is
counted as dropped), so a wedged driver can stop the thread, never the cycle.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections import deque
from typing import Any

from gpu_triage.model.health import FaultKind, FaultSource, GpuHealthReading, HardwareEvent
from gpu_triage.telemetry.deadline import DeadlineExceeded, Wedged
from gpu_triage.telemetry.nvml import NvmlSource

_XID_CRITICAL = 0x8
_DOUBLE_BIT_ECC = 0x2
_GPU_UNAVAILABLE = 0x4000
_WANTED_EVENTS = _XID_CRITICAL | _DOUBLE_BIT_ECC | _GPU_UNAVAILABLE
_MAX_LINKS = 18


class NvmlHealthReader:
    """:class:`~gpu_triage.model.health.HealthReader` over an :class:`NvmlSource`'s binding and workers."""

    def __init__(
        self,
        source: NvmlSource,
        *,
        events: bool = True,
        wait_ms: int = 1000,
        max_queued: int = 10_000,
        clock: Any = None,
    ) -> None:
        self.source = source
        self.nv = source.binding
        self._clock = clock or time.monotonic
        self._unsupported: dict[int, set[str]] = {}
        self._links_up: dict[int, tuple[int, ...]] = {}
        self._link_count: dict[int, int] = {}
        self._queue: deque[HardwareEvent] = deque(maxlen=max_queued)
        self._lock = threading.Lock()
        self.events_total = 0
        self.events_dropped = 0
        self.event_problem: str | None = None
        self.wait_ms = int(wait_ms)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        self._handles: dict[Any, int] = {}
        if events:
            self._start_events()

    # -- polls ---------------------------------------------------------------------------------------

    def read(self, now: float) -> list[GpuHealthReading]:
        out: list[GpuHealthReading] = []
        for index, value, error in self.source.per_gpu(self._read_one):
            if error is None and isinstance(value, GpuHealthReading):
                out.append(value)
            elif isinstance(error, Wedged):
                out.append(GpuHealthReading(gpu=index, errors=(f"health: wedged: {error}",)))
            elif isinstance(error, DeadlineExceeded):
                out.append(GpuHealthReading(gpu=index, errors=("health: timeout",)))
            elif error is not None and getattr(error, "value", None) == self.nv.NVML_ERROR_GPU_IS_LOST:
                out.append(GpuHealthReading(gpu=index, lost=True))
            else:
                out.append(GpuHealthReading(gpu=index, errors=(f"health: {type(error).__name__}: {error}",)))
        return out

    def _read_one(self, handle: Any, index: int) -> GpuHealthReading:
        """Every health read of one GPU, on its worker. A lost GPU raises (read() says lost)."""
        nv = self.nv
        unsupported = self._unsupported.setdefault(index, set())
        errors: list[str] = []

        def ask(feature: str, fn: Any, *args: Any) -> Any:
            if feature in unsupported:
                return None
            try:
                return fn(handle, *args)
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == nv.NVML_ERROR_GPU_IS_LOST:
                    raise
                if code == nv.NVML_ERROR_NOT_SUPPORTED:
                    unsupported.add(feature)
                else:
                    errors.append(f"{feature}: {type(exc).__name__.removeprefix('NVMLError_')}")
                return None

        corrected = ask("ecc", nv.nvmlDeviceGetTotalEccErrors, 0, 0)  # CORRECTED, VOLATILE
        uncorrected = ask("ecc", nv.nvmlDeviceGetTotalEccErrors, 1, 0)  # UNCORRECTED, VOLATILE
        pending = ask("retired_pages", nv.nvmlDeviceGetRetiredPagesPendingStatus)
        remap = ask("remap", nv.nvmlDeviceGetRemappedRows)
        reasons_fn = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        reasons = ask("throttle", reasons_fn)
        gen = ask("pcie_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration)
        gen_max = ask("pcie_gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration)
        width = ask("pcie_width", nv.nvmlDeviceGetCurrPcieLinkWidth)
        width_max = ask("pcie_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth)
        crc, replay, recovery, down = self._nvlink(handle, index, ask, unsupported, errors)
        fabric_state, fabric_status = self._fabric(ask)
        return GpuHealthReading(
            gpu=index,
            pci_bus_id=self._bus(index),
            ecc_volatile_corrected=int(corrected) if corrected is not None else None,
            ecc_volatile_uncorrected=int(uncorrected) if uncorrected is not None else None,
            retired_pages_pending=bool(pending) if pending is not None else None,
            remap_pending=bool(remap[2]) if remap is not None else None,
            remap_failure=bool(remap[3]) if remap is not None else None,
            nvlink_crc_errors=crc,
            nvlink_replay_errors=replay,
            nvlink_recovery_errors=recovery,
            nvlink_links_down=down,
            throttle_reasons=int(reasons) if reasons is not None else None,
            pcie_gen=int(gen) if gen is not None else None,
            pcie_gen_max=int(gen_max) if gen_max is not None else None,
            pcie_width=int(width) if width is not None else None,
            pcie_width_max=int(width_max) if width_max is not None else None,
            fabric_state=fabric_state,
            fabric_status=fabric_status,
            errors=tuple(errors),
        )

    def _bus(self, index: int) -> str | None:
        for info in self.source.gpus():
            if info.gpu == index:
                return info.pci_bus_id
        return None

    def _nvlink(
        self, handle: Any, index: int, ask: Any, unsupported: set[str], errors: list[str]
    ) -> tuple[int | None, int | None, int | None, tuple[int, ...]]:
        """Error counters summed over the links that exist, and links down that were up at first.

        The links are probed once per GPU: the first link NVML refuses (InvalidArgument or
        NotSupported past link 0) is the board's link count; NotSupported on link 0 is a board without
        NVLink (never asked again)."""
        nv = self.nv
        if "nvlink" in unsupported:
            return None, None, None, ()
        count = self._link_count.get(index)
        states: dict[int, bool] = {}
        for link in range(
            count if count is not None else int(getattr(nv, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS))
        ):
            try:
                states[link] = bool(nv.nvmlDeviceGetNvLinkState(handle, link))
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == nv.NVML_ERROR_GPU_IS_LOST:
                    raise
                if count is None and code in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                    if link == 0:
                        unsupported.add("nvlink")
                        return None, None, None, ()
                    break
                errors.append(f"nvlink_state: {type(exc).__name__.removeprefix('NVMLError_')}")
        if count is None:
            self._link_count[index] = len(states)
        if not states:
            return None, None, None, ()
        first = self._links_up.setdefault(index, tuple(link for link, up in states.items() if up))
        down = tuple(link for link in first if not states.get(link, False))
        totals: dict[int, int] = {}
        for link, up in states.items():
            if not up:
                continue
            for counter in (0, 1, 2, 3):  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA
                value = ask(f"nvlink_counter_{counter}", nv.nvmlDeviceGetNvLinkErrorCounter, link, counter)
                if value is not None:
                    totals[counter] = totals.get(counter, 0) + int(value)
        crc = totals.get(2, 0) + totals.get(3, 0) if (2 in totals or 3 in totals) else None
        return crc, totals.get(0), totals.get(1), down

    def _fabric(self, ask: Any) -> tuple[int | None, int | None]:
        nv = self.nv
        struct = getattr(nv, "c_nvmlGpuFabricInfo_t", None)
        if struct is None or not hasattr(nv, "nvmlDeviceGetGpuFabricInfo"):
            return None, None
        info = struct()
        arg = ctypes.byref(info) if isinstance(info, ctypes.Structure) else info
        if ask("fabric", nv.nvmlDeviceGetGpuFabricInfo, arg) is None:  # unsupported or failed
            return None, None
        return int(info.state), int(info.status)

    # -- events --------------------------------------------------------------------------------------

    def _start_events(self) -> None:
        nv = self.nv
        try:
            self._set = self.source.library_call(nv.nvmlEventSetCreate)
            registered = 0
            for index, value, error in self.source.per_gpu(self._register):
                if error is None and value:
                    self._handles[_key(value)] = index
                    registered += 1
            if registered == 0:
                self.event_problem = "no GPU supports Xid events"
                return
        except (DeadlineExceeded, nv.NVMLError, AttributeError) as e:
            self.event_problem = f"event set: {type(e).__name__}: {e}"
            return
        self._thread = threading.Thread(target=self._wait_loop, name="nvml-events", daemon=True)
        self._thread.start()

    def _register(self, handle: Any, index: int) -> Any:
        nv = self.nv
        supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
        wanted = int(supported) & _WANTED_EVENTS
        if not wanted:
            return None
        nv.nvmlDeviceRegisterEvents(handle, wanted, self._set)
        return handle

    def _wait_loop(self) -> None:
        nv = self.nv
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._set, self.wait_ms)
            except nv.NVMLError as e:
                if getattr(e, "value", None) == nv.NVML_ERROR_TIMEOUT:
                    continue
                self.event_problem = f"event wait: {type(e).__name__}"
                self._stop.wait(self.wait_ms / 1000.0)  # never spin on a failing wait
                continue
            self._queue_event(data)

    def _queue_event(self, data: Any) -> None:
        gpu = self._handles.get(_key(data.device))
        kind_bits = int(data.eventType)
        at = float(self._clock())
        bus = self._bus(gpu) if gpu is not None else None
        if kind_bits & _XID_CRITICAL:
            event = HardwareEvent(FaultKind.XID, FaultSource.NVML_EVENT, at, gpu, bus, int(data.eventData))
        elif kind_bits & _DOUBLE_BIT_ECC:
            event = HardwareEvent(
                FaultKind.ECC_UNCORRECTABLE, FaultSource.NVML_EVENT, at, gpu, bus, text="double-bit ECC error"
            )
        elif kind_bits & _GPU_UNAVAILABLE:
            event = HardwareEvent(
                FaultKind.GPU_LOST, FaultSource.NVML_EVENT, at, gpu, bus, text="GPU unavailable"
            )
        else:
            return
        with self._lock:
            if len(self._queue) == self._queue.maxlen:
                self.events_dropped += 1
            self._queue.append(event)
            self.events_total += 1

    def events(self) -> list[HardwareEvent]:
        with self._lock:
            out = list(self._queue)
            self._queue.clear()
        return out

    def status(self) -> dict[str, object]:
        return {
            "events": self._thread is not None and self._thread.is_alive(),
            "event_problem": self.event_problem,
            "events_total": self.events_total,
            "events_dropped_total": self.events_dropped,
            "unsupported": {str(g): sorted(s) for g, s in self._unsupported.items() if s},
        }

    def close(self) -> None:
        """Stop the event thread (within one wait) and free the event set; the source stays open."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self.wait_ms / 1000.0 + 1.0)
        if self._set is not None and not (thread is not None and thread.is_alive()):
            with contextlib.suppress(Exception):
                self.source.library_call(self.nv.nvmlEventSetFree, self._set)
            self._set = None


def _key(handle: Any) -> Any:
    """A hashable identity for an NVML device handle (a ctypes pointer's address, or the handle)."""
    value = getattr(handle, "value", None)
    return value if value is not None else handle


__all__ = ["NvmlHealthReader"]
