"""A GPU lost without an XID: the GPUs on the PCI bus, NVML's count and the expected count.

A GPU can vanish with no XID at all: it drops off the bus during a reset, the driver fails to
attach it at boot, or NVML stops listing it (NVSentinel #155, #684). None of those raises an
event, so every cycle compares three counts:

* **bus**: NVIDIA devices on the PCI bus (``<sysfs>/bus/pci/devices/*``, vendor ``0x10de``,
  class display VGA ``0x0300`` or 3D ``0x0302``; NVSwitches, class ``0x0680``, are bridges and
  not counted); none at all means the bus is not readable here (a sysfs that is not the
  host's), and it is left out of the comparison;
* **nvml**: GPUs the NVML source reported this cycle (only when the nvml source runs);
* **expected**: ``[health] expected_gpus`` (0: not set).

When any two that are known disagree, one critical ``gpu_missing`` finding goes on the fast path
with the three counts and the bus addresses NVML did not report; it is said again only after
the counts agree again (or disagree differently), never every cycle. The default fatal-GPU
policy drains the node. Turn it off (``[health] gpu_count_check = false``) where the agent is
shown only some of the node's GPUs: a container given fewer than all (NVML lists what it was
given, the bus shows every one), or GPUs passed through to virtual machines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.lineprotocol import Point

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA-compatible, 3D controller


def _bus(sysfs: str | Path, wanted: Callable[[str, str], bool]) -> list[str]:
    """The PCI addresses (sorted, lower case) of the devices on the bus whose vendor and
    class (``0x10de``, ``0x030200``) ``wanted`` takes."""
    out: list[str] = []
    devices = Path(sysfs) / "bus/pci/devices"
    if not devices.is_dir():
        return out
    for dev in devices.iterdir():
        try:
            vendor = (dev / "vendor").read_text().strip().lower()
            klass = (dev / "class").read_text().strip().lower()
        except OSError:
            continue
        if wanted(vendor, klass):
            out.append(dev.name.lower())
    return sorted(out)


def bus_gpus(sysfs: str | Path) -> list[str]:
    """The PCI addresses of NVIDIA GPUs on the bus, sorted (lower case)."""
    return _bus(sysfs, lambda vendor, klass: vendor == NVIDIA and klass[:6] in GPU_CLASSES)


def bus_hcas(sysfs: str | Path) -> list[str]:
    """The PCI addresses of InfiniBand controllers (PCI class 0x0207, any vendor) on the bus,
    sorted: a ConnectX port set to InfiniBand shows as one, set to Ethernet (RoCE) it does
    not, so an Ethernet-only node has none."""
    return _bus(sysfs, lambda vendor, klass: klass.startswith("0x0207"))


class GpuCountWatch:
    def __init__(
        self,
        cluster: str,
        node: str,
        emit: Callable[[Finding], None],
        *,
        sysfs: str | Path,
        expected: int = 0,
        nvml: bool = True,
    ) -> None:
        self.cluster, self.node, self.emit = cluster, node, emit
        self.sysfs, self.expected, self.nvml = Path(sysfs), expected, nvml
        self._said: tuple[int, int | None, int] | None = None

    def counts(self, points: Sequence[Point]) -> tuple[list[str], int | None]:
        bus = bus_gpus(self.sysfs)
        seen = {p.tags.get("gpu") for p in points if p.measurement == "gpu"} if self.nvml else None
        return bus, (len(seen) if seen is not None else None)

    def cycle(self, now_ns: int, points: Sequence[Point]) -> None:
        bus, nvml = self.counts(points)
        # no NVIDIA device on the bus at all: the bus is not readable here (a sysfs that is not
        # the host's, a simulated node), not every GPU gone; NVML and expected still compare
        on_bus = len(bus) if bus else None
        known = [n for n in (on_bus, nvml, self.expected or None) if n is not None]
        if not bus and not self.expected:
            return  # no NVIDIA GPU on this host, and none expected
        if len(set(known)) <= 1:
            self._said = None
            return
        state = (len(bus), nvml, self.expected)
        if state == self._said:
            return
        self._said = state
        parts = [f"{len(bus)} on the PCI bus"]
        if nvml is not None:
            parts.append(f"{nvml} seen by NVML")
        if self.expected:
            parts.append(f"{self.expected} expected")
        self.emit(
            Finding(
                kind="gpu_missing",
                subject={"cluster": self.cluster, "node": self.node},
                severity=Severity.CRITICAL,
                time_ns=now_ns,
                evidence={
                    "bus_gpus": len(bus),
                    "nvml_gpus": nvml,
                    "expected_gpus": self.expected,
                    "bus_ids": bus,
                },
                confidence=1.0,
                summary=f"{self.node}: GPU count disagrees ({', '.join(parts)}) with no XID",
                source="agent",
            )
        )
