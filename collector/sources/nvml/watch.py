"""Events the NVML source sees in a GPU's own fields, between one cycle and the next.

The driver raises an XID for most hardware faults, but some only show in the counters and
states the agent reads anyway, so it watches them itself and turns a change into a
``gpu_event`` (and a critical finding on the fast path):

* ``ecc_dbe``: the volatile double-bit (uncorrectable) ECC counter grew since the last cycle.
  The GPU needs a reset (Ampere and later remap the row then), whatever the process it hit
  did. A counter that went down was reset by a driver reload: nothing is said.
* ``row_remap_failure``: a row remap failed (``remapped_rows_failure_active`` turned true):
  the GPU has no spare rows left for the bank and needs service.
* ``fabric_unregistered`` (a finding, no event: the state is in every ``gpu`` point): the GPU
  has not been registered with the NVLink fabric for ``fabric_grace_s`` (a driver reload
  re-registers in seconds; a stopped Fabric Manager lasts). CUDA programs cannot start on
  it, however healthy every other counter looks. Said once per stretch.

A GPU that does not answer a question is left alone; the first cycle only learns the values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpuwarden.collector.health import Stretch
from gpuwarden.collector.sources.base import SourceContext
from gpuwarden.collector.sources.events import emit, gpu_event, job_words
from gpuwarden.core.store.lineprotocol import Point

log = logging.getLogger(__name__)


@dataclass
class _Seen:
    unregistered: Stretch  # its fabric registration is not done
    dbe: int | None = None  # the volatile DBE counter at the last cycle
    remap_failed: bool | None = None


class GpuWatch:
    def __init__(self, context: SourceContext, fabric_grace_s: float) -> None:
        self.context = context
        self.fabric_grace_ns = int(fabric_grace_s * 1e9)
        self._seen: dict[int, _Seen] = {}

    def check(self, gpu: int, uuid: str, fields: dict[str, Any], now_ns: int) -> list[Point]:
        """The events in this cycle's fields of ``gpu`` (called before the source records this
        cycle's jobs, so a fault is tagged with the job the GPU had at the last look)."""
        seen = self._seen.get(gpu)
        if seen is None:  # not setdefault: that would build a _Seen per GPU every cycle
            seen = self._seen[gpu] = _Seen(unregistered=Stretch(self.fabric_grace_ns))
        out: list[Point] = []
        dbe = fields.get("ecc_dbe_volatile_total")
        if isinstance(dbe, int):
            if seen.dbe is not None and dbe > seen.dbe:
                new = dbe - seen.dbe
                out.append(self._event(gpu, uuid, now_ns, "ecc_dbe",
                                       f"{new} new uncorrectable (double-bit) ECC error(s) on GPU "
                                       f"{gpu}: reset the GPU", {"ecc_dbe_new": new}))  # fmt: skip
            seen.dbe = dbe
        failed = fields.get("remapped_rows_failure_active")
        if isinstance(failed, bool):
            if failed and seen.remap_failed is False:
                out.append(self._event(gpu, uuid, now_ns, "row_remap_failure",
                                       f"a row remap failed on GPU {gpu}: the GPU needs service",
                                       {}))  # fmt: skip
            seen.remap_failed = failed
        self._fabric(gpu, uuid, seen, fields, now_ns)
        return out

    def _event(
        self,
        gpu: int,
        uuid: str,
        now_ns: int,
        event: str,
        message: str,
        evidence: dict[str, Any],
    ) -> Point:
        log.error("%s", message)
        job = self.context.inventory.jobs.job_at(now_ns - 1, gpu)
        # the finding's kind is the event's, as the Grafana rules gw-ecc-dbe and
        # gw-row-remap-failure name theirs: one policy covers both paths
        emit(self.context, event, gpu, now_ns, message + job_words(job),
             {"gpu_uuid": uuid, **evidence, **job.tags()})  # fmt: skip
        return gpu_event(self.context, event=event, severity="critical", source="nvml",
                         now_ns=now_ns, gpu=gpu, uuid=uuid, job=job,
                         fields={"message": message, "fatal_active": True})  # fmt: skip

    def _fabric(
        self, gpu: int, uuid: str, seen: _Seen, fields: dict[str, Any], now_ns: int
    ) -> None:
        registered = fields.get("fabric_registered_active")
        if registered is not False:
            if registered and seen.unregistered.end():
                log.warning("GPU %d is registered with the NVLink fabric again", gpu)
            return
        waited = seen.unregistered.due(now_ns)
        if waited is None:
            return
        state = fields.get("fabric_state_code")
        message = (f"GPU {gpu} not registered with the NVLink fabric for {waited // 10**9} s "
                   f"(state {state}, status {fields.get('fabric_status_code', '-')}): is "
                   "nvidia-fabricmanager running?")  # fmt: skip
        log.error("%s", message)
        evidence: dict[str, Any] = {
            "gpu_uuid": uuid,
            "fabric_state_code": state,
            "unregistered_s": waited // 10**9,
        }
        if "fabric_status_code" in fields:
            evidence["fabric_status_code"] = fields["fabric_status_code"]
        emit(self.context, "fabric_unregistered", gpu, now_ns, message, evidence)
