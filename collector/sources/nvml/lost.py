"""A GPU that fell off the bus (``NVML_ERROR_GPU_IS_LOST``), and whether it came back.

The first cycle that meets it reports it once: a critical ``gpu_event`` (``gpu_lost``) and a
fast-path finding, naming the job the GPU had at the last look. From then on the GPU costs one
cheap call per cycle (:func:`answers_again`) until it answers, after a reset; the other GPUs
and sources carry on meanwhile.
"""

from __future__ import annotations

import logging

from gpuwarden.collector.nvml.backend import ERROR_GPU_IS_LOST, NvmlBackend, NvmlError
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.events import emit, gpu_event, job_words
from gpuwarden.collector.sources.nvml.poll import Device
from gpuwarden.core.store.lineprotocol import Point

log = logging.getLogger(__name__)


def lost_point(context: SourceContext, dev: Device, call: str, now_ns: int) -> Point:
    """Mark ``dev`` lost; its ``gpu_lost`` event (and the fast-path finding, sent now)."""
    dev.lost = True
    message = f"GPU {dev.index} is lost (NVML_ERROR_GPU_IS_LOST from {call})"
    log.error("%s", message)
    job = context.inventory.jobs.job_at(now_ns - 1, dev.index)  # at the last look
    evidence = {"gpu_uuid": dev.uuid} | job.tags()
    emit(context, "gpu_lost", dev.index, now_ns, message + job_words(job), evidence)
    return gpu_event(
        context,
        event="gpu_lost",
        severity="critical",
        source="nvml",
        now_ns=now_ns,
        gpu=dev.index,
        uuid=dev.uuid,
        job=job,
        fields={"message": message, "fatal_active": True},
    )


def answers_again(backend: NvmlBackend, dev: Device) -> bool:
    """Whether a lost GPU answers again (after a reset); one cheap call per cycle."""
    try:
        backend.call(dev.index, "nvmlDeviceGetUtilizationRates")
    except NvmlError as exc:
        if exc.code == ERROR_GPU_IS_LOST:
            return False
    log.warning("GPU %d answers again after being lost", dev.index)
    dev.lost = False
    return True
