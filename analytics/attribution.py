"""Why is this rank slow? Its GPU, its PCIe link, its node's power, its links or its NIC, from
its node's own telemetry.

Called for each worker straggler with the node's ``gpu`` samples and port rates over the stretch
the worker was slow. The suspect GPU is compared with the other GPUs of the same node (same
job, same model, same cooling, same switch: the fairest peers there are, and the ones that share
every slowdown that is not the GPU's own, a congested switch included).

Clocks are compared like with like: while GPUs are busy (utilisation at least 50 %), busy
samples with busy peers' samples; a suspect busy in fewer than ``MIN_BUSY_SAMPLES`` samples is
compared idle with its idle peers, because an idle GPU parks its clocks. Comparing an idle
suspect's parked clock with busy peers' full clocks blamed GPUs under a congested switch on the
analytics benchmark: a rank waiting on the network idles its GPU, and the parked clock read as
a slow GPU.

* **gpu**: its SM clock is lower than its busy node peers' (``clock_ratio`` below 0.95), or it
  spends a larger share of its busy samples than they do (by more than 0.2) *both* in a
  hardware/thermal/power clock-event reason *and* below their clock. A reason whose clock is
  not lower (a GPU sitting at its software power cap at full clock, as busy GPUs do) slows
  nothing and is reported as evidence only; that mistake blamed a GPU that merely drew more
  power than its peers;
* **pcie**: otherwise, the suspect GPU's PCIe link ran narrower than the GPU and its slot
  allow (``pcie_link_downtrained_active``) for at least half the stretch: its traffic to the
  NIC and the host is slower, though the GPU itself is fine;
* **power**: otherwise, the whole node runs slow: its busy GPUs' median clock is below 95 % of
  their maximum while a power-brake or hardware-slowdown reason (the board's or the rack's
  power or cooling asserting it, not the driver's own power cap) is active in at least half of
  their busy samples;
* **link**: the node's ports show physical-layer errors (symbol errors, link recoveries, the
  link going down) during the stretch;
* **nic**: the node's ports spend a noticeable share of time blocked (``xmit_wait``) or
  receive ECN marks, i.e. the rank waits on the network;
* **unknown** otherwise: the evidence still lists every number looked at.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gpuwarden.analytics.scalars import num
from gpuwarden.core.catalogue import CLOCK_EVENT_REASONS

SLOW_REASONS = (
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_power_cap",
)
#: what the board or the rack asserts (not the driver's own power cap): a node-wide slowdown
POWER_REASONS = ("hw_slowdown", "hw_power_brake_slowdown")
BUSY_UTIL_PCT = 50.0
MIN_BUSY_SAMPLES = 5
CLOCK_RATIO = 0.95
_SLOW_MASK = sum(CLOCK_EVENT_REASONS[r] for r in SLOW_REASONS)
_POWER_MASK = sum(CLOCK_EVENT_REASONS[r] for r in POWER_REASONS)


def _median(df: pl.DataFrame, col: str) -> float | None:
    if col not in df.columns or df.is_empty():
        return None
    value = df[col].drop_nulls().median()
    return float(value) if isinstance(value, int | float) else None


def _mean(df: pl.DataFrame, col: str) -> float | None:
    if col not in df.columns or df.is_empty():
        return None
    return num(df[col].cast(pl.Float64).mean())


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _gpu_cause(gpu: pl.DataFrame, suspect_gpu: str, evidence: dict[str, Any]) -> str:
    """``gpu``, ``pcie``, ``power`` or ``unknown`` from the node's GPU samples; fills
    ``evidence``."""
    reasons = pl.col("clock_event_reasons_code").fill_null(0)
    if "clock_event_reasons_code" in gpu.columns:
        gpu = gpu.with_columns(
            ((reasons & _SLOW_MASK) > 0).alias("_reason"),
            ((reasons & _POWER_MASK) > 0).alias("_power"),
        )
    mine_all = gpu.filter(pl.col("gpu") == suspect_gpu)
    busy = same = gpu
    if "gpu_util_pct" in gpu.columns:
        is_busy = pl.col("gpu_util_pct") >= BUSY_UTIL_PCT
        busy = gpu.filter(is_busy)
        evidence["busy_share"] = _mean(mine_all.with_columns(is_busy.alias("_b")), "_b")
        same = busy
        if busy.filter(pl.col("gpu") == suspect_gpu).height < MIN_BUSY_SAMPLES:
            same = gpu.filter(~is_busy)  # idle with idle: a parked clock against parked clocks
            evidence["compared_while"] = "idle"
    mine = same.filter(pl.col("gpu") == suspect_gpu)
    peers = same.filter(pl.col("gpu") != suspect_gpu)
    evidence.update(
        power_ratio=_ratio(_median(mine_all, "power_w"), _median(peers, "power_w")),
        util_ratio=_ratio(
            _median(mine_all, "gpu_util_pct"),
            _median(gpu.filter(pl.col("gpu") != suspect_gpu), "gpu_util_pct"),
        ),
        temp_c=_median(mine_all, "gpu_temp_c"),
        peers_temp_c=_median(peers, "gpu_temp_c"),
    )
    cause = "unknown"
    peer_clock = _median(peers, "sm_clock_mhz")
    if mine.height >= MIN_BUSY_SAMPLES:
        clock = _ratio(_median(mine, "sm_clock_mhz"), peer_clock)
        evidence["clock_ratio"] = clock
        if "_reason" in gpu.columns and peer_clock and peers.height:
            low = pl.col("sm_clock_mhz") < CLOCK_RATIO * peer_clock
            slowed = _mean(mine.with_columns((pl.col("_reason") & low).alias("_s")), "_s")
            peers_slowed = _mean(peers.with_columns((pl.col("_reason") & low).alias("_s")), "_s")
            evidence.update(
                throttled_share=_mean(mine, "_reason"),
                peers_throttled_share=_mean(peers, "_reason"),
                slowed_share=slowed,
                peers_slowed_share=peers_slowed,
            )
            if (slowed or 0.0) - (peers_slowed or 0.0) > 0.2:
                cause = "gpu"
        if clock is not None and clock < CLOCK_RATIO:
            cause = "gpu"
    else:
        evidence["note"] = "too few samples of the GPU to compare its clocks"
    if cause == "unknown" and "pcie_link_downtrained_active" in mine_all.columns:
        share = _mean(mine_all, "pcie_link_downtrained_active")
        if share:
            evidence.update(
                pcie_downtrained_share=share,
                pcie_link_width_count=_median(mine_all, "pcie_link_width_count"),
                pcie_link_width_max_count=_median(mine_all, "pcie_link_width_max_count"),
            )
            if share >= 0.5:
                cause = "pcie"
    if cause == "unknown" and "_power" in busy.columns and busy.height >= MIN_BUSY_SAMPLES:
        node_clock = _ratio(_median(busy, "sm_clock_mhz"), _median(busy, "sm_clock_max_mhz"))
        braked = _mean(busy, "_power")
        evidence.update(node_clock_ratio=node_clock, node_power_brake_share=braked)
        if node_clock is not None and node_clock < CLOCK_RATIO and (braked or 0.0) >= 0.5:
            cause = "power"
    return cause


def attribute(
    gpu: pl.DataFrame, ports: pl.DataFrame, suspect_gpu: str
) -> tuple[str, dict[str, Any]]:
    """``(cause, evidence)``. ``gpu``: the node's gpu samples (``gpu`` tag column and the
    catalogue fields); ``ports``: the node's port rates from :func:`congestion.port_rates`."""
    evidence: dict[str, Any] = {"gpu": suspect_gpu}
    cause = "unknown"
    if not gpu.is_empty() and "gpu" in gpu.columns:
        cause = _gpu_cause(gpu, suspect_gpu, evidence)
    if cause == "unknown" and not ports.is_empty():
        errors = sum(
            num(ports[c].drop_nulls().sum())
            for c in (
                "symbol_error_total_inc",
                "link_error_recovery_total_inc",
                "link_downed_total_inc",
            )
            if c in ports.columns
        )
        wait = _median(ports, "xmit_wait_ratio")
        ecn = _median(ports, "ecn_marked_share")
        evidence.update(link_errors=errors, xmit_wait_ratio=wait, ecn_marked_share=ecn)
        if errors > 0:
            cause = "link"
        elif (wait or 0.0) >= 0.02 or (ecn or 0.0) >= 0.02:
            cause = "nic"
    return cause, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in evidence.items()}
