"""The real NVML, through ``pynvml`` (nvidia-ml-py). The only module that imports it.

Each supported call is a small adapter from the ``pynvml`` function to the plain answer shape
of :mod:`collector.nvml.backend`. ``pynvml.NVMLError`` becomes :class:`NvmlError` with the same
code; a function the installed binding or driver lacks becomes ``ERROR_FUNCTION_NOT_FOUND``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import struct
import threading
from collections.abc import Callable
from typing import Any

from gpuwarden.collector.nvml.backend import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_NOT_READY,
    ERROR_NOT_SUPPORTED,
    ERROR_UNINITIALIZED,
    EVENT_XID_CRITICAL,
    NvmlError,
)

log = logging.getLogger(__name__)
# what a driver without a versioned struct answers for it
_NO_VERSION = (ERROR_FUNCTION_NOT_FOUND, ERROR_NOT_SUPPORTED, ERROR_ARGUMENT_VERSION_MISMATCH)


def _text(value: Any) -> str:
    """A C string from the driver as text; bytes that are not UTF-8 (a board's EEPROM can hold
    anything) become U+FFFD rather than failing the call."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# c_nvmlFieldValue_t (nvml.h): fieldId u32, scopeId u32, timestamp i64, latencyUsec i64,
# valueType i32, nvmlReturn i32, value (an 8-byte union): 40 bytes, no padding. A request's
# array is unpacked from its bytes in one call, the union read as an unsigned 64-bit number
# (the array starts zeroed, so a 4- or 2-byte member reads as itself) and converted only where
# its type says so. Going through pynvml's struct wrapper instead costs a Python-level
# __getattribute__/__setattr__ per field and member: about 5 ms of CPU per cycle on an 8-GPU
# node with 18 NVLinks each, against ~0.1 ms this way (measured on the stand-in library).
_FIELD = "IIqqiiQ"
_FIELD_SIZE = struct.calcsize("=" + _FIELD)
_FIELD_OFFSETS = {"fieldId": 0, "scopeId": 4, "valueType": 24, "nvmlReturn": 28, "value": 32}
_AS_DOUBLE = struct.Struct("=d")
_AS_U64 = struct.Struct("=Q")
_CONVERT: dict[int, Any] = {  # nvmlValueType_t other than unsigned long long (3)
    0: lambda q: _AS_DOUBLE.unpack(_AS_U64.pack(q))[0],  # double
    1: lambda q: q & 0xFFFFFFFF,  # unsigned int
    2: lambda q: q if ctypes.sizeof(ctypes.c_ulong) == 8 else q & 0xFFFFFFFF,  # unsigned long
    4: lambda q: q - (1 << 64) if q >> 63 else q,  # signed long long
    5: lambda q: (q & 0xFFFFFFFF) - (1 << 32) if q & 0x80000000 else q & 0xFFFFFFFF,  # int
    6: lambda q: q & 0xFFFF,  # unsigned short
}


def _decode_fields(flat: tuple[int, ...]) -> list[tuple[int, Any]]:
    """``(return code, value)`` per field from the flat unpacked array (7 numbers a field)."""
    out: list[tuple[int, Any]] = []
    append = out.append
    for kind, code, raw in zip(flat[4::7], flat[5::7], flat[6::7], strict=True):
        if code:
            append((code, None))
        elif kind == 3:
            append((0, raw))
        else:
            convert = _CONVERT.get(kind)
            append((0, convert(raw) if convert else None))
    return out


