"""A GPU lost without an XID: the PCI bus, NVML and the expected count compared every cycle.

The sysfs PCI trees are CONSTRUCTED in the kernel's layout (``bus/pci/devices/<addr>/vendor``,
``class``: 0x10de is NVIDIA, 0x0302 a 3D controller, 0x0680 a bridge such as an NVSwitch, 0x15b3
a Mellanox NIC); the NVML answers come from the CONSTRUCTED 8x H100 recording.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuwarden.collector.gpucount import GpuCountWatch, bus_gpus
from gpuwarden.core.finding import Finding, Severity
from gpuwarden.core.store.lineprotocol import Point

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "tests/golden/nvml-h100-8gpu/nvml.json"


def pci_tree(sysfs: Path, gpus: int, *, vga: int = 0) -> list[str]:
    """``gpus`` 3D controllers (and ``vga`` VGA ones) from NVIDIA, four NVSwitches, two NICs,
    and a host bridge; the GPUs' addresses."""
    devices = sysfs / "bus/pci/devices"
    devices.mkdir(parents=True, exist_ok=True)

    def dev(addr: str, vendor: str, klass: str) -> None:
        d = devices / addr
        d.mkdir(exist_ok=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")

    addrs = []
    for i in range(gpus + vga):
        addr = f"0000:{0x18 + 0x10 * i:02x}:00.0"
        dev(addr, "0x10de", "0x030200" if i < gpus else "0x030000")
        addrs.append(addr)
    for i in range(4):
        dev(f"0000:{0x05 + i:02x}:00.0", "0x10de", "0x068000")  # NVSwitch: a bridge
    for i in range(2):
        dev(f"0000:{0xA0 + i:02x}:00.0", "0x15b3", "0x020700")  # ConnectX: InfiniBand
    dev("0000:00:00.0", "0x8086", "0x060000")
    return sorted(addrs)


def gpu_points(n: int) -> list[Point]:
    return [Point("gpu", {"node": "n1", "gpu": str(g)}, {"gpu_util_pct": 1.0}, 0) for g in range(n)]


def watch(tmp: Path, expected: int = 0, nvml: bool = True) -> tuple[GpuCountWatch, list[Finding]]:
    said: list[Finding] = []
    return GpuCountWatch("c", "n1", said.append, sysfs=tmp, expected=expected, nvml=nvml), said


def test_the_bus_count_is_nvidia_gpus_only(tmp_path: Path) -> None:
    addrs = pci_tree(tmp_path, 7, vga=1)
    assert bus_gpus(tmp_path) == addrs and len(addrs) == 8
    assert bus_gpus(tmp_path / "nowhere") == []


def test_nvml_missing_a_gpu_on_the_bus_is_critical_and_said_once(tmp_path: Path) -> None:
    addrs = pci_tree(tmp_path, 8)
    w, said = watch(tmp_path)
    w.cycle(1, gpu_points(8))
    assert said == []
    w.cycle(2, gpu_points(7))
    w.cycle(3, gpu_points(7))  # the same disagreement: not said again
    (f,) = said
    assert (f.kind, f.severity, f.subject) == ("gpu_missing", Severity.CRITICAL,
                                                {"cluster": "c", "node": "n1"})  # fmt: skip
    assert f.evidence == {"bus_gpus": 8, "nvml_gpus": 7, "expected_gpus": 0, "bus_ids": addrs}
    assert "8 on the PCI bus, 7 seen by NVML" in f.summary
    w.cycle(4, gpu_points(8))  # agree again ...
    w.cycle(5, gpu_points(7))  # ... and lose one again: a new finding
    assert len(said) == 2


def test_a_gpu_gone_from_the_bus_and_nvml_alike_is_caught_by_the_expected_count(
    tmp_path: Path,
) -> None:
    pci_tree(tmp_path, 7)
    w, said = watch(tmp_path, expected=8)
    w.cycle(1, gpu_points(7))
    (f,) = said
    assert (f.evidence["bus_gpus"], f.evidence["nvml_gpus"], f.evidence["expected_gpus"]) == (
        7, 7, 8
    )  # fmt: skip
    none_expected, quiet = watch(tmp_path, expected=0)
    none_expected.cycle(1, gpu_points(7))
    assert quiet == []  # bus and NVML agree, nothing expected: nothing to say


def test_no_gpus_here_and_none_expected_says_nothing(tmp_path: Path) -> None:
    w, said = watch(tmp_path / "empty")
    w.cycle(1, [])
    assert said == []
    w2, said2 = watch(tmp_path / "empty", expected=8)
    w2.cycle(1, gpu_points(8))  # a bus we cannot read (no NVIDIA device at all) is left out
    assert said2 == []
    w2.cycle(2, gpu_points(7))  # NVML against expected still counts
    assert said2 and said2[0].evidence["nvml_gpus"] == 7


def test_without_the_nvml_source_only_the_bus_and_expected_are_compared(tmp_path: Path) -> None:
    pci_tree(tmp_path, 8)
    w, said = watch(tmp_path, expected=8, nvml=False)
    w.cycle(1, [])  # no gpu points: NVML is not read on this node, not "zero GPUs"
    assert said == []


def test_the_agent_raises_it_through_its_production_command(tmp_path: Path) -> None:
    """``gpuwarden agent --once`` on a node whose bus shows 9 NVIDIA GPUs while NVML (the
    recording) lists 8: the finding is in the cycle's output."""
    pci_tree(tmp_path / "sys", 9)
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\ncluster = "c"\nnode = "node-0"\nsources = ["nvml"]\n'
        f'sysfs = "{tmp_path}/sys"\nreporter_listen = ""\n'
        f'[nvml]\nbackend = "recorded"\nrecording = "{H100}"\nevents = "poll"\n'
        f'jobmap_dir = "{tmp_path}/jobs"\npod_resources_socket = "{tmp_path}/none.sock"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "agent", "--config", str(config), "--once"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    findings = [line for line in done.stdout.splitlines() if line.startswith("finding,")]
    assert len(findings) == 1 and "kind=gpu_missing" in findings[0], findings
    assert "GPU count disagrees (9 on the PCI bus, 8 seen by NVML)" in findings[0]
