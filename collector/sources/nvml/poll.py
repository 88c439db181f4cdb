"""Polling a GPU: the calls the NVML source makes every cycle, and the fields they become.

Per GPU and cycle: about sixteen plain calls and one ``nvmlDeviceGetFieldValues`` batch that
carries every counter (ECC, retired pages, remapped rows, memory temperature, energy, PCIe
replay, and per NVLink its state, CRC/replay/recovery counters and bytes); on NVSwitch systems
(Hopper+) one of the plain calls is the GPU's registration with Fabric Manager, without which
CUDA cannot use the GPU (jobs fail to start) however healthy it otherwise looks. Asking
(:class:`Reader`, :func:`read_gpu`) and turning answers into fields (:func:`parse_gpu`, pure)
are separate.

"Not supported" (and the other "not available" answers) leaves the field out, and a call that
answered "not supported" is not asked again; a function the driver lacks is logged once.
``GPU_IS_LOST`` on any call raises :class:`GpuLostError`, which ends that GPU's cycle
(:mod:`.lost`).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.collector.nvml.backend import (
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_NO_PERMISSION,
    ERROR_NOT_READY,
    UNAVAILABLE,
    NvmlBackend,
    NvmlError,
)
from gpuwarden.collector.sources.base import WarnOnce
from gpuwarden.core.catalogue import CLOCK_EVENT_REASONS

# nvmlDeviceGetFieldValues ids (nvml.h NVML_FI_DEV_*), field -> (id, scale)
GPU_FIELD_IDS: dict[str, tuple[int, float]] = {
    "ecc_sbe_volatile_total": (3, 1),
    "ecc_dbe_volatile_total": (4, 1),
    "ecc_sbe_aggregate_total": (5, 1),
    "ecc_dbe_aggregate_total": (6, 1),
    "retired_pages_sbe_total": (29, 1),
    "retired_pages_dbe_total": (30, 1),
    "retired_pages_pending_active": (31, 1),
    "mem_temp_c": (82, 1),
    "energy_j_total": (83, 1e-3),  # mJ
    "pcie_replay_total": (94, 1),
    "remapped_rows_correctable_total": (142, 1),
    "remapped_rows_uncorrectable_total": (143, 1),
    "remapped_rows_pending_active": (144, 1),
    "remapped_rows_failure_active": (145, 1),
}
FI_NVLINK_LINK_COUNT = 91
# per link, asked with scope = link index
NVLINK_SCOPED: dict[str, int] = {
    "link_up_active": 165,  # NVML_FI_DEV_NVLINK_GET_STATE
    "replay_errors_total": 161,  # NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY
    "recovery_errors_total": 162,  # NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY
    "crc_flit_errors_total": 163,  # NVML_FI_DEV_NVLINK_ERROR_DL_CRC
    "tx_bytes_total": 202,  # NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES
    "rx_bytes_total": 204,  # NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES
}


def legacy_crc_ids(link: int) -> tuple[int, int] | None:
    """Per-lane CRC flit/data field ids of pre-Hopper drivers (links 0-11 only)."""
    if link < 6:
        return 32 + link, 39 + link
    if link < 12:
        return 96 + link - 6, 102 + link - 6
    return None


GPM_METRICS: dict[str, int] = {  # NVML_GPM_METRIC_*
    "gpm_sm_util_pct": 2,
    "gpm_sm_occupancy_pct": 3,
    "gpm_tensor_active_pct": 5,
    "gpm_dram_bw_util_pct": 10,
}
GPM_IDS = tuple(GPM_METRICS.values())
BOOL_FIELDS = frozenset(
    {"retired_pages_pending_active", "remapped_rows_pending_active", "remapped_rows_failure_active"}
)
FLOAT_FIELDS = frozenset({"mem_temp_c", "energy_j_total"})

# (label, call, args) of the plain per-cycle calls
PLAIN_CALLS: tuple[tuple[str, str, tuple[Any, ...]], ...] = (
    ("util", "nvmlDeviceGetUtilizationRates", ()),
    ("memory", "nvmlDeviceGetMemoryInfo", ()),
    ("sm_clock", "nvmlDeviceGetClockInfo", (1,)),
    ("mem_clock", "nvmlDeviceGetClockInfo", (2,)),
    ("graphics_clock", "nvmlDeviceGetClockInfo", (0,)),
    ("gpu_temp", "nvmlDeviceGetTemperature", (0,)),
    ("power", "nvmlDeviceGetPowerUsage", ()),
    ("power_limit", "nvmlDeviceGetEnforcedPowerLimit", ()),
    ("pstate", "nvmlDeviceGetPerformanceState", ()),
    ("fan", "nvmlDeviceGetFanSpeed", ()),
    ("clock_events", "nvmlDeviceGetCurrentClocksEventReasons", ()),
    ("pcie_tx", "nvmlDeviceGetPcieThroughput", (0,)),
    ("pcie_rx", "nvmlDeviceGetPcieThroughput", (1,)),
    ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", ()),
    ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", ()),
    ("processes", "nvmlDeviceGetComputeRunningProcesses", ()),
    ("fabric", "nvmlDeviceGetGpuFabricInfo", ()),
)
STATIC_CALLS: tuple[tuple[str, str, tuple[Any, ...]], ...] = (
    ("sm_clock_max", "nvmlDeviceGetMaxClockInfo", (1,)),
    ("mem_clock_max", "nvmlDeviceGetMaxClockInfo", (2,)),
    ("graphics_clock_max", "nvmlDeviceGetMaxClockInfo", (0,)),
    # the most the GPU and the slot it sits in can do (NVML: "possible with this device and
    # system"), so a link running narrower trained down: a riser, a slot or the GPU is failing
    ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", ()),
    ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", ()),
)


CLOCKS = tuple(
    (label, f"{label}_mhz", f"{label}_max", f"{label}_max_mhz")
    for label in ("sm_clock", "mem_clock", "graphics_clock")
)
FABRIC_STATE_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED; 1 not started, 2 in progress
# two-bit fields of the fabric health mask (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*): each
# 0 not supported (left out), 1 true, 2 false
FABRIC_HEALTH = (
    ("fabric_degraded_bw_active", 0),
    ("fabric_route_recovery_active", 2),
    ("fabric_route_unhealthy_active", 4),
    ("fabric_access_timeout_recovery_active", 6),
)
REASON_FIELDS = tuple(
    (f"clock_event_{name}_active", bit) for name, bit in CLOCK_EVENT_REASONS.items()
)


class GpuLostError(Exception):
    def __init__(self, call: str) -> None:
        super().__init__(call)
        self.call = call


@dataclass
class Device:
    index: int
    uuid: str = ""
    model: str = ""
    links: int = 0
    static: dict[str, Any] = field(default_factory=dict)
    field_ids: tuple[tuple[int, int], ...] = ()
    layout: FieldLayout | None = None
    skip: set[str] = field(default_factory=set)  # labels answered "not supported"
    lost: bool = False
    info_ns: int | None = None  # when its gpu_info was last asked


class FieldRequest(tuple[tuple[int, int], ...]):
    """A field request that computes its hash once: it is part of a dictionary key on every
    cycle (the recorded backend's answer lookup), and a 146-pair tuple hashes in microseconds."""

    _hash: int | None = None

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = tuple.__hash__(self)
        return self._hash


def field_request(links: int) -> FieldRequest:
    """The ``nvmlDeviceGetFieldValues`` request of a GPU with ``links`` NVLinks (stable)."""
    ids = [(fid, 0) for fid, _ in GPU_FIELD_IDS.values()]
    for link in range(links):
        ids += [(fid, link) for fid in NVLINK_SCOPED.values()]
        legacy = legacy_crc_ids(link)
        if legacy:
            ids += [(legacy[0], 0), (legacy[1], 0)]
    return FieldRequest(ids)


def _scaled(scale: float) -> Any:
    return lambda value: float(value) * scale


_LINK_CONVERT = {"link_up_active": bool}


@dataclass(frozen=True)
class FieldLayout:
    """Where each field sits in the answer to :func:`field_request` and how its value is
    converted (computed once per GPU, so the per-cycle parse is lookups and calls only)."""

    gpu: tuple[tuple[str, int, Any], ...]  # name, position, converter
    links: tuple[tuple[int, tuple[tuple[str, int, Any], ...], int, int], ...]
    # (link, ((name, position, converter), ...), legacy flit position or -1, legacy data or -1)

    @classmethod
    def of(cls, request: tuple[tuple[int, int], ...], links: int) -> FieldLayout:
        pos = {ids: i for i, ids in enumerate(request)}
        gpu = tuple(
            (name, pos[(fid, 0)],
             bool if name in BOOL_FIELDS else _scaled(scale) if name in FLOAT_FIELDS else int)
            for name, (fid, scale) in GPU_FIELD_IDS.items()
        )  # fmt: skip
        per_link = []
        for link in range(links):
            scoped = tuple(
                (name, pos[(fid, link)], _LINK_CONVERT.get(name, int))
                for name, fid in NVLINK_SCOPED.items()
            )
            legacy = legacy_crc_ids(link)
            flit, data = (pos[(legacy[0], 0)], pos[(legacy[1], 0)]) if legacy else (-1, -1)
            per_link.append((link, scoped, flit, data))
        return cls(gpu, tuple(per_link))


class Reader:
    """The thin part: asks the backend, sorts answers from failures. Stateful only in what
    it has learned not to ask again."""

    def __init__(self, backend: NvmlBackend, warn: WarnOnce) -> None:
        self.backend = backend
        self.warn = warn
        self.errors = 0
        self._lock = threading.Lock()  # PcieSampler's threads ask too

    def ask(self, dev: Device, label: str, name: str, *args: Any) -> Any:
        """The answer, or None when it is not available (never 0 or -1)."""
        if label in dev.skip:
            return None
        try:
            return self.backend.call(dev.index, name, *args)
        except NvmlError as exc:
            if exc.code == ERROR_GPU_IS_LOST:
                raise GpuLostError(name) from exc
            if exc.code == ERROR_NOT_READY:
                return None
            if exc.code in UNAVAILABLE:
                dev.skip.add(label)
            elif exc.code == ERROR_FUNCTION_NOT_FOUND:
                dev.skip.add(label)
                self.warn(f"fnf:{name}", f"NVML: {name} is not in this driver; skipped ({exc})")
            elif exc.code == ERROR_NO_PERMISSION:  # does not change while the agent runs
                dev.skip.add(label)
                self.warn(f"perm:{name}", f"NVML: no permission for {name}; skipped (GPM and "
                          "some counters need root or CAP_SYS_ADMIN in a container)")  # fmt: skip
            else:
                with self._lock:
                    self.errors += 1
                self.warn(f"err:{name}:{exc.code}", f"NVML: {exc}")
            return None
        except Exception as exc:  # a binding's or a driver's surprise costs this answer only
            with self._lock:
                self.errors += 1
            self.warn(f"exc:{name}:{type(exc).__name__}",
                      f"NVML: {name}[{dev.index}] raised {type(exc).__name__}: {exc}")  # fmt: skip
            return None


# nvmlDeviceGetPcieThroughput samples for 20 ms before it answers (20.8 ms a call on a REAL
# H200, driver 580.159.04; 0.02 ms for the other plain calls): asked one after another, TX and
# RX cost 42 ms a GPU, 333 ms a cycle on 8 GPUs. The calls wait in the driver, not on a CPU,
# and two at once on one GPU took 21 ms (docs/NVML-REAL.md), so :class:`PcieSampler` asks them
# all at once.
PCIE_LABELS = frozenset({"pcie_tx", "pcie_rx"})
PCIE_CALLS = tuple(c for c in PLAIN_CALLS if c[0] in PCIE_LABELS)


class PcieSampler:
    """Every GPU's PCIe throughput, TX and RX, asked at the same time on a small pool of
    threads (one per call; made at first use, closed with the source). Each answer is a
    future that :func:`read_gpu` takes in the GPU's own turn, so a GPU lost during its sample
    ends that GPU's cycle as any other call's loss does."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._size = 0

    def start(self, reader: Reader, devices: list[Device]) -> dict[int, dict[str, Future[Any]]]:
        calls = [(d, c) for d in devices if not d.lost for c in PCIE_CALLS if c[0] not in d.skip]
        if not calls:
            return {}
        if self._pool is None or self._size < len(calls):
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool = ThreadPoolExecutor(len(calls), thread_name_prefix="nvml-pcie")
            self._size = len(calls)
        out: dict[int, dict[str, Future[Any]]] = {}
        for dev, (label, name, args) in calls:
            out.setdefault(dev.index, {})[label] = self._pool.submit(
                reader.ask, dev, label, name, *args
            )
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def read_gpu(
    reader: Reader, dev: Device, gpm: bool, pcie: dict[str, Future[Any]] | None = None
) -> dict[str, Any]:
    """One cycle's answers for ``dev``; ``pcie``: its PCIe throughput already being asked
    (:class:`PcieSampler`), else it is asked here with the rest."""
    raw: dict[str, Any] = {}
    for label, name, args in PLAIN_CALLS:
        if pcie is not None and label in PCIE_LABELS:
            future = pcie.get(label)
            raw[label] = future.result() if future is not None else None
        else:
            raw[label] = reader.ask(dev, label, name, *args)
    raw["fields"] = reader.ask(dev, "fields", "nvmlDeviceGetFieldValues", dev.field_ids)
    if gpm:
        raw["gpm"] = reader.ask(dev, "gpm", "nvmlGpmMetricsGet", GPM_IDS)
    return raw


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _pair(value: Any) -> tuple[float, float] | None:
    """Two numbers (utilisation, memory), or None for any other shape."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    a, b = _num(value[0]), _num(value[1])
    return None if a is None or b is None else (a, b)


def _memory(value: Any, f: dict[str, Any]) -> None:
    """``[total, used]`` (v1) or ``[total, used, reserved]`` (v2; used without the reserve)."""
    if not isinstance(value, list) or len(value) not in (2, 3):
        return
    numbers = [_num(v) for v in value]
    if any(n is None for n in numbers):
        return
    f["mem_total_bytes"], f["mem_used_bytes"] = int(value[0]), int(value[1])
    if len(value) == 3:
        f["mem_reserved_bytes"] = int(value[2])


def parse_gpu(dev: Device, raw: dict[str, Any]) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """GPU fields and per-link NVLink fields from one cycle's answers (pure)."""
    f: dict[str, Any] = {}
    if (util := _pair(raw.get("util"))) is not None:
        f["gpu_util_pct"], f["mem_util_pct"] = util
    _memory(raw.get("memory"), f)
    for label, name, static_label, static_name in CLOCKS:
        value = _num(raw.get(label))
        if value is not None:
            f[name] = value
        static = _num(dev.static.get(static_label))
        if static is not None:
            f[static_name] = static
    if (v := _num(raw.get("gpu_temp"))) is not None:
        f["gpu_temp_c"] = v
    if (v := _num(raw.get("power"))) is not None:
        f["power_w"] = v / 1000
    if (v := _num(raw.get("power_limit"))) is not None:
        f["power_limit_w"] = v / 1000
    if isinstance(raw.get("pstate"), int) and 0 <= raw["pstate"] <= 15:
        f["pstate_code"] = raw["pstate"]  # 32 = unknown: left out
    if (v := _num(raw.get("fan"))) is not None:
        f["fan_speed_pct"] = v
    reasons = raw.get("clock_events")
    if isinstance(reasons, int):
        f["clock_event_reasons_code"] = reasons
        for name, bit in REASON_FIELDS:
            f[name] = bool(reasons & bit)
    for label, key in (("pcie_tx", "pcie_tx_bytes_per_s"), ("pcie_rx", "pcie_rx_bytes_per_s")):
        if (v := _num(raw.get(label))) is not None:
            f[key] = v * 1024  # NVML answers KB/s
    if isinstance(raw.get("pcie_gen"), int):
        f["pcie_link_gen_code"] = raw["pcie_gen"]
    if isinstance(gen_max := dev.static.get("pcie_gen_max"), int) and gen_max > 0:
        f["pcie_link_gen_max_code"] = gen_max
    width, width_max = raw.get("pcie_width"), dev.static.get("pcie_width_max")
    if isinstance(width, int):
        f["pcie_link_width_count"] = width
    if isinstance(width_max, int) and width_max > 0:
        f["pcie_link_width_max_count"] = width_max
        if isinstance(width, int) and width > 0:
            # the generation is left out: GPUs lower it themselves when idle, to save power
            f["pcie_link_downtrained_active"] = width < width_max
    if isinstance(raw.get("processes"), list):
        f["process_count"] = len(raw["processes"])
    if isinstance(raw.get("fabric"), list):
        _parse_fabric(raw["fabric"], f)
    links: dict[int, dict[str, Any]] = {}
    answers = raw.get("fields")
    if isinstance(answers, list) and len(answers) == len(dev.field_ids):
        _parse_fields(dev, answers, f, links)
    gpm = raw.get("gpm")
    if isinstance(gpm, list):
        for (name, _), answer in zip(GPM_METRICS.items(), gpm, strict=False):
            ok = isinstance(answer, list) and len(answer) == 2 and answer[0] == 0
            # NaN: GPM's two samples were too close together (a REAL H200 answered NaN for
            # DRAM bandwidth over samples taken back to back); no reading, not a bad one
            if ok and (v := _num(answer[1])) is not None and not math.isnan(v):
                f[name] = v
    return f, links


def _parse_fabric(answer: list[Any], f: dict[str, Any]) -> None:
    """``[state, status, health mask or None]``: the GPU's NVLink fabric registration. A
    state outside 1..3 (0 is "not supported") says nothing and is left out."""
    state, status, mask = [*answer, None, None, None][:3]
    if not isinstance(state, int) or not 1 <= state <= FABRIC_STATE_COMPLETED:
        return
    f["fabric_state_code"] = state
    done = state == FABRIC_STATE_COMPLETED
    f["fabric_registered_active"] = done and status == 0
    if done and isinstance(status, int):
        f["fabric_status_code"] = status
    if isinstance(mask, int):
        f["fabric_health_mask_code"] = mask
        for name, shift in FABRIC_HEALTH:
            bits = (mask >> shift) & 0x3
            if bits in (1, 2):
                f[name] = bits == 1


def _parse_fields(
    dev: Device, answers: list[Any], f: dict[str, Any], links: dict[int, dict[str, Any]]
) -> None:
    layout = dev.layout or FieldLayout.of(dev.field_ids, dev.links)
    for name, i, convert in layout.gpu:
        ret, value = answers[i]
        if ret == 0 and _num(value) is not None:
            f[name] = convert(value)
    for link, scoped, flit_i, data_i in layout.links:
        lf: dict[str, Any] = {}
        for name, i, convert in scoped:
            ret, value = answers[i]
            if ret == 0 and value is not None:
                lf[name] = convert(value)
        if flit_i >= 0:
            flit, data = answers[flit_i], answers[data_i]
            if "crc_flit_errors_total" not in lf and flit[0] == 0 and flit[1] is not None:
                lf["crc_flit_errors_total"] = int(flit[1])
            if data[0] == 0 and data[1] is not None:
                lf["crc_data_errors_total"] = int(data[1])
        if lf:
            links[link] = lf
