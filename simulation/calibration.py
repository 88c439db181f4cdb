"""Real marginal distributions (AcmeTrace, Seren A100 cluster) and how we sample them.

Each AcmeTrace file is an empirical CDF published as 1,000 (value, percent) points. The
generator draws values through a Gaussian copula: every GPU carries a latent AR(1) process that
is standard normal at every instant, ``u = Phi(z)`` is uniform, and ``value = F^-1(u)``. So the
*marginal* distribution of each generated metric is the published one whatever the temporal
correlation, and metrics of one GPU are correlated by sharing part of their latent noise.
:func:`ks_distance` measures how close a generated sample is to the published CDF.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np
from numpy.typing import NDArray

DATA_PACKAGE = "gpuwarden.simulation.data"


@dataclass(frozen=True)
class EmpiricalCDF:
    """A published CDF: ``values`` ascending, ``probs`` in [0, 1] non-decreasing."""

    name: str
    values: NDArray[np.float64]
    probs: NDArray[np.float64]

    def ppf(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        """Inverse CDF by linear interpolation between the published points."""
        return np.interp(u, self.probs, self.values)

    def cdf(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        # Right-continuous step through ties (many published values repeat, e.g. 0 % util).
        idx = np.searchsorted(self.values, x, side="right")
        probs = np.concatenate([[0.0], self.probs])
        return probs[idx]

    def ks_distance(self, sample: NDArray[np.float64]) -> float:
        """Kolmogorov-Smirnov distance between ``sample`` and this CDF, evaluated at the
        published points (the only places the real CDF is known)."""
        s = np.sort(np.asarray(sample, dtype=np.float64))
        if s.size == 0:
            raise ValueError(f"{self.name}: empty sample")
        # Where the published CDF repeats a value (a step, e.g. the mass at 0 % util), the
        # CDF at that value is the last of the tied points.
        values, last = np.unique(self.values[::-1], return_index=True)
        probs = self.probs[::-1][last]
        emp = np.searchsorted(s, values, side="right") / s.size
        return float(np.max(np.abs(emp - probs)))


def _read_csv(name: str) -> list[dict[str, str]]:
    text = resources.files(DATA_PACKAGE).joinpath(name).read_text(encoding="utf-8-sig")
    return list(csv.DictReader(text.splitlines()))


def _cdf(name: str, rows: list[dict[str, str]], value_col: str, prob_col: str) -> EmpiricalCDF:
    values = np.array([float(r[value_col]) for r in rows])
    probs = np.array([float(r[prob_col]) for r in rows]) / 100.0
    order = np.argsort(values, kind="stable")
    values, probs = values[order], np.maximum.accumulate(probs[order])
    probs[-1] = 1.0
    return EmpiricalCDF(name, values, probs)


@cache
def acmetrace() -> dict[str, EmpiricalCDF]:
    """The Seren-cluster CDFs, keyed by the catalogue field they calibrate.

    ``ib_send`` / ``ib_recv`` are AcmeTrace's ``ib_send_raw`` / ``ib_recv_raw`` per node; the
    dataset does not state the unit. We read them as MB/s per node (the range, 0 to 23.7 GB/s,
    fits an 8-NIC A100 node), and say so wherever the figure is used.
    """
    util = _read_csv("util_gpu_seren.csv")
    power = _read_csv("gpu_power_seren.csv")
    temp = _read_csv("gpu_temp_seren.csv")
    ib = _read_csv("ib_seren.csv")
    return {
        "gpu_util_pct": _cdf("gpu_util_pct", util, "gpu_util_pct", "cdf1"),
        "mem_used_pct": _cdf("mem_used_pct", util, "gpu_mem_used_pct", "cdf2"),
        "gpm_sm_util_pct": _cdf("sm_active_pct", util, "sm_active_pct", "cdf3"),
        "gpm_sm_occupancy_pct": _cdf("sm_occupancy_pct", util, "sm_occupancy_pct", "cdf5"),
        "power_w": _cdf("gpu_power_w", power, "gpu_power_W", "cdf_pct"),
        "gpu_temp_c": _cdf("gpu_temp_c", temp, "gpu_temp_C", "cdf_pct_gpu_temp"),
        "mem_temp_c": _cdf("mem_temp_c", temp, "gpu_mem_temp_C", "cdf_pct_mem_temp"),
        "ib_send_mb_per_s": _cdf("ib_send", ib, "ib_send_raw", "cdf_pct_send"),
        "ib_recv_mb_per_s": _cdf("ib_recv", ib, "ib_recv_raw", "cdf_pct_recv"),
    }


# How strongly each metric follows a GPU's load latent (the rest is its own noise). Chosen so
# that power and temperature rise with utilisation, as they do on a real GPU.
LOAD_CORRELATION: dict[str, float] = {
    "gpu_util_pct": 1.0,
    "gpm_sm_util_pct": 0.95,
    "gpm_sm_occupancy_pct": 0.9,
    "power_w": 0.85,
    "gpu_temp_c": 0.7,
    "mem_temp_c": 0.65,
    "mem_used_pct": 0.5,
}


@cache
def summit_xid_weights() -> dict[int, int]:
    return {int(r["xid"]): int(r["count_total"]) for r in _read_csv("summit_xid_counts.csv")}


@cache
def lingjun_tors() -> tuple[tuple[str, int], ...]:
    """(switch name, hosts under it) per ToR of the real Lingjun topology, in file order."""
    counts: dict[str, int] = {}
    for r in _read_csv("lingjun_topo.csv"):
        key = f"{r['PSW']}-{r['ASW']}"
        counts[key] = counts.get(key, 0) + 1
    return tuple(counts.items())
