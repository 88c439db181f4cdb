"""The host's own health: host memory errors (EDAC) and tasks stuck in uninterruptible sleep.

* **EDAC**: each memory controller under ``<sysfs>/devices/system/edac/mc/mc*/`` counts the
  corrected (``ce_count``) and uncorrected (``ue_count``) errors it saw since boot. Their sums
  are the ``node_os`` fields ``edac_ce_total`` and ``edac_ue_total``. A rise in uncorrected
  errors is a critical ``memory_ue`` finding (the kernel may already have killed what used the
  page; the node's memory needs a look). Corrected errors are routine one at a time: a
  ``memory_ce`` warning is raised when ``ce_threshold`` of them fall within ``ce_window_s``,
  once per episode (:mod:`collector.episodes`). The first reading is the baseline; a count
  that goes down (a reset through ``reset_counters``, a reboot) starts a new baseline and is
  never read as errors.
* **D state**: ``procs_blocked`` from ``/proc/stat``, the field ``procs_blocked_count``: tasks
  in uninterruptible sleep, usually waiting on I/O (a hung NFS or Lustre mount, a dying disk).
  Some are normal for a moment; a ``tasks_blocked`` warning is raised when there has been at
  least one for ``blocked_for_s`` without a break (the kernel's own hung-task line, read by
  the kernel-log source, names the task once it has waited ``hung_task_timeout_secs``).

A host without EDAC (a VM, a kernel without the driver) gives no EDAC fields, not an error.
"""

from __future__ import annotations

import os
from typing import Any

from gpuwarden.collector.episodes import Episodes
from gpuwarden.collector.health import Stretch
from gpuwarden.collector.sources.base import SourceContext, SourceError
from gpuwarden.collector.sources.events import emit
from gpuwarden.core.store.lineprotocol import Point

NS = 1_000_000_000


def read_edac(root: str) -> dict[str, tuple[int, int]]:
    """``{controller: (ce_count, ue_count)}`` of every readable controller under ``root``."""
    out: dict[str, tuple[int, int]] = {}
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("mc"))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(root, name, "ce_count"), "rb") as f:
                ce = int(f.read())
            with open(os.path.join(root, name, "ue_count"), "rb") as f:
                ue = int(f.read())
        except (OSError, ValueError):
            continue
        if ce >= 0 and ue >= 0:
            out[name] = (ce, ue)
    return out


def read_procs_blocked(procfs: str) -> int | None:
    try:
        with open(os.path.join(procfs, "stat"), "rb") as f:
            for line in f:
                if line.startswith(b"procs_blocked "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class HostSource:
    name = "host"

    def __init__(self, context: SourceContext, settings: dict[str, Any]) -> None:
        self.context = context
        self.edac_root = str(context.sysfs / "devices" / "system" / "edac" / "mc")
        self.procfs = str(context.procfs)
        ce_threshold = int(settings.get("ce_threshold", 10))
        ce_window_s = float(settings.get("ce_window_s", 3600.0))
        blocked_for_s = float(settings.get("blocked_for_s", 300.0))
        if ce_threshold < 1 or ce_window_s <= 0 or blocked_for_s <= 0:
            raise SourceError("host: ce_threshold >= 1, ce_window_s and blocked_for_s > 0")
        self.ce = Episodes(threshold=ce_threshold, window_s=ce_window_s, recovery_s=ce_window_s)
        self.blocked = Stretch(int(blocked_for_s * NS))
        self._last: dict[str, tuple[int, int]] = {}

    def collect(self, now_ns: int) -> list[Point]:
        fields: dict[str, Any] = {}
        edac = read_edac(self.edac_root)
        if edac:
            fields["edac_ce_total"] = sum(ce for ce, _ in edac.values())
            fields["edac_ue_total"] = sum(ue for _, ue in edac.values())
            self._memory_errors(edac, now_ns)
        blocked = read_procs_blocked(self.procfs)
        if blocked is not None:
            fields["procs_blocked_count"] = blocked
            self._blocked(blocked, now_ns)
        if not fields:
            return []
        return [Point("node_os", self.context.base_tags(), fields, now_ns)]

    def _memory_errors(self, edac: dict[str, tuple[int, int]], now_ns: int) -> None:
        for mc, (ce, ue) in edac.items():
            last = self._last.get(mc)
            self._last[mc] = (ce, ue)
            if last is None:
                continue  # the baseline: errors from before the agent are not news
            new_ce = ce - last[0] if ce >= last[0] else 0  # a reset is a new baseline
            new_ue = ue - last[1] if ue >= last[1] else 0
            if new_ue:
                emit(self.context, "memory_ue", None, now_ns,
                     f"{new_ue} uncorrected host memory error(s) on {mc} (EDAC)",
                     {"controller": mc, "new_ue": new_ue, "ue_count": ue,
                      "source": "edac"})  # fmt: skip
            if new_ce and (ep := self.ce.event(mc, now_ns, new_ce)) is not None:
                emit(self.context, "memory_ce", None, now_ns,
                     f"{len(ep.recent)} corrected host memory errors on {mc} within "
                     f"{self.ce.window_ns // NS} s (EDAC)",
                     {"controller": mc, "count": len(ep.recent), "ce_count": ce,
                      "source": "edac"}, severity="warning")  # fmt: skip

    def _blocked(self, blocked: int, now_ns: int) -> None:
        if blocked == 0:
            self.blocked.end()
            return
        held = self.blocked.due(now_ns)
        if held is not None:
            emit(self.context, "tasks_blocked", None, now_ns,
                 f"tasks in uninterruptible sleep (D state) for {held // NS} s; {blocked} now",
                 {"procs_blocked": blocked, "for_s": held // NS, "source": "procfs"},
                 severity="warning")  # fmt: skip

    def close(self) -> None:
        pass
