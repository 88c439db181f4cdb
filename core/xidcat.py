"""NVIDIA's XID catalogue (real data, shipped as package data) with severity and fatality.

Severity comes from NVIDIA's *immediate resolution* for the XID:

* ``critical``: the GPU, its memory or its links need a reset, a reboot or service
  (RESET_GPU, RESTART_BM, RESTART_VM, the XID-48 and NVLink workflows, CONTACT_SUPPORT);
* ``warning``: the application is affected (RESTART_APP, CHECK_UVM, UPDATE_SWFW, other
  workflows, and XIDs the catalogue leaves without a resolution);
* ``info``: IGNORE, informational XIDs (154) and codes the catalogue marks unused.

XID 154 is the driver saying what recovery a GPU now needs ("GPU recovery action changed from
0x0 (None) to 0x2 (Node Reboot Required)"); its severity is read from those words when the
kernel log gives them (:data:`RECOVERY_FATAL`: fatal, so critical; another action but
``None``: a warning). Before, every 154 was info, and a GPU the driver declared in need of a
reboot raised nothing (found by a review against real driver output, 2026-11-28).

Which XIDs *count as a hardware failure* (``fatal``: labels for the failure predictor, the fast
path to remediation) is a separate, operator-configurable list; :data:`DEFAULT_FATAL_XIDS` is
a conservative default (uncorrectable memory errors, fallen off the bus, GSP failures, NVLink
failures, row-remap failure). A fatal XID is always reported as critical.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

DEFAULT_FATAL_XIDS: tuple[int, ...] = (
    48, 62, 64, 74, 79, 95, 119, 120, 136, 140, 143, 144, 145, 146, 147, 148, 149, 150,
    155, 156, 158, 167, 171, 172,
)  # fmt: skip

#: XID 154's words: the recovery action the driver asks for now
RECOVERY_ACTION_RE = re.compile(
    r"recovery action changed from .*? to 0x[0-9a-fA-F]+ \((?P<action>[^)]*)\)"
)
#: recovery actions (lower case) that take the GPU or the node out of service: a fatal XID 154
#: ("PF FLR": a function-level reset of the GPU; the driver logs NV_ERR_RESET_REQUIRED with
#: it and refuses new work until then)
RECOVERY_FATAL = frozenset(
    {"gpu reset required", "node reboot required", "drain and reset", "os reboot", "pf flr"}
)
RECOVERY_XID = 154

_CRITICAL = {"RESET_GPU", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT", "WORKFLOW_XID_48"}
_INFO = {"IGNORE", "XID_154"}


@dataclass(frozen=True, slots=True)
class XidInfo:
    xid: int
    mnemonic: str
    description: str
    resolution: str
    investigation: str
    severity: str


def _severity(resolution: str, description: str) -> str:
    first = resolution.split(maxsplit=1)[0] if resolution.strip() else ""
    if description.strip().lower() == "unused" or first in _INFO:
        return "info"
    if first in _CRITICAL or first.startswith("WORKFLOW_NVLINK"):
        return "critical"
    return "warning"


@cache
def catalogue() -> Mapping[int, XidInfo]:
    text = resources.files("gpuwarden.core").joinpath("data/xid/xid_catalog.csv").read_text("utf-8")
    out: dict[int, XidInfo] = {}
    for row in csv.DictReader(io.StringIO(text)):
        resolution = " ".join(row["immediate_resolution"].split())
        description = " ".join(row["description"].split())
        out[int(row["xid"])] = XidInfo(
            xid=int(row["xid"]),
            mnemonic=row["mnemonic"].split("/")[0].strip(),
            description=description,
            resolution=resolution,
            investigation=" ".join(row["investigatory_resolution"].split()),
            severity=_severity(resolution, description),
        )
    return out


class XidPolicy:
    """Severity, resolution and fatality of an XID under the operator's lists."""

    def __init__(
        self,
        fatal: Iterable[int] = DEFAULT_FATAL_XIDS,
        extra_fatal: Iterable[int] = (),
        not_fatal: Iterable[int] = (),
    ) -> None:
        self.fatal = (frozenset(fatal) | frozenset(extra_fatal)) - frozenset(not_fatal)
        self.not_fatal = frozenset(not_fatal)

    def describe(self, xid: int, message: str = "") -> tuple[str, str, bool]:
        """(severity, resolution text, fatal) of an XID; unknown XIDs are warnings. ``message``:
        the kernel's line, read for XID 154's recovery action."""
        if xid == RECOVERY_XID and (m := RECOVERY_ACTION_RE.search(message)):
            return self._recovery(m.group("action").strip())
        info = catalogue().get(xid)
        fatal = xid in self.fatal
        if info is None:
            return ("critical" if fatal else "warning"), "unknown XID: see NVIDIA's XID docs", fatal
        resolution = info.resolution or "no resolution in the catalogue"
        text = f"{info.mnemonic}: {info.description}. Immediate: {resolution}"
        if info.investigation:
            text += f"; investigate: {info.investigation}"
        return ("critical" if fatal else info.severity), text, fatal

    def _recovery(self, action: str) -> tuple[str, str, bool]:
        text = f"GPU recovery action: the driver asks for {action!r}"
        if action.lower() in RECOVERY_FATAL and RECOVERY_XID not in self.not_fatal:
            return "critical", text, True
        return ("info" if action.lower() == "none" else "warning"), text, False
