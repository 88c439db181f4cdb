"""NVML behind one small interface: the real library, a recorded file, and a recorder.

Only :mod:`collector.nvml.real` imports ``pynvml``. Everything else (the NVML source, the
tests, the benchmark) talks to an :class:`~collector.nvml.backend.NvmlBackend`, answers are plain
JSON values, and failures are :class:`~collector.nvml.backend.NvmlError` with NVML's return code.
"""

from collector.nvml.backend import (
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_NOT_SUPPORTED,
    NvmlBackend,
    NvmlError,
)

__all__ = [
    "ERROR_FUNCTION_NOT_FOUND",
    "ERROR_GPU_IS_LOST",
    "ERROR_NOT_SUPPORTED",
    "NvmlBackend",
    "NvmlError",
]
