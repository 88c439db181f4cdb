"""Why is this rank slow? Its GPU, its NIC, or its links, from its node's own telemetry.

Called for each worker straggler with the node's ``gpu`` samples and port rates over the stretch
the worker was slow. The suspect GPU is compared with the other GPUs of the same node (same
job, same model, same cooling: the fairest peers there are):

Only samples where the GPUs are busy (utilisation at least 50 %) are compared, when the suspect
has enough of them: idle GPUs park their clocks.

* **gpu**: its SM clock is lower than its node peers' (``clock_ratio`` below 0.95), or it spends
  more time than they do in a hardware/thermal/power clock-event reason (power is reported as
  evidence only);
* **pcie**: otherwise, the suspect GPU's PCIe link ran narrower than the GPU and its slot
  allow (``pcie_link_downtrained_active``) for at least half the stretch: its traffic to the
  NIC and the host is slower, though the GPU itself is fine;
* **link**: the node's ports show physical-layer errors (symbol errors, link recoveries, the
  link going down) during the stretch;
* **nic**: the node's ports spend a noticeable share of time blocked (``xmit_wait``) or
  receive ECN marks, i.e. the rank waits on the network;
* **unknown** otherwise: the evidence still lists every number looked at.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics.scalars import num
from core.catalogue import CLOCK_EVENT_REASONS

SLOW_REASONS = (
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_power_cap",
)
BUSY_UTIL_PCT = 50.0
_SLOW_MASK = sum(CLOCK_EVENT_REASONS[r] for r in SLOW_REASONS)


def _median(df: pl.DataFrame, col: str) -> float | None:
    if col not in df.columns or df.is_empty():
        return None
    value = df[col].drop_nulls().median()
    return float(value) if isinstance(value, int | float) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def attribute(
    gpu: pl.DataFrame, ports: pl.DataFrame, suspect_gpu: str
) -> tuple[str, dict[str, Any]]:
    """``(cause, evidence)``. ``gpu``: the node's gpu samples (``gpu`` tag column and the
    catalogue fields); ``ports``: the node's port rates from :func:`congestion.port_rates`."""
    evidence: dict[str, Any] = {"gpu": suspect_gpu}
    cause = "unknown"
    if not gpu.is_empty() and "gpu" in gpu.columns:
        if "clock_event_reasons_code" in gpu.columns:
            gpu = gpu.with_columns(
                ((pl.col("clock_event_reasons_code").fill_null(0) & _SLOW_MASK) > 0).alias(
                    "_slowed"
                )
            )
        if "gpu_util_pct" in gpu.columns:
            # Clocks and power are only comparable while GPUs are busy: an idle GPU parks its
            # clocks, and a busy one among idle peers would look "fast".
            busy = gpu.filter(pl.col("gpu_util_pct") >= BUSY_UTIL_PCT)
            if busy.filter(pl.col("gpu") == suspect_gpu).height >= 5:
                gpu = busy
        mine = gpu.filter(pl.col("gpu") == suspect_gpu)
        peers = gpu.filter(pl.col("gpu") != suspect_gpu)
        clock = _ratio(_median(mine, "sm_clock_mhz"), _median(peers, "sm_clock_mhz"))
        power = _ratio(_median(mine, "power_w"), _median(peers, "power_w"))
        util = _ratio(_median(mine, "gpu_util_pct"), _median(peers, "gpu_util_pct"))
        slowed = peers_slowed = None
        if "_slowed" in gpu.columns and mine.height and peers.height:
            slowed = num(mine["_slowed"].mean())
            peers_slowed = num(peers["_slowed"].mean())
        evidence.update(
            clock_ratio=clock,
            power_ratio=power,
            util_ratio=util,
            throttled_share=slowed,
            peers_throttled_share=peers_slowed,
            temp_c=_median(mine, "gpu_temp_c"),
            peers_temp_c=_median(peers, "gpu_temp_c"),
        )
        # Power is evidence, not a verdict: GPUs of one node differ in draw by 10-20 % at the
        # same work, so a low draw alone blamed healthy GPUs (seen on the congested-ToR
        # benchmark); clocks and clock-event reasons are what a slow GPU shows.
        if (clock is not None and clock < 0.95) or (
            slowed is not None and peers_slowed is not None and slowed - peers_slowed > 0.2
        ):
            cause = "gpu"
        elif "pcie_link_downtrained_active" in mine.columns and mine.height:
            share = num(mine["pcie_link_downtrained_active"].cast(pl.Float64).mean())
            if share:
                evidence.update(
                    pcie_downtrained_share=share,
                    pcie_link_width_count=_median(mine, "pcie_link_width_count"),
                    pcie_link_width_max_count=_median(mine, "pcie_link_width_max_count"),
                )
                if share >= 0.5:
                    cause = "pcie"
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
