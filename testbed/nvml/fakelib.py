"""A stand-in for libnvidia-ml under pynvml, answering from a gpuwarden-nvml/1 recording.

pynvml (nvidia-ml-py) wraps each C function of libnvidia-ml: it builds the arguments as ctypes
objects (structs, arrays, ``byref`` pointers), calls the function it looked up in the loaded
library, and turns a non-zero return code into an ``NVMLError``. :func:`installed` puts a
:class:`FakeLibrary` where pynvml keeps the loaded library. Its functions take those same
ctypes arguments, fill the output structs as NVML documents (a two-call size negotiation for
processes, per-field return codes, ``TIMEOUT`` from an empty event wait, ``INSUFFICIENT_SIZE``,
``ARGUMENT_VERSION_MISMATCH``) and return NVML return codes, answering from a recording.

With it, the real path, pynvml's own wrappers and structs and
:class:`collector.nvml.real.PynvmlBackend`'s adapters on top, runs where there is no GPU,
and a test can check that it turns a recording's answers into what the recorded backend
gives. What it does not cover: the C calling convention (arguments never cross into C), the
driver's timing, and anything the recording does not hold. It is a fake: every result
obtained through it is as CONSTRUCTED or as recorded as the recording it answers from.

The recording advances when its :meth:`~collector.nvml.recorded.RecordedBackend.begin_cycle`
is called (the real backend's own ``begin_cycle`` does nothing), so a test calls it before
each collection cycle.
"""

# ruff: noqa: N802  (the methods are named after libnvidia-ml's C functions, which pynvml looks up)
from __future__ import annotations

import ctypes
import functools
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from gpuwarden.collector.nvml.backend import (
    ERROR_GPU_IS_LOST,
    ERROR_NAMES,
    ERROR_NO_DATA,
    ERROR_NOT_READY,
    ERROR_NOT_SUPPORTED,
    ERROR_UNKNOWN,
    NvmlError,
)
from gpuwarden.collector.nvml.recorded import RecordedBackend

SUCCESS = 0
INVALID_ARGUMENT = 2
INSUFFICIENT_SIZE = 7
TIMEOUT = 10
ARGUMENT_VERSION_MISMATCH = 25
NOT_AVAILABLE_ULL = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as unsigned long long
VALUE_DOUBLE, VALUE_ULL, VALUE_SLL = 0, 3, 4  # nvmlValueType_t
DEVICE_BASE = 0x1000  # handle of GPU i: this address plus i (never dereferenced)
GPM_METRICS_GET_VERSION = 1
FUNCTION_NOT_FOUND = 13
MEMORY_V2 = 40 | 2 << 24  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
FABRIC_INFO_V2 = 36 | 2 << 24  # nvmlGpuFabricInfo_v2: sizeof(nvmlGpuFabricInfo_v2_t) | 2 << 24


# Functions that answer one number through their last argument, a pointer, and take an enum
# (clock, sensor, counter) before it or nothing: the recorded call has the same name.
SCALARS = (
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPersistenceMode",
)


def _obj(ref: Any) -> Any:
    """The ctypes object behind a ``byref()`` argument."""
    return getattr(ref, "_obj", ref)


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def _set_pointer(out: Any, address: int) -> None:
    """Writes ``address`` into a ctypes pointer object (a handle NVML hands out)."""
    value = ctypes.c_void_p(address)
    ctypes.memmove(ctypes.addressof(out), ctypes.addressof(value), ctypes.sizeof(value))


