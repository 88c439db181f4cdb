"""NVML behind one small interface: the real library (:mod:`.real`), and a recorded file with
the recorder that makes one (:mod:`.recorded`).

The agent's code talks only to an :class:`~collector.nvml.backend.NvmlBackend`: answers are
plain JSON values, and failures are :class:`~collector.nvml.backend.NvmlError` with NVML's
return code. In the agent, only :mod:`collector.nvml.real` imports ``pynvml``; outside it,
the NVML stand-in library (:mod:`testbed.nvml.fakelib`) imports it too, to put itself where
``libnvidia-ml`` would be, and the tests of the real path import it to check its structs.
"""

from gpuwarden.collector.nvml.backend import (
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
