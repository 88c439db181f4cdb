"""Scenario generator: calibration against real CDFs, fault signatures, seeds, job behaviour.

Everything generated here is SIMULATED; the distributions it is compared with are real
(AcmeTrace, Seren A100 cluster) and the fault process is replayed from the real StepFun trace.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from gpuwarden.analytics.drift import DriftConfig, find_drift
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.faulttrace import stepfun_faults
from gpuwarden.simulation.calibration import acmetrace
from gpuwarden.simulation.faults import DEFAULTS
from gpuwarden.simulation.generator import TAGS, ScenarioGenerator
from gpuwarden.simulation.spec import (
    FAULT_TYPES,
    ScenarioError,
    library_names,
    load_spec,
    parse_spec,
)

JOB = {"name": "j", "nodes": 4, "tp": 8, "pp": 4, "step_time_s": 5.0}


def _run(faults, *, nodes=6, duration_s=3600, interval_s=10, seed=0, jobs=(JOB,), **kw):
    spec = parse_spec(
        {
            "name": "t",
            "nodes": nodes,
            "duration_s": duration_s,
            "interval_s": interval_s,
            "nvlink_links": 2,
            "jobs": list(jobs),
            "faults": faults,
            **kw,
        }
    )
    gen = ScenarioGenerator(spec, seed)
    out: dict[str, list[pl.DataFrame]] = {}
    for chunk in gen.chunks():
        for m, df in chunk.items():
            out.setdefault(m, []).append(df)
    return gen, {m: pl.concat(v, how="diagonal_relaxed") for m, v in out.items()}


def _series(df, t0_ns, **match):
    cond = pl.lit(True)
    for k, v in match.items():
        cond = cond & (pl.col(k) == v)
    sel = df.filter(cond).sort("time")
    return sel.with_columns(((pl.col("time") - t0_ns) / 1e9).alias("t"))


# -- must-show 2: calibration -------------------------------------------------------------


def test_generated_marginals_match_acmetrace_cdfs():
    """KS distance between generated values and the real Seren CDFs, at tolerance 0.05."""
    spec = parse_spec(
        {
            "name": "calibration",
            "nodes": 32,
            "duration_s": 3 * 86400,
            "interval_s": 300,
            "measurements": ["gpu", "ib_port"],
            "jobs": [{"name": f"j{i}", "nodes": 4} for i in range(4)],
        }
    )
    gen = ScenarioGenerator(spec, seed=11)
    chunks = list(gen.chunks())
    gpu = pl.concat([c["gpu"] for c in chunks])
    ib = pl.concat([c["ib_port"] for c in chunks])
    cdfs = acmetrace()
    samples = {
        "gpu_util_pct": gpu["gpu_util_pct"],
        "power_w": gpu["power_w"],
        "gpu_temp_c": gpu["gpu_temp_c"],
        "mem_temp_c": gpu["mem_temp_c"],
        "mem_used_pct": gpu["mem_used_bytes"] / gpu["mem_total_bytes"] * 100,
    }
    per_node = (
        ib.group_by("node", "time")
        .agg(pl.col("port_xmit_data_bytes_total", "port_rcv_data_bytes_total").sum())
        .sort("node", "time")
    )
    for col, key in (
        ("port_xmit_data_bytes_total", "ib_send_mb_per_s"),
        ("port_rcv_data_bytes_total", "ib_recv_mb_per_s"),
    ):
        rate = per_node.select((pl.col(col).diff().over("node") / 300 / 1e6).alias("r"))
        samples[key] = rate["r"].drop_nulls()
    print("\nKS distance, simulated vs AcmeTrace Seren (real) CDFs:")
    for key, sample in samples.items():
        d = cdfs[key].ks_distance(sample.to_numpy())
        print(f"  {key:20s} KS={d:.4f}  (n={len(sample)})")
        assert d < 0.05, (key, d)


def test_ks_distance_detects_a_wrong_distribution():
    cdf = acmetrace()["power_w"]
    assert cdf.ks_distance(np.full(1000, 300.0)) > 0.3
    assert cdf.ks_distance(cdf.ppf(np.random.default_rng(0).uniform(size=20000))) < 0.02


# -- must-show 3: one test per fault type ---------------------------------------------------


def test_every_fault_type_has_a_signature_test():
    tested = {
        name[len("test_signature_") :] for name in globals() if name.startswith("test_signature_")
    }
    assert tested == set(FAULT_TYPES)
    assert set(DEFAULTS) == set(FAULT_TYPES)


def test_every_fault_type_that_slows_ranks_names_their_cause():
    """The ground truth the attribution is scored against (simulation.causes)."""
    from gpuwarden.simulation.causes import CAUSES
    from gpuwarden.simulation.faulttypes import REGISTRY, FaultType

    slows = {n for n, t in REGISTRY.items() if type(t).slowdown is not FaultType.slowdown}
    named = {n for n, t in REGISTRY.items() if t.cause is not None}
    assert slows == named
    assert {REGISTRY[n].cause for n in named} == set(CAUSES)


def test_signature_xid79():
    gen, out = _run([{"type": "xid79", "at_s": 1800, "node": 1, "gpu": 2}])
    ev = out["gpu_event"]
    assert ev.filter(pl.col("xid_code") == 79).height == 1
    assert ev["fatal_active"].all()
    g = _series(out["gpu"], gen.spec.start_ns, node="node-001", gpu="2")
    assert g["t"].max() < 1800 and g.height == 180  # no warning, then silence
    other = _series(out["gpu"], gen.spec.start_ns, node="node-001", gpu="3")
    assert other["t"].max() >= 3590


def test_signature_ecc_row_remap():
    gen, out = _run(
        [
            {
                "type": "ecc_row_remap",
                "at_s": 3000,
                "precursor_s": 2400,
                "node": 2,
                "gpu": 5,
                "xid": 95,
            }
        ],
        duration_s=3600,
    )
    g = _series(out["gpu"], gen.spec.start_ns, node="node-002", gpu="5")
    before = g.filter(pl.col("t") < 600)
    pre = g.filter((pl.col("t") >= 600) & (pl.col("t") < 3000))
    sbe = pre["ecc_sbe_volatile_total"].to_numpy()
    first, second = np.diff(sbe[: len(sbe) // 2]).sum(), np.diff(sbe[len(sbe) // 2 :]).sum()
    assert second > 3 * first > 0  # correctable errors accelerate
    assert before["remapped_rows_correctable_total"].max() == 0
    assert pre["remapped_rows_correctable_total"].max() == 3
    assert (
        pre["remapped_rows_pending_active"].any()
        and not before["remapped_rows_pending_active"].any()
    )
    after = g.filter(pl.col("t") >= 3000)
    assert after["ecc_dbe_volatile_total"].min() == 1 and pre["ecc_dbe_volatile_total"].max() == 0
    assert after["remapped_rows_uncorrectable_total"].min() == 1
    assert after["remapped_rows_failure_active"].all()
    assert out["gpu_event"]["xid_code"].to_list() == [95]
    peer = _series(out["gpu"], gen.spec.start_ns, node="node-002", gpu="4")
    assert peer["ecc_dbe_volatile_total"].max() == 0


def test_signature_nvlink_crc_storm():
    gen, out = _run(
        [
            {
                "type": "nvlink_crc_storm",
                "at_s": 2400,
                "precursor_s": 1800,
                "node": 0,
                "gpu": 1,
                "link": 1,
            }
        ]
    )
    nv = out["gpu_nvlink"]
    bad = _series(nv, gen.spec.start_ns, node="node-000", gpu="1", link="1")
    good = _series(nv, gen.spec.start_ns, node="node-000", gpu="1", link="0")
    assert bad["crc_flit_errors_total"].max() > 100 and good["crc_flit_errors_total"].max() == 0
    assert bad["replay_errors_total"].max() > 0
    assert bad.filter(pl.col("t") < 600)["crc_flit_errors_total"].max() == 0
    assert not bad.filter(pl.col("t") >= 2400)["link_up_active"].any()
    assert bad.filter(pl.col("t") < 2400)["link_up_active"].all()
    assert bad["recovery_errors_total"].max() == 1
    assert out["gpu_event"]["xid_code"].to_list() == [74]


def test_signature_pcie_replay():
    gen, out = _run(
        [{"type": "pcie_replay", "at_s": 2400, "precursor_s": 1800, "node": 3, "gpu": 0}]
    )
    g = _series(out["gpu"], gen.spec.start_ns, node="node-003", gpu="0")
    assert g.filter(pl.col("t") < 600)["pcie_replay_total"].max() == 0
    assert g["pcie_replay_total"].max() > 100
    assert g.filter(pl.col("t") >= 2400)["pcie_link_width_count"].unique().to_list() == [8]
    assert g.filter(pl.col("t") < 2400)["pcie_link_width_count"].unique().to_list() == [16]
    # as the agent writes them: the widest link allowed, and whether this one runs narrower
    assert g["pcie_link_width_max_count"].unique().to_list() == [16]
    assert g.filter(pl.col("t") >= 2400)["pcie_link_downtrained_active"].all()
    assert not g.filter(pl.col("t") < 2400)["pcie_link_downtrained_active"].any()


def test_signature_thermal_slowdown():
    gen, out = _run(
        [{"type": "thermal_slowdown", "at_s": 1800, "precursor_s": 1200, "node": 1, "gpu": 4}]
    )
    g = _series(out["gpu"], gen.spec.start_ns, node="node-001", gpu="4")
    on = g.filter(pl.col("t") >= 1800)
    assert on["gpu_temp_c"].min() >= 89
    assert on["clock_event_hw_thermal_slowdown_active"].all()
    assert on["clock_event_sw_thermal_slowdown_active"].all()
    assert not g.filter(pl.col("t") < 1800)["clock_event_hw_thermal_slowdown_active"].any()
    assert on["sm_clock_mhz"].max() <= 0.71 * gen.profile.sm_max
    _assert_rank_slow(out["job_step"], gen.spec.start_ns, rank="12", after=1800)


def _assert_rank_slow(steps, t0, rank, after, ratio=1.1):
    s = steps.with_columns(((pl.col("time") - t0) / 1e9).alias("t"))
    late = s.filter(pl.col("t") > after + 60)
    slow = late.filter(pl.col("rank") == rank)["step_time_s"].median()
    peers = late.filter(pl.col("rank") != rank)["step_time_s"].median()
    early = s.filter((pl.col("t") < after) & (pl.col("rank") == rank))["step_time_s"].median()
    assert slow > ratio * peers, (slow, peers)
    assert early < 1.06 * peers


def test_signature_power_brake():
    gen, out = _run([{"type": "power_brake", "at_s": 1800, "node": 2}])
    g = out["gpu"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    node = g.filter((pl.col("node") == "node-002") & (pl.col("t") >= 1800))
    assert node["clock_event_hw_power_brake_slowdown_active"].all()
    assert node["gpu"].n_unique() == 8
    assert node["sm_clock_mhz"].max() <= 0.51 * gen.profile.sm_max
    assert not g.filter(pl.col("node") != "node-002")[
        "clock_event_hw_power_brake_slowdown_active"
    ].any()
    steps = out["job_step"]
    for r in ("16", "23"):  # ranks on node-002
        _assert_rank_slow(steps, gen.spec.start_ns, rank=r, after=1800)


def test_signature_ib_flap():
    gen, out = _run(
        [{"type": "ib_flap", "at_s": 2400, "precursor_s": 1800, "node": 4, "hca": 3}], nodes=6
    )
    ib = _series(out["ib_port"], gen.spec.start_ns, node="node-004", hca="mlx5_3")
    peer = _series(out["ib_port"], gen.spec.start_ns, node="node-004", hca="mlx5_2")
    pre = ib.filter(pl.col("t") < 2400)
    assert pre.filter(pl.col("t") < 600)["symbol_error_total"].max() == 0
    assert pre["symbol_error_total"].max() > 100 and peer["symbol_error_total"].max() == 0
    assert pre["link_downed_total"].max() == 0 and pre["state_code"].unique().to_list() == [4]
    on = ib.filter(pl.col("t") >= 2400)
    assert on["link_downed_total"].max() == 2  # flaps at 2400 and 3000 within the hour
    down = on.filter(pl.col("state_code") == 1)
    assert down.height and (down["phys_state_code"] == 3).all()
    x = down["port_xmit_data_bytes_total"].to_numpy()
    assert (np.diff(x) == 0).all()  # no traffic while down


def test_signature_tor_congestion():
    gen, out = _run(
        [{"type": "tor_congestion", "at_s": 1200, "duration_s": 1200, "node": 0}], nodes=6
    )
    ib = out["ib_port"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    sw = gen.switch_of[0]
    under = [gen.node_names[i] for i, s in enumerate(gen.switch_of) if s == sw]
    assert len(under) >= 2
    last = ib.filter(pl.col("t") == ib["t"].max())
    cong = last.filter(pl.col("node").is_in(under))
    assert (cong["port_xmit_wait_total"] > 1e9).all() and (cong["np_cnp_sent_total"] > 0).all()
    assert (cong["np_ecn_marked_roce_packets_total"] > 0).all()
    rest = last.filter(~pl.col("node").is_in(under))
    assert (rest["port_xmit_wait_total"] == 0).all()
    before = ib.filter((pl.col("t") < 1200) & pl.col("node").is_in(under))
    assert before["port_xmit_wait_total"].max() == 0


def test_signature_slow_gpu():
    gen, out = _run([{"type": "slow_gpu", "at_s": 1200, "node": 1, "gpu": 3, "severity": 0.3}])
    g = _series(out["gpu"], gen.spec.start_ns, node="node-001", gpu="3")
    on = g.filter((pl.col("t") >= 1200) & (pl.col("gpu_util_pct") > 0))
    assert on["sm_clock_mhz"].max() < 0.85 * gen.profile.sm_max
    _assert_rank_slow(out["job_step"], gen.spec.start_ns, rank="11", after=1200)


def test_signature_slow_stage():
    gen, out = _run([{"type": "slow_stage", "at_s": 1200, "job": "j", "stage": 3}])
    s = out["job_step"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    late = s.filter(pl.col("t") > 1300).with_columns(
        (pl.col("rank").cast(pl.Int64) // 8).alias("stage")
    )
    med = late.group_by("stage").agg(pl.col("step_time_s").median()).sort("stage")["step_time_s"]
    assert med[3] > 1.2 * med[0] and abs(med[0] - med[1]) < 0.05 * med[0]
    # no hardware signature: the stage's GPUs look like everyone else's
    gpu = out["gpu"].filter(pl.col("job") == "j")
    assert not gpu["clock_event_hw_slowdown_active"].any()


def test_signature_hang():
    hang = {"type": "hang", "at_s": 1200, "duration_s": 900, "job": "j", "node": 2, "gpu": 5}
    gen, out = _run([hang])
    s = out["job_step"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    assert s.filter((pl.col("t") > 1200) & (pl.col("t") < 2100)).height == 0
    assert s.filter(pl.col("t") > 2100).height > 0
    g = out["gpu"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    hung = g.filter((pl.col("t") >= 1200) & (pl.col("t") < 2100) & (pl.col("job") == "j"))
    culprit = (pl.col("node") == gen.node_names[2]) & (pl.col("gpu") == "5")
    spin, idle = hung.filter(~culprit), hung.filter(culprit)
    assert (spin["gpu_util_pct"] == 100).all() and spin["power_w"].max() <= 0.3 * 400 + 1e-6
    assert idle.height and (idle["gpu_util_pct"] == 0).all()
    # the reporters keep beating: the time since the last step climbs on every rank, and the
    # culprit (rank 2 x 8 + 5) waits between steps while the others wait inside one
    b = out["job_heartbeat"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    during = b.filter((pl.col("t") >= 1500) & (pl.col("t") < 2100))
    assert during.height == 20 * 32 and (during["since_step_s"] >= 1500 - 1200 - 5).all()
    assert set(during.filter(~pl.col("in_step_active"))["rank"]) == {"21"}
    before = b.filter(pl.col("t") < 1200)
    assert before["in_step_active"].all() and before["since_step_s"].max() < 2 * 5.0 * 1.1
    after = b.filter(pl.col("t") > 2100 + 60)  # restarted: stepping again, from its checkpoint
    assert after["since_step_s"].max() < 2 * 5.0 * 1.1 and after["step_index"].min() >= 1
    fields = ("step_index", "since_step_s", "in_step_active")
    for row in b.head(40).iter_rows(named=True):
        tags = {k: row[k] for k in TAGS["job_heartbeat"]}
        check_point("job_heartbeat", tags, {k: row[k] for k in fields if row[k] is not None})
    # a culprit outside the job (node 5 is not one of its 4) leaves every GPU spinning
    gen, out = _run([hang | {"node": 5}])
    g = out["gpu"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    hung = g.filter((pl.col("t") >= 1200) & (pl.col("t") < 2100) & (pl.col("job") == "j"))
    assert (hung["gpu_util_pct"] == 100).all()


def test_signature_node_down():
    gen, out = _run([{"type": "node_down", "at_s": 1800, "duration_s": 900, "node": 5}])
    g = out["gpu"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    n = g.filter(pl.col("node") == "node-005")
    assert n.filter((pl.col("t") >= 1800) & (pl.col("t") < 2700)).height == 0
    assert n.filter(pl.col("t") >= 2700).height == 8 * 90
    ib = out["ib_port"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    assert (
        ib.filter((pl.col("node") == "node-005") & (pl.col("t").is_between(1800, 2690))).height == 0
    )


def test_signature_config_drift():
    gen, out = _run(
        [{"type": "config_drift", "at_s": 1200, "duration_s": 1200, "node": 4, "gpu": 2}]
    )
    info = out["gpu_info"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    assert sorted(info["t"].unique()) == [0, 600, 1200, 1800, 2400, 3000]  # every 600 s
    assert info.height == 6 * 6 * 8  # every GPU of the 6 nodes each time
    odd = info.filter(pl.col("driver_version") != "550.90.07")
    assert set(odd["node"]) == {"node-004"} and sorted(odd["t"].unique()) == [1200, 1800]
    assert set(odd["driver_version"]) == {"535.129.03"} and odd.height == 2 * 8
    no_ecc = info.filter(~pl.col("ecc_mode_active"))
    assert set(zip(no_ecc["node"], no_ecc["gpu"], strict=True)) == {("node-004", "2")}
    assert no_ecc["ecc_mode_pending_active"].all()
    # the analytics name that node while the fault is on, and nobody after its repair
    on = find_drift(info.filter(pl.col("t") <= 1800), DriftConfig())
    assert [(d.node, {x.field for x in d.differences}) for d in on] == [
        ("node-004", {"driver_version", "ecc_mode_active"})
    ]
    assert find_drift(info, DriftConfig()) == []


# -- jobs -----------------------------------------------------------------------------------


def test_fatal_fault_restarts_the_job_on_a_spare_from_its_checkpoint():
    job = {**JOB, "checkpoint_interval_s": 600, "restart_s": 300}
    gen, out = _run([{"type": "xid79", "at_s": 1500, "node": 2, "gpu": 6}], jobs=(job,))
    runs = gen.jobs[0].runs
    assert [(r.start_s, r.end_s) for r in runs] == [(0.0, 1500), (1800, 3600.0)]
    assert 2 not in runs[1].nodes and runs[1].nodes[2] == 4  # first spare took its place
    s = out["job_step"].with_columns(((pl.col("time") - gen.spec.start_ns) / 1e9).alias("t"))
    assert s.filter(pl.col("t").is_between(1500, 1800, closed="none")).height == 0
    before = s.filter(pl.col("t") < 1500)["step_index"].max()
    after = s.filter(pl.col("t") > 1800).sort("time")["step_index"][0]
    ckpt_step = s.filter(pl.col("t") <= 1200)["step_index"].max()
    assert after == ckpt_step + 1 < before  # rolled back: the steps after 1200 s are redone
    moved = s.filter((pl.col("t") > 1800) & (pl.col("rank") == "16"))["node"].unique().to_list()
    assert moved == ["node-004"]


def test_every_generated_point_is_in_the_catalogue():
    _, out = _run(
        [
            {"type": t, "at_s": 600 + 200 * i, "node": i % 6, "job": "j"}
            for i, t in enumerate(FAULT_TYPES)
        ],
        gpu_model="H100",
    )
    for m, df in out.items():
        for row in df.head(200).iter_rows(named=True):
            tags = {t: str(row[t]) for t in TAGS[m] if row.get(t) not in (None, "")}
            fields = {
                k: v for k, v in row.items() if k not in TAGS[m] and k != "time" and v is not None
            }
            assert check_point(m, tags, fields) == [], m


# -- must-show 4: seeds ---------------------------------------------------------------------


def test_same_seed_same_trace_different_seed_different_faults():
    spec = load_spec("week-mixed")

    def faults(seed):
        return [(f.type, f.node, f.onset_s) for f in ScenarioGenerator(spec, seed).faults]

    assert faults(1) == faults(1)
    assert faults(1) != faults(2)
    a = next(ScenarioGenerator(spec, 5).chunks())["gpu"]
    b = next(ScenarioGenerator(spec, 5).chunks())["gpu"]
    c = next(ScenarioGenerator(spec, 6).chunks())["gpu"]
    assert a.equals(b) and not a.equals(c)


def test_stepfun_process_is_the_real_trace_compressed():
    spec = load_spec("week-mixed")
    gen = ScenarioGenerator(spec, 3)
    drawn = [f for f in gen.faults if f.origin.startswith("StepFun")]
    assert drawn, "a 35-day window of the StepFun trace over 64 of 400 servers has faults"
    descs = {f"{r.level} / {r.klass} / {r.desc}" for r in stepfun_faults()}
    assert all(f.origin.removeprefix("StepFun: ") in descs for f in drawn)
    # the expected count: 584 faults x (64/400 servers) x (35 of 349 days)
    expected = 584 * 64 / 400 * (7 * 10 / 349)
    counts = [
        sum(f.origin.startswith("StepFun") for f in ScenarioGenerator(spec, s).faults)
        for s in range(20)
    ]
    assert 0.5 * expected < np.mean(counts) < 1.5 * expected, (np.mean(counts), expected)


# -- specs ----------------------------------------------------------------------------------


def test_library_loads_and_is_valid():
    names = library_names()
    for required in (
        "healthy",
        "xid79-mid-run",
        "ecc-degradation",
        "ib-flap",
        "congested-tor",
        "slow-gpu",
        "slow-stage",
        "hang",
        "week-mixed",
    ):
        assert required in names
    for n in names:
        assert load_spec(n).description


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nodes": 0}, "nodes"),
        ({"faults": [{"type": "meteor", "at_s": 1}]}, "unknown fault type"),
        ({"faults": [{"type": "xid79", "at_s": 99999}]}, "outside the run"),
        ({"faults": [{"type": "xid79", "at_s": 1, "node": 40}]}, "outside the cluster"),
        ({"jobs": [{"name": "a", "nodes": 2, "tp": 3}]}, "do not split"),
        ({"jobs": [{"name": "a", "nodes": 99}]}, "cluster has"),
        ({"colour": "red"}, "unknown keys"),
        ({"faults": [{"type": "hang", "at_s": 1}]}, "needs job"),
    ],
)
def test_bad_specs_get_a_clear_error(data, message):
    with pytest.raises(ScenarioError, match=message):
        parse_spec({"name": "bad", **data})


def test_unknown_library_name_lists_the_library(tmp_path):
    with pytest.raises(ScenarioError, match="the library has"):
        load_spec("no-such-scenario")
    bad = tmp_path / "bad.toml"
    bad.write_text("nodes = [", encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"bad\.toml"):
        load_spec(bad)
