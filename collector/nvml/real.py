"""The real NVML, through ``pynvml`` (nvidia-ml-py). The only module that imports it.

Each supported call is a small adapter from the ``pynvml`` function to the plain answer shape
of :mod:`collector.nvml.backend`. ``pynvml.NVMLError`` becomes :class:`NvmlError` with the same
code; a function the installed binding or driver lacks becomes ``ERROR_FUNCTION_NOT_FOUND``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from collector.nvml.backend import (
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_NOT_READY,
    ERROR_NOT_SUPPORTED,
    ERROR_UNINITIALIZED,
    EVENT_XID_CRITICAL,
    NvmlError,
)

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_value(fv: Any) -> list[Any]:
    """``[return_code, value]`` of one ``c_nvmlFieldValue_t``, decoded by its value type."""
    ret = int(fv.nvmlReturn)
    if ret != 0:
        return [ret, None]
    vt = int(fv.valueType)
    v = fv.value
    value = {0: v.dVal, 1: v.uiVal, 2: v.ulVal, 3: v.ullVal, 4: v.sllVal, 5: v.siVal}.get(vt)
    if vt == 6:  # unsigned short
        value = v.usVal
    return [0, value]


class PynvmlBackend:
    """Answers calls from the driver. Construct freely; ``init`` loads libnvidia-ml."""

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self._gpm_prev: dict[int, Any] = {}
        self._event_set: Any = None
        self._lock = threading.Lock()

    def init(self) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlError(int(exc.value), "nvmlInit") from exc
        self._nv = pynvml

    def shutdown(self) -> None:
        if self._nv is None:
            return
        nv, self._nv = self._nv, None
        if self._event_set is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(self._event_set)
        for sample in self._gpm_prev.values():
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlGpmSampleFree(sample)
        self._gpm_prev.clear()
        self._handles.clear()
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()

    def begin_cycle(self) -> None:
        pass

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._nv.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = handle
        return handle

    def call(self, device: int | None, name: str, *args: Any) -> Any:
        nv = self._nv
        if nv is None:
            raise NvmlError(ERROR_UNINITIALIZED, name)
        adapter = _ADAPTERS.get(name)
        try:
            if adapter is not None:
                return adapter(self, device, *args)
            fn = getattr(nv, name, None)
            if fn is None:
                raise NvmlError(ERROR_FUNCTION_NOT_FOUND, name)
            if device is None:
                return _plain(fn(*args))
            return _plain(fn(self._handle(device), *args))
        except nv.NVMLError as exc:
            raise NvmlError(int(exc.value), f"{name}[{device}]") from exc
        except getattr(nv, "NVMLLibraryMismatchError", ()) as exc:
            # pynvml's unversioned wrappers raise this (not an NVMLError) when the driver
            # lacks the versioned function they call
            raise NvmlError(ERROR_FUNCTION_NOT_FOUND, f"{name}[{device}]: {exc}") from exc

    # -- adapters for calls whose pynvml shape is not plain ---------------------------------

    def _utilization(self, device: int) -> list[int]:
        u = self._nv.nvmlDeviceGetUtilizationRates(self._handle(device))
        return [int(u.gpu), int(u.memory)]

    def _memory(self, device: int) -> list[int]:
        m = self._nv.nvmlDeviceGetMemoryInfo(self._handle(device))
        return [int(m.total), int(m.used)]

    def _field_values(self, device: int, ids: list[tuple[int, int]]) -> list[list[Any]]:
        values = self._nv.nvmlDeviceGetFieldValues(self._handle(device), [tuple(i) for i in ids])
        return [_field_value(v) for v in values]

    def _processes(self, device: int) -> list[list[Any]]:
        """``[[pid, used bytes or None], ...]``: the _v3 call (R510+), else _v2 (R470)."""
        nv, h = self._nv, self._handle(device)
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses_v3(h)
        except nv.NVMLError_FunctionNotFound:
            if not hasattr(nv, "nvmlDeviceGetComputeRunningProcesses_v2"):
                raise
            procs = nv.nvmlDeviceGetComputeRunningProcesses_v2(h)
        return [[int(p.pid), p.usedGpuMemory] for p in procs]

    def _clock_events(self, device: int) -> int:
        h = self._handle(device)
        fn = getattr(self._nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is None:  # bindings before 12.535 name it "throttle reasons"
            fn = self._nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(fn(h))

    def _gpm(self, device: int, metric_ids: tuple[int, ...]) -> list[list[Any]]:
        nv = self._nv
        h = self._handle(device)
        if not nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            raise NvmlError(ERROR_NOT_SUPPORTED, f"nvmlGpmMetricsGet[{device}]")
        sample = nv.nvmlGpmSampleAlloc()
        try:
            nv.nvmlGpmSampleGet(h, sample)
        except nv.NVMLError:
            nv.nvmlGpmSampleFree(sample)  # the driver's memory, not Python's: free it
            raise
        prev = self._gpm_prev.get(device)
        self._gpm_prev[device] = sample
        if prev is None:
            raise NvmlError(ERROR_NOT_READY, f"nvmlGpmMetricsGet[{device}]")
        try:
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(metric_ids)
            req.sample1, req.sample2 = prev, sample
            for i, metric in enumerate(metric_ids):
                req.metrics[i].metricId = metric
            nv.nvmlGpmMetricsGet(req)
            out = []
            for i in range(len(metric_ids)):
                ret = int(req.metrics[i].nvmlReturn)
                out.append([ret, float(req.metrics[i].value) if ret == 0 else None])
            return out
        finally:
            nv.nvmlGpmSampleFree(prev)

    def _event_wait(self, device: int | None, timeout_ms: int) -> list[int] | None:
        nv = self._nv
        with self._lock:
            if self._event_set is None:
                self._event_set = nv.nvmlEventSetCreate()
                for index in range(nv.nvmlDeviceGetCount()):
                    try:
                        nv.nvmlDeviceRegisterEvents(
                            self._handle(index), EVENT_XID_CRITICAL, self._event_set
                        )
                    except nv.NVMLError_NotSupported:
                        continue
                    except nv.NVMLError as exc:  # a lost GPU: the others' events still count
                        log.warning("NVML: no XID events from GPU %d (%s)", index, exc)
        try:
            data = nv.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except nv.NVMLError_Timeout:
            return None
        index = int(nv.nvmlDeviceGetIndex(data.device))
        return [index, int(data.eventType), int(data.eventData)]


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_ADAPTERS: dict[str, Callable[..., Any]] = {
    "nvmlDeviceGetUtilizationRates": PynvmlBackend._utilization,
    "nvmlDeviceGetMemoryInfo": PynvmlBackend._memory,
    "nvmlDeviceGetFieldValues": PynvmlBackend._field_values,
    "nvmlDeviceGetComputeRunningProcesses": PynvmlBackend._processes,
    "nvmlDeviceGetCurrentClocksEventReasons": PynvmlBackend._clock_events,
    "nvmlGpmMetricsGet": PynvmlBackend._gpm,
    "nvmlEventSetWait": PynvmlBackend._event_wait,
    "nvmlDeviceGetName": lambda self, d: _text(self._nv.nvmlDeviceGetName(self._handle(d))),
    "nvmlDeviceGetUUID": lambda self, d: _text(self._nv.nvmlDeviceGetUUID(self._handle(d))),
    "nvmlSystemGetDriverVersion": lambda self, d: _text(self._nv.nvmlSystemGetDriverVersion()),
    "nvmlDeviceGetPciInfo": lambda self, d: _text(
        self._nv.nvmlDeviceGetPciInfo(self._handle(d)).busId
    ),
    "nvmlDeviceGetRemappedRows": lambda self, d: [
        int(x) for x in self._nv.nvmlDeviceGetRemappedRows(self._handle(d))
    ],
}