def _fast_fields_possible(nv: Any) -> bool:
    """Whether pynvml's field struct has the layout :data:`_FIELD` reads, and the
    function lookup the fast path calls is there (else pynvml's own wrapper is used)."""
    struct_type = getattr(nv, "c_nvmlFieldValue_t", None)
    if struct_type is None or not hasattr(nv, "_nvmlGetFunctionPointer"):
        return False
    if ctypes.sizeof(struct_type) != _FIELD_SIZE:
        return False
    return all(getattr(struct_type, f).offset == o for f, o in _FIELD_OFFSETS.items())


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

    #: NVML is thread-safe, and some calls wait in the driver (the PCIe throughput's 20 ms
    #: sample): the NVML source may make those at the same time (:class:`PcieSampler`)
    concurrent_calls = True

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self._gpm_prev: dict[int, Any] = {}
        self._event_set: Any = None
        self._fast_fields = False
        self._provenance = ""
        self._gpm_supported: dict[int, bool] = {}
        self._memory_v2: bool | None = None  # None: not tried yet
        self._field_requests: dict[Any, tuple[Any, bytes, struct.Struct]] = {}
        self._lock = threading.Lock()

    def init(self) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlError(int(exc.value), "nvmlInit") from exc
        self._nv = pynvml
        self._fast_fields = _fast_fields_possible(pynvml)
        self._provenance = str(getattr(pynvml.nvmlLib, "provenance", ""))

    @property
    def provenance(self) -> str:
        """Empty for the driver; a stand-in library's (``constructed``, or its recording's),
        so a recording made through one is never labelled real. Kept after shutdown."""
        return self._provenance

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
        self._gpm_supported.clear()
        self._field_requests.clear()
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
        nv = self._nv
        h = self._handle(device)
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None and self._memory_v2 is not False:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=version)
            except nv.NVMLError as exc:  # a driver without v2; any other failure is real
                if int(exc.value) not in _NO_VERSION:
                    raise
                self._memory_v2 = False
            else:
                self._memory_v2 = True
                return [int(m.total), int(m.used), int(m.reserved)]
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return [int(m.total), int(m.used)]

    def _field_values(self, device: int, ids: Any) -> list[Any]:
        nv = self._nv
        if not self._fast_fields:
            values = nv.nvmlDeviceGetFieldValues(self._handle(device), [tuple(i) for i in ids])
            return [_field_value(v) for v in values]
        key = ids if isinstance(ids, tuple) else tuple(tuple(i) for i in ids)
        request = self._field_requests.get(key)
        if request is None:  # built once per distinct request: array type, ids, layout
            layout = struct.Struct("=" + _FIELD * len(key))
            ids_only = layout.pack(*(x for fid, scope in key for x in (fid, scope, 0, 0, 0, 0, 0)))
            request = (nv.c_nvmlFieldValue_t * len(key), ids_only, layout)
            self._field_requests[key] = request
        array_type, ids_only, layout = request
        values = array_type.from_buffer_copy(ids_only)
        fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        ret = fn(self._handle(device), ctypes.c_int32(len(key)), ctypes.byref(values))
        if ret != 0:
            raise nv.NVMLError(ret)
        return _decode_fields(layout.unpack(values))

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
        """Clock-event (throttle) reasons: drivers before R535 (and bindings before 12.535)
        have only the function's old name, "throttle reasons"."""
        nv, h = self._nv, self._handle(device)
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is not None:
            try:
                return int(fn(h))
            except nv.NVMLError_FunctionNotFound:
                pass
        return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))

    def _gpm(self, device: int, metric_ids: tuple[int, ...]) -> list[list[Any]]:
        nv = self._nv
        h = self._handle(device)
        supported = self._gpm_supported.get(device)
        if supported is None:  # asked once: a GPU's support does not change
            supported = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            self._gpm_supported[device] = supported
        if not supported:
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

    def _fabric(self, device: int) -> list[Any]:
        """``[state, status, health mask]`` from ``nvmlDeviceGetGpuFabricInfoV`` (v2 struct),
        else ``[state, status, None]`` from the unversioned function of older drivers."""
        nv, h = self._nv, self._handle(device)
        info, mask = None, None
        versioned = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
        if versioned is not None and hasattr(nv, "nvmlDeviceGetGpuFabricInfoV"):
            info = versioned()
            try:
                nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
                mask = int(info.healthMask)
            except nv.NVMLError as exc:
                if int(exc.value) not in (
                    ERROR_FUNCTION_NOT_FOUND,
                    ERROR_ARGUMENT_VERSION_MISMATCH,
                ):
                    raise
                info = None
        if info is None:
            plain = getattr(nv, "c_nvmlGpuFabricInfo_t", None)
            if plain is None:
                raise NvmlError(ERROR_FUNCTION_NOT_FOUND, "nvmlDeviceGetGpuFabricInfo")
            info = plain()
            nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
        # nvml.h declares the state an unsigned char; pynvml reads 4 bytes there, and the
        # other three are the struct's padding, which the driver need not clear
        state = int(info.state) & 0xFF
        if state == 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: not on an NVLink fabric
            raise NvmlError(ERROR_NOT_SUPPORTED, f"nvmlDeviceGetGpuFabricInfo[{device}]")
        return [state, int(info.status), mask]

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
        return _text(value)
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
    "nvmlDeviceGetGpuFabricInfo": PynvmlBackend._fabric,
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
