"""A simulated node's NVML: the answers its driver would give, built each tick from the
scenario's telemetry, in the agent's recording format (``gpuwarden-nvml/1``, followed live).

The answers are the inverse of the agent's parsing (:mod:`collector.sources.nvml.poll`): the
same calls, arguments and units (milliwatts, KB/s, millijoules, ``[ret, value]`` field pairs),
so the agent reads a simulated node through exactly the code it reads a real one with, minus
pynvml's ctypes layer. A GPU the scenario has lost (XID 79) answers ``GPU_IS_LOST`` to every
call, as a GPU off the bus does. What each GPU is (name, clocks, PCIe, VBIOS) comes from the
scenario's GPU profile; the processes on it are the real processes the twin has bound to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuwarden.collector.nvml.backend import (
    ERROR_GPU_IS_LOST,
    ERROR_NOT_SUPPORTED,
    EVENT_XID_CRITICAL,
)
from gpuwarden.collector.nvml.recorded import call_key
from gpuwarden.collector.sources.nvml.info import INFO_CALLS
from gpuwarden.collector.sources.nvml.poll import (
    FI_NVLINK_LINK_COUNT,
    GPM_METRICS,
    GPU_FIELD_IDS,
    NVLINK_SCOPED,
    PLAIN_CALLS,
    STATIC_CALLS,
    field_request,
)
from gpuwarden.core.xidcat import catalogue
from gpuwarden.simulation.generator import DRIVER, GpuProfile

LOST = {"e": ERROR_GPU_IS_LOST}
NOT_SUPPORTED = {"e": ERROR_NOT_SUPPORTED}
#: retired pages are a pre-Ampere mechanism: A100 and H100 remap rows instead
RETIRED = ("retired_pages_sbe_total", "retired_pages_dbe_total", "retired_pages_pending_active")
#: the H100's fabric answer: registered, every health bit of the mask answered "false"
FABRIC_OK = [3, 0, 0b10101010]


def pci_bus_id(gpu: int) -> str:
    """The bus id NVML gives (``00000000:18:00.0``, ...), as an HGX baseboard numbers them."""
    return f"00000000:{0x18 + 0x10 * gpu:02X}:00.0"


def driver_text(xid: int) -> str:
    """What the driver says after an XID's code, as the catalogue describes it ("GPU has
    fallen off the bus."); the same for every fault that raises that code."""
    info = catalogue().get(xid)
    return f"{info.description}." if info is not None else "Unknown error."


def xid_line(gpu: int, xid: int, pid: int | None, process: str, text: str) -> str:
    """The kernel's line for an XID, as the NVIDIA driver writes it (``NVRM: Xid``)."""
    who = f"pid={pid}, name={process}" if pid is not None else "pid='<unknown>', name=<unknown>"
    return f"NVRM: Xid (PCI:0000:{0x18 + 0x10 * gpu:02x}:00): {xid}, {who}, {text}\n"


def xid_event(gpu: int, xid: int) -> list[int]:
    """The event NVML's event set delivers for a critical XID: ``[gpu, type, xid]``."""
    return [gpu, EVENT_XID_CRITICAL, xid]


