"""GPU telemetry from NVML, one concern per module.

* :mod:`.poll`: the calls made for each GPU every cycle and the fields they become;
* :mod:`.xids`: critical XIDs from NVML's event set, on a thread of their own (or polled);
* :mod:`.tagging`: which job and rank each GPU and process belongs to, and their tags;
* :mod:`.lost`: a GPU that fell off the bus, and the probe that notices it came back;
* :mod:`.info`: what each GPU is and how it is set up (``gpu_info``, every ``info_every_s``);
* :mod:`.watch`: faults seen in a GPU's own fields between one cycle and the next;
* :mod:`.source`: :class:`NvmlSource`, which runs them in a cycle.
"""

from gpuwarden.collector.sources.nvml.source import NvmlSource

__all__ = ["NvmlSource"]