def _function(library: FakeLibrary, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def function(*args: Any) -> Any:
        started = time.process_time()
        try:
            library.calls[name] += 1
            errors = library.errors
            if errors:
                device = None
                if args and isinstance(args[0], ctypes._Pointer):
                    device = _address(args[0]) - DEVICE_BASE
                code = errors.get((name, device), errors.get((name, None)))
                if code is not None:
                    return code
            return method(*args)
        finally:
            library.own_cpu_s += time.process_time() - started

    function.__name__ = name
    return function


class FakeLibrary:
    """libnvidia-ml's functions, as pynvml looks them up, answering from ``recording``.

    ``missing``: names of C functions this "driver" lacks (pynvml then raises
    FUNCTION_NOT_FOUND, or its version-mismatch error for unversioned wrappers), to play an
    older driver. ``init_error``: the return code of ``nvmlInitWithFlags`` (0 = it starts).
    ``errors``: ``{(function, device index or None for any): return code}``, failures to
    inject; a test may change it between cycles."""

    def __init__(
        self,
        recording: RecordedBackend,
        missing: Iterable[str] = (),
        init_error: int = 0,
        errors: dict[tuple[str, int | None], int] | None = None,
    ) -> None:
        self.recording = recording
        self.provenance = recording.provenance or "constructed"  # never "real"
        self.missing = frozenset(missing)
        self.init_error = init_error
        self.errors = dict(errors or {})
        self._samples: dict[int, int] = {}  # GPM sample address -> device index
        self.allocated: set[int] = set()  # GPM samples allocated and not yet freed
        self.calls: Counter[str] = Counter()  # how often each function was called
        # CPU spent inside this library: what the real driver would spend instead, so a
        # benchmark subtracts it to see what the agent's own Python costs on a real node
        self.own_cpu_s = 0.0
        self._next = itertools.count(0x100000)
        # plain functions, not bound methods: pynvml sets attributes on some (``restype``)
        self._functions: dict[str, Callable[..., Any]] = {
            name[2:]: _function(self, name[2:], getattr(self, name))
            for name in dir(type(self))
            if name.startswith("c_nvml")
        }
        for name in SCALARS:
            self._functions[name] = _function(self, name, functools.partial(self._scalar, name))

    def __getattr__(self, name: str) -> Any:
        # pynvml reads functions as attributes of the loaded library (ctypes.CDLL)
        function = self.__dict__.get("_functions", {}).get(name)
        if function is None or name in self.__dict__.get("missing", ()):
            raise AttributeError(name)
        return function

    # -- helpers --------------------------------------------------------------------------

    def _ask(self, device: int | None, name: str, *args: Any) -> tuple[int, Any]:
        try:
            return SUCCESS, self.recording.call(device, name, *args)
        except NvmlError as exc:
            if exc.code == ERROR_NOT_READY:  # gpuwarden's own code: NVML says "no data"
                return ERROR_NO_DATA, None
            return (exc.code if exc.code < 1000 else ERROR_UNKNOWN), None

    def _scalar(self, name: str, handle: Any, *rest: Any) -> int:
        """A function of :data:`SCALARS`: ``(handle, [enum,] out)``."""
        *enums, out = rest
        code, value = self._ask(self._index(handle), name, *(int(e.value) for e in enums))
        if code == SUCCESS:
            _obj(out).value = value
        return code

    @staticmethod
    def _index(handle: Any) -> int:
        return _address(handle) - DEVICE_BASE

    # -- system ---------------------------------------------------------------------------

    def c_nvmlInitWithFlags(self, flags: int) -> int:
        return self.init_error

    def c_nvmlShutdown(self) -> int:
        return SUCCESS

    def c_nvmlErrorString(self, code: int) -> bytes:
        return f"NVML_ERROR_{ERROR_NAMES.get(int(code), str(code))}".encode()

    def c_nvmlDeviceGetCount_v2(self, out: Any) -> int:
        code, count = self._ask(None, "nvmlDeviceGetCount")
        if code == SUCCESS:
            _obj(out).value = count
        return code

    def c_nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> int:
        code, version = self._ask(None, "nvmlSystemGetDriverVersion")
        if code == SUCCESS:
            buffer.value = str(version).encode()
        return code

    # -- devices --------------------------------------------------------------------------

    def c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        _set_pointer(_obj(out), DEVICE_BASE + int(index.value))
        return SUCCESS

    def c_nvmlDeviceGetIndex(self, handle: Any, out: Any) -> int:
        _obj(out).value = self._index(handle)
        return SUCCESS

    def _text(self, handle: Any, buffer: Any, name: str) -> int:
        code, text = self._ask(self._index(handle), name)
        if code == SUCCESS:
            buffer.value = str(text).encode()
        return code

    def c_nvmlDeviceGetUUID(self, handle: Any, buffer: Any, size: Any) -> int:
        return self._text(handle, buffer, "nvmlDeviceGetUUID")

    def c_nvmlDeviceGetName(self, handle: Any, buffer: Any, size: Any) -> int:
        return self._text(handle, buffer, "nvmlDeviceGetName")

    def c_nvmlDeviceGetSerial(self, handle: Any, buffer: Any, size: Any) -> int:
        return self._text(handle, buffer, "nvmlDeviceGetSerial")

    def c_nvmlDeviceGetVbiosVersion(self, handle: Any, buffer: Any, size: Any) -> int:
        return self._text(handle, buffer, "nvmlDeviceGetVbiosVersion")

    def _pair(self, name: str, handle: Any, current: Any, pending: Any) -> int:
        code, pair = self._ask(self._index(handle), name)
        if code == SUCCESS:
            _obj(current).value, _obj(pending).value = pair
        return code

    def c_nvmlDeviceGetEccMode(self, handle: Any, current: Any, pending: Any) -> int:
        return self._pair("nvmlDeviceGetEccMode", handle, current, pending)

    def c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        return self._pair("nvmlDeviceGetMigMode", handle, current, pending)

    def c_nvmlDeviceGetPciInfo_v3(self, handle: Any, out: Any) -> int:
        code, bus_id = self._ask(self._index(handle), "nvmlDeviceGetPciInfo")
        if code == SUCCESS:
            _obj(out).busId = str(bus_id).encode()
        return code

    def c_nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, out: Any) -> int:
        # the pre-R535 name of nvmlDeviceGetCurrentClocksEventReasons (later drivers keep it)
        return self._scalar("nvmlDeviceGetCurrentClocksEventReasons", handle, out)

    def c_nvmlDeviceGetUtilizationRates(self, handle: Any, out: Any) -> int:
        code, util = self._ask(self._index(handle), "nvmlDeviceGetUtilizationRates")
        if code == SUCCESS:
            _obj(out).gpu, _obj(out).memory = util
        return code

    def c_nvmlDeviceGetMemoryInfo(self, handle: Any, out: Any) -> int:
        """v1: ``used`` counts the driver's reserve (a v2 recording's used + reserved)."""
        code, memory = self._ask(self._index(handle), "nvmlDeviceGetMemoryInfo")
        if code == SUCCESS:
            total, used = memory[0], sum(memory[1:])
            _obj(out).total, _obj(out).used, _obj(out).free = total, used, total - used
        return code

    def c_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, out: Any) -> int:
        """v2, where the recording holds ``[total, used, reserved]``; a recording of v1's two
        numbers was made where the driver had no v2: function not found."""
        if int(_obj(out).version) != MEMORY_V2:
            return ARGUMENT_VERSION_MISMATCH
        code, memory = self._ask(self._index(handle), "nvmlDeviceGetMemoryInfo")
        if code == SUCCESS:
            if len(memory) != 3:
                return FUNCTION_NOT_FOUND
            m = _obj(out)
            m.total, m.used, m.reserved = memory
            m.free = m.total - m.used - m.reserved
        return code

    def _fabric(self, handle: Any, out: Any, versioned: bool) -> int:
        """Both fabric-info functions. The recording holds ``[state, status, mask]``; a mask
        of None was recorded where only the unversioned function worked, so the versioned
        one answers a version mismatch. The state byte is written with dirty padding after
        it (nvml.h declares it an unsigned char; pynvml reads four bytes)."""
        info = _obj(out)
        if versioned and int(info.version) != FABRIC_INFO_V2:
            return ARGUMENT_VERSION_MISMATCH
        code, answer = self._ask(self._index(handle), "nvmlDeviceGetGpuFabricInfo")
        if code != SUCCESS:
            return code
        state, status, mask = answer
        if versioned and mask is None:
            return ARGUMENT_VERSION_MISMATCH
        info.state = state | 0x5A5A00
        info.status, info.cliqueId = status, 1
        if versioned:
            info.healthMask = mask
        return SUCCESS

    def c_nvmlDeviceGetGpuFabricInfoV(self, handle: Any, out: Any) -> int:
        return self._fabric(handle, out, versioned=True)

    def c_nvmlDeviceGetGpuFabricInfo(self, handle: Any, out: Any) -> int:
        return self._fabric(handle, out, versioned=False)

    def c_nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> int:
        array = _obj(values)
        n = int(count.value)
        if n < 0 or n > len(array):
            return INVALID_ARGUMENT
        request = tuple((int(array[i].fieldId), int(array[i].scopeId)) for i in range(n))
        code, answers = self._ask(self._index(handle), "nvmlDeviceGetFieldValues", request)
        if code != SUCCESS:
            return code
        for i, (ret, value) in enumerate(answers):
            field = array[i]
            field.nvmlReturn = ret
            if ret != SUCCESS:
                continue
            if isinstance(value, float):
                field.valueType, field.value.dVal = VALUE_DOUBLE, value
            elif int(value) < 0:
                field.valueType, field.value.sllVal = VALUE_SLL, int(value)
            else:
                field.valueType, field.value.ullVal = VALUE_ULL, int(value)
        return SUCCESS

    def _processes(self, handle: Any, count: Any, infos: Any) -> int:
        code, procs = self._ask(self._index(handle), "nvmlDeviceGetComputeRunningProcesses")
        if code != SUCCESS:
            return code
        size = _obj(count)
        if infos is None or size.value < len(procs):  # the size query, or too small a buffer
            size.value = len(procs)
            return INSUFFICIENT_SIZE if procs else SUCCESS
        for i, (pid, used) in enumerate(procs):
            infos[i].pid = pid
            infos[i].usedGpuMemory = NOT_AVAILABLE_ULL if used is None else used
        size.value = len(procs)
        return SUCCESS

    def c_nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, n: Any, infos: Any) -> int:
        return self._processes(handle, n, infos)

    def c_nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any, n: Any, infos: Any) -> int:
        return self._processes(handle, n, infos)

    # -- GPM ------------------------------------------------------------------------------

    def _gpm_recorded(self, device: int) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return self.recording.answers_of(device, "nvmlGpmMetricsGet")

    def c_nvmlGpmQueryDeviceSupport(self, handle: Any, out: Any) -> int:
        support = _obj(out)
        if support.version != 1:
            return ARGUMENT_VERSION_MISMATCH
        answers = self._gpm_recorded(self._index(handle))
        codes = {answer.get("e") for _, answer in answers}
        if ERROR_GPU_IS_LOST in codes:
            return ERROR_GPU_IS_LOST
        support.isSupportedDevice = int(bool(answers) and codes != {ERROR_NOT_SUPPORTED})
        return SUCCESS

    def c_nvmlGpmSampleAlloc(self, out: Any) -> int:
        address = next(self._next)
        self.allocated.add(address)
        _set_pointer(_obj(out), address)
        return SUCCESS

    def c_nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        self._samples[_address(sample)] = self._index(handle)
        return SUCCESS

    def c_nvmlGpmSampleFree(self, sample: Any) -> int:
        address = _address(sample)
        if address not in self.allocated:
            return INVALID_ARGUMENT  # freed twice, or never allocated
        self.allocated.discard(address)
        self._samples.pop(address, None)
        return SUCCESS

    def c_nvmlGpmMetricsGet(self, out: Any) -> int:
        request = _obj(out)
        if request.version != GPM_METRICS_GET_VERSION:
            return ARGUMENT_VERSION_MISMATCH
        first = self._samples.get(_address(request.sample1))
        device = self._samples.get(_address(request.sample2))
        if device is None or first != device or request.numMetrics > len(request.metrics):
            return INVALID_ARGUMENT
        ids = tuple(int(request.metrics[i].metricId) for i in range(request.numMetrics))
        code, answers = self._ask(device, "nvmlGpmMetricsGet", ids)
        if code != SUCCESS:
            return code
        for i, (ret, value) in enumerate(answers):
            request.metrics[i].nvmlReturn = ret
            request.metrics[i].value = value if ret == SUCCESS else 0.0
        return SUCCESS

    # -- events ---------------------------------------------------------------------------

    def c_nvmlEventSetCreate(self, out: Any) -> int:
        _set_pointer(_obj(out), next(self._next))
        return SUCCESS

    def c_nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        return SUCCESS

    def c_nvmlEventSetFree(self, event_set: Any) -> int:
        return SUCCESS

    def c_nvmlEventSetWait_v2(self, event_set: Any, out: Any, timeout_ms: Any) -> int:
        event = self.recording.call(None, "nvmlEventSetWait", int(timeout_ms.value))
        if event is None:
            return TIMEOUT
        index, event_type, data = event
        _set_pointer(_obj(out).device, DEVICE_BASE + int(index))
        _obj(out).eventType, _obj(out).eventData = event_type, data
        return SUCCESS


@contextmanager
def installed(library: FakeLibrary) -> Iterator[FakeLibrary]:
    """pynvml answers from ``library`` inside the block (its loaded library and its cache of
    looked-up functions are swapped, and put back after)."""
    import pynvml

    saved = pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache)
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield library
    finally:
        pynvml.nvmlLib = saved[0]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved[1])
