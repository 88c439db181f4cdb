"""The NVML backend interface every implementation answers.

A backend answers *calls*: an NVML function name (as ``pynvml`` spells it, e.g.
``nvmlDeviceGetPowerUsage``), the device index (``None`` for system calls) and plain arguments.
Answers are JSON values (numbers, strings, lists) so a recording can hold them, and every
failure is an :class:`NvmlError` carrying NVML's return code, so "not supported" (3), "GPU is
lost" (15) and "function not found" (13) are told apart the same way for the real library and
for a recording.

Calls whose real form is awkward are given a plain shape here:

* ``nvmlDeviceGetFieldValues(ids)``: ``ids`` is a list of ``[field_id, scope_id]``; the answer
  is one ``[return_code, value]`` per id (NVML reports success per field).
* ``nvmlGpmMetricsGet(metric_ids)``: GPM needs two samples; the backend keeps the previous one
  per device and answers the metrics over the interval between calls; the first call raises
  ``ERROR_NOT_READY`` (gpuwarden's own code), so those fields are left out once.
* ``nvmlEventSetWait(timeout_ms)``: waits for a critical-XID event on any device and answers
  ``[device_index, event_type, event_data]`` or ``None`` on timeout.
* ``nvmlDeviceGetMemoryInfo()``: ``[total, used, reserved]`` from the v2 struct, where ``used``
  leaves out the driver's own reserve as nvidia-smi and DCGM do; ``[total, used]`` from v1
  (``used`` then includes the reserve: 1.57 GB against v2's 0.93 GB on a REAL idle-ish H200,
  driver 580.159.04) where the driver or binding has no v2.
* ``nvmlDeviceGetGpuFabricInfo()``: ``[state, status, health_mask]`` from
  ``nvmlDeviceGetGpuFabricInfoV`` (``health_mask`` None where only the unversioned function
  exists); a GPU outside an NVLink fabric raises ``ERROR_NOT_SUPPORTED``.
"""

from __future__ import annotations

from typing import Any, Protocol

# NVML return codes (nvml.h, nvmlReturn_t)
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_NO_DATA = 21
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999
ERROR_NOT_READY = 1000  # gpuwarden's own: GPM has no previous sample yet

ERROR_NAMES = {
    SUCCESS: "SUCCESS",
    ERROR_UNINITIALIZED: "UNINITIALIZED",
    ERROR_INVALID_ARGUMENT: "INVALID_ARGUMENT",
    ERROR_NOT_SUPPORTED: "NOT_SUPPORTED",
    ERROR_NO_PERMISSION: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    ERROR_NOT_FOUND: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    ERROR_DRIVER_NOT_LOADED: "DRIVER_NOT_LOADED",
    ERROR_TIMEOUT: "TIMEOUT",
    11: "IRQ_ISSUE",
    ERROR_LIBRARY_NOT_FOUND: "LIBRARY_NOT_FOUND",
    ERROR_FUNCTION_NOT_FOUND: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    ERROR_GPU_IS_LOST: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    ERROR_LIB_RM_VERSION_MISMATCH: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    ERROR_NO_DATA: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED",
    ERROR_ARGUMENT_VERSION_MISMATCH: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED",
    27: "NOT_READY (driver)",
    28: "GPU_NOT_FOUND",
    29: "INVALID_STATE",
    ERROR_UNKNOWN: "UNKNOWN",
    ERROR_NOT_READY: "NOT_READY",
}

# What an operator should check when nvmlInit fails with these codes.
INIT_HINTS = {
    ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found: is the NVIDIA driver installed, "
    "and (in a container) is the NVIDIA container toolkit mounting it?",
    ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel module is not loaded (see dmesg, nvidia-smi)",
    ERROR_NO_PERMISSION: "no permission to open /dev/nvidia*: run the agent as root or in the "
    "video group",
    ERROR_LIB_RM_VERSION_MISMATCH: "libnvidia-ml and the loaded kernel module are different "
    "driver versions (a driver upgrade without reboot or module reload)",
}

# Answers that mean "this value is not available here", never an error worth a log line.
UNAVAILABLE = frozenset({ERROR_NOT_SUPPORTED, ERROR_NOT_FOUND, ERROR_NO_DATA, ERROR_NOT_READY})

EVENT_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError


class NvmlError(Exception):
    """An NVML call failed with ``code``; ``call`` names the function and device."""

    def __init__(self, code: int, call: str = "") -> None:
        self.code = code
        self.call = call
        name = ERROR_NAMES.get(code, str(code))
        super().__init__(f"{call}: NVML_ERROR_{name}" if call else f"NVML_ERROR_{name}")


class NvmlBackend(Protocol):
    """What the NVML source needs from NVML. Constructing one opens nothing; ``init`` does."""

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def begin_cycle(self) -> None:
        """Called once at the start of every collection cycle (a recording advances a tick)."""

    def call(self, device: int | None, name: str, *args: Any) -> Any: ...
