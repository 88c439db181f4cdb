"""Which job each GPU (and each process on it) belongs to, and the tags its points carry.

A GPU point is tagged with the job (and rank) of the process using the most memory on it (see
:mod:`collector.attribution`); where the process names only a Kubernetes pod UID, or the GPU has
no process, the kubelet's pod-resources API names the pod that holds it
(:mod:`collector.podresources`), else the node's job map does. Tag sets are built once per GPU
and job and kept while the job is on the GPU; one not used in a cycle is dropped at its end, so
the thousands of jobs a node sees over months leave nothing behind.
"""

from __future__ import annotations

import time
from typing import Any

from gpuwarden.collector.attribution import NO_JOB, POD_UID_PREFIX, JobInfo, JobResolver
from gpuwarden.collector.podresources import GPU_RESOURCE, PodResources
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.nvml.poll import Device

TagSet = tuple[dict[str, str], list[dict[str, str]]]  # a GPU's tags, each NVLink's tags


class JobTagger:
    def __init__(self, context: SourceContext, settings: dict[str, Any]) -> None:
        self.context = context
        self.jobs = JobResolver(context.procfs, str(settings.get("jobmap_dir", "")))
        self.pods: PodResources | None = None
        if settings.get("pod_resources_socket"):
            self.pods = PodResources(
                str(settings["pod_resources_socket"]),
                refresh_s=float(settings.get("pod_resources_refresh_s", 30.0)),
                resources=settings.get("pod_resources_names", (GPU_RESOURCE,)),
            )
        self._pids: set[int] = set()  # on any GPU in the last cycle
        self._tags: dict[tuple[int, JobInfo], TagSet] = {}  # used in the last cycle
        self._tags_now: dict[tuple[int, JobInfo], TagSet] = {}  # used in this one

    def begin_cycle(self, live: set[int]) -> None:
        """Before tagging a cycle: new processes mean a pod may have started, so the kubelet
        is asked again before its GPUs are tagged."""
        if self.pods is not None:
            self.pods.refresh(changed=live != self._pids)
        self._pids = live

    def end_cycle(self, live: set[int]) -> None:
        """After a cycle: forget processes that are gone and tag sets not used in it."""
        self.jobs.forget_except(live)
        self._tags, self._tags_now = self._tags_now, {}

    def gpu_job(self, dev: Device, procs: list[Any]) -> JobInfo:
        """The job of the process using the most memory on the GPU (a pod UID named by the
        kubelet where it can); for a GPU without one, the pod holding it, else the job map."""
        best, best_mem = NO_JOB, -1
        pods = set()
        for pid, mem in procs:
            info = self.jobs.for_pid(pid)
            used = mem if isinstance(mem, int) else 0
            if info.job and used > best_mem:
                best, best_mem = info, used
            if info.job.startswith(POD_UID_PREFIX):
                pods.add(info.job)
        named = self.pod_named(dev, best)
        if len(pods) == 1 and named.job != best.job:
            # the one pod UID among the GPU's processes is the one pod the kubelet says holds
            # it: the relay holds that pod's socket reports to this name. A second pod on the
            # GPU (a privileged one, or one that sees every GPU) makes it ambiguous: no name
            self.context.inventory.jobs.named_pod(time.time_ns(), best.job, named.job)
        return named if named.job else self.jobs.for_gpu(dev.index)

    def process_job(self, dev: Device, pid: int) -> JobInfo:
        return self.pod_named(dev, self.jobs.for_pid(pid))

    def pod_named(self, dev: Device, info: JobInfo) -> JobInfo:
        """``info`` with a pod UID (or no job) replaced by ``<namespace>/<pod>`` of the one pod
        the kubelet says holds this GPU. A GPU shared by several pods keeps its processes' pod
        UIDs: the pod-resources API does not give UIDs, so they cannot be told apart."""
        if self.pods is None or (info.job and not info.job.startswith(POD_UID_PREFIX)):
            return info
        holders = self.pods.holders(dev.uuid, dev.index)
        if not holders or any(h.job != holders[0].job for h in holders):
            return info
        return JobInfo(holders[0].job, info.rank, info.local_rank)

    def tag_set(self, dev: Device, job: JobInfo) -> TagSet:
        """The tags of a GPU's points and of each of its NVLinks' points, for ``job``: built
        once per GPU and job, and kept while the job is on the GPU (a tag set not used in a
        cycle is dropped at its end, so the thousands of jobs a node sees leave nothing)."""
        key = (dev.index, job)
        cached = self._tags_now.get(key) or self._tags.get(key)
        if cached is None:
            tags = self.context.base_tags() | {"gpu": str(dev.index)}
            if dev.uuid:
                tags["gpu_uuid"] = dev.uuid
            if dev.model:
                tags["gpu_model"] = dev.model
            tags |= job.tags()
            cached = (tags, [tags | {"link": str(link)} for link in range(dev.links)])
        self._tags_now[key] = cached
        return cached

    def close(self) -> None:
        if self.pods is not None:
            self.pods.close()