class NodeNvml:
    """The NVML of one simulated node with ``gpus`` GPUs of ``profile``."""

    def __init__(
        self, gpus: int, links: int, profile: GpuProfile, uuids: Sequence[str], serial_base: int
    ) -> None:
        self.gpus = gpus
        self.links = links
        self.profile = profile
        self.uuids = list(uuids)
        self.serial_base = serial_base
        self.request = field_request(links)

    def answers(
        self,
        rows: Mapping[int, Mapping[str, Any]],
        links: Mapping[tuple[int, int], Mapping[str, Any]],
        info: Mapping[int, Mapping[str, Any]],
        processes: Mapping[int, Sequence[tuple[int, int]]],
    ) -> dict[str, Any]:
        """Every answer of this tick: ``rows`` holds each GPU's ``gpu`` telemetry (a GPU
        missing from it is lost), ``links`` each ``(gpu, link)``'s ``gpu_nvlink`` telemetry,
        ``info`` the last ``gpu_info`` of each GPU, ``processes`` each GPU's ``(pid, bytes)``."""
        out: dict[str, Any] = {
            call_key(None, "nvmlDeviceGetCount", ()): {"v": self.gpus},
            call_key(None, "nvmlSystemGetDriverVersion", ()): {
                "v": next((str(i["driver_version"]) for i in info.values()), DRIVER)
            },
        }
        for g in range(self.gpus):
            row = rows.get(g)
            if row is None:
                out.update(self._lost(g))
                continue
            out.update(self._identity(g, info.get(g, {})))
            out.update(self._plain(g, row, processes.get(g, ())))
            out.update(self._fields(g, row, links))
        return out

    # -- what a GPU is ----------------------------------------------------------------------

    def _identity(self, g: int, info: Mapping[str, Any]) -> dict[str, Any]:
        p = self.profile
        a: dict[str, Any] = {
            call_key(g, "nvmlDeviceGetUUID", ()): {"v": self.uuids[g]},
            call_key(g, "nvmlDeviceGetName", ()): {"v": p.model},
            call_key(g, "nvmlDeviceGetPciInfo", ()): {"v": pci_bus_id(g)},
            call_key(g, "nvmlDeviceGetFieldValues", ([[FI_NVLINK_LINK_COUNT, 0]],)): {
                "v": [[0, self.links]]
            },
        }
        static = {
            "sm_clock_max": p.sm_max,
            "mem_clock_max": p.mem_clock,
            "graphics_clock_max": p.sm_max,
            "pcie_gen_max": p.pcie_gen,
            "pcie_width_max": 16,
        }
        for label, name, args in STATIC_CALLS:
            a[call_key(g, name, args)] = {"v": static[label]}
        ecc = bool(info.get("ecc_mode_active", True))
        ecc_pending = bool(info.get("ecc_mode_pending_active", True))
        modes = {
            "serial": f"{self.serial_base + g:013d}",
            "vbios": str(info.get("vbios_version", p.vbios)),
            "persistence": 1,
            "ecc_mode": [int(ecc), int(ecc_pending)],
            "mig_mode": [0, 0],
        }
        for label, name in INFO_CALLS:
            a[call_key(g, name, ())] = {"v": modes[label]}
        return a

    def _lost(self, g: int) -> dict[str, Any]:
        a = {call_key(g, name, args): LOST for _, name, args in (*PLAIN_CALLS, *STATIC_CALLS)}
        for name in ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo"):
            a[call_key(g, name, ())] = LOST
        for _, name in INFO_CALLS:
            a[call_key(g, name, ())] = LOST
        a[call_key(g, "nvmlDeviceGetFieldValues", (self.request,))] = LOST
        a[call_key(g, "nvmlDeviceGetFieldValues", ([[FI_NVLINK_LINK_COUNT, 0]],))] = LOST
        a[call_key(g, "nvmlGpmMetricsGet", (list(GPM_METRICS.values()),))] = LOST
        return a

    # -- what it does this tick -------------------------------------------------------------

    def _plain(
        self, g: int, row: Mapping[str, Any], procs: Sequence[tuple[int, int]]
    ) -> dict[str, Any]:
        p = self.profile
        util = float(row["gpu_util_pct"])
        values: dict[str, Any] = {
            "util": [round(util), round(float(row["mem_util_pct"]))],
            "memory": [int(row["mem_total_bytes"]), int(row["mem_used_bytes"])],
            "sm_clock": round(float(row["sm_clock_mhz"])),
            "mem_clock": round(float(row["mem_clock_mhz"])),
            "graphics_clock": round(float(row["sm_clock_mhz"])),
            "gpu_temp": round(float(row["gpu_temp_c"])),
            "power": round(float(row["power_w"]) * 1000),  # NVML: milliwatts
            "power_limit": round(float(row["power_limit_w"]) * 1000),
            "pstate": int(row["pstate_code"]),
            "fan": None,  # SXM boards have no fan of their own
            "clock_events": int(row["clock_event_reasons_code"]),
            "pcie_tx": round(util * 12_000),  # KB/s
            "pcie_rx": round(util * 24_000),
            "pcie_gen": int(row["pcie_link_gen_code"]),
            "pcie_width": int(row["pcie_link_width_count"]),
            "processes": [[int(pid), int(mem)] for pid, mem in procs],
            "fabric": FABRIC_OK if p.gpm else None,  # Hopper and newer (GPM marks them too)
        }
        a: dict[str, Any] = {}
        for label, name, args in PLAIN_CALLS:
            v = values[label]
            a[call_key(g, name, args)] = NOT_SUPPORTED if v is None else {"v": v}
        gpm_ids = list(GPM_METRICS.values())
        if p.gpm:
            metrics = [
                float(row.get("gpm_sm_util_pct") or 0.0),
                float(row.get("gpm_sm_occupancy_pct") or 0.0),
                float(row.get("gpm_tensor_active_pct") or 0.0),
                float(row["mem_util_pct"]),
            ]
            a[call_key(g, "nvmlGpmMetricsGet", (gpm_ids,))] = {"v": [[0, m] for m in metrics]}
        else:
            a[call_key(g, "nvmlGpmMetricsGet", (gpm_ids,))] = NOT_SUPPORTED
        return a

    def _fields(
        self,
        g: int,
        row: Mapping[str, Any],
        links: Mapping[tuple[int, int], Mapping[str, Any]],
    ) -> dict[str, Any]:
        counters = {
            "ecc_sbe_volatile_total": int(row["ecc_sbe_volatile_total"]),
            "ecc_dbe_volatile_total": int(row["ecc_dbe_volatile_total"]),
            "ecc_sbe_aggregate_total": int(row["ecc_sbe_volatile_total"]),
            "ecc_dbe_aggregate_total": int(row["ecc_dbe_volatile_total"]),
            "mem_temp_c": round(float(row["mem_temp_c"])),
            "energy_j_total": round(float(row["energy_j_total"]) * 1000),  # NVML: millijoules
            "pcie_replay_total": int(row["pcie_replay_total"]),
            "remapped_rows_correctable_total": int(row["remapped_rows_correctable_total"]),
            "remapped_rows_uncorrectable_total": int(row["remapped_rows_uncorrectable_total"]),
            "remapped_rows_pending_active": int(bool(row["remapped_rows_pending_active"])),
            "remapped_rows_failure_active": int(bool(row["remapped_rows_failure_active"])),
        }
        by_id = {fid: name for name, (fid, _) in GPU_FIELD_IDS.items()}
        scoped = {fid: name for name, fid in NVLINK_SCOPED.items()}
        pairs: list[list[Any]] = []
        for fid, scope in self.request:
            if fid in by_id:
                name = by_id[fid]
                pairs.append(
                    [ERROR_NOT_SUPPORTED, None] if name in RETIRED else [0, counters[name]]
                )
            elif fid in scoped:
                link = links.get((g, scope))
                name = scoped[fid]
                if link is None:
                    pairs.append([ERROR_NOT_SUPPORTED, None])
                elif name == "link_up_active":
                    pairs.append([0, int(bool(link["link_up_active"]))])
                else:
                    pairs.append([0, int(link[name])])
            else:  # pre-Hopper per-lane CRC counters: Hopper answers the scoped ones
                pairs.append([ERROR_NOT_SUPPORTED, None])
        return {call_key(g, "nvmlDeviceGetFieldValues", (self.request,)): {"v": pairs}}
