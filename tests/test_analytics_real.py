"""Analytics on REAL data (no InfluxDB needed): straggler traces and the BLOOM logbook.

Sources (see ../shared/data/README.md):
* ByteDance-Seed/StragglerAnalysis @ 8efcd7f3, trace-ST (Apache-2.0): a real dp2 x pp4 job whose
  last pipeline stage is the straggler (the paper's what-if attribution is in result-ST.json);
* alibaba/clusterdata cluster-trace-gpu-v2020/mini-batch-time @ 7a6c496e (CC-BY-4.0);
* bigscience-workshop/bigscience @ 9e64edec, the BLOOM-176B training logbook (Apache-2.0).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import polars as pl
import pytest

from gpuwarden.analytics.cli import main
from gpuwarden.analytics.config import load_config as analytics_load_config
from gpuwarden.analytics.counters import IB32_MAX, increases
from gpuwarden.analytics.importers import TraceFormatError, read_minibatch_csv, read_whatif_trace
from gpuwarden.analytics.mfu import (
    JobThroughput,
    ModelShape,
    UnknownGpuError,
    compute_mfu,
    gpu_family,
    peak_flops,
)
from gpuwarden.analytics.stragglers import detect
from gpuwarden.analytics.whatif import job_slowdown, makespan, one_f_one_b
from gpuwarden.core.errors import ConfigError

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if not DATA.exists():
    DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ST = DATA / "bytedance-straggler-st" / "trace-ST.parquet"
ALIBABA = DATA / "alibaba-minibatch-time"
# skipped only where ../shared is not beside the checkout at all (CI always has it); with it
# there, a missing or renamed trace fails rather than passing as skipped
needs_data = pytest.mark.skipif(not DATA.exists(), reason="../shared/data not beside the checkout")


def _cli_json(capsys, *args):
    assert main(["stragglers", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@needs_data
def test_bytedance_last_stage_is_the_straggler_and_no_worker_is_blamed(capsys):
    doc = _cli_json(capsys, "--whatif-trace", str(ST))
    assert doc["source"].startswith("REAL trace: ByteDance-Seed/StragglerAnalysis")
    kinds = [f["kind"] for f in doc["findings"]]
    assert kinds == ["stage"], doc["findings"]
    (stage,) = doc["findings"]
    assert stage["stage"] == 3 == doc["context"]["stages"] - 1
    assert stage["slowdown"] > 1.2 and stage["persistence"] == 1.0
    # the paper's own attribution agrees: stage 3 carries the blocking slowdown
    ref = json.loads((ST.parent / "result-ST.json").read_text())["blocking_decompose_by_stage"]
    assert max(ref, key=ref.get) == "3"
    assert set(stage["compute_op_slowdown"]) == {"forward-compute", "backward-compute"}


@needs_data
def test_bytedance_job_slowdown_is_within_two_percent_of_the_published_what_if(capsys):
    """REAL: the ST trace's published what-if analysis (``ms-ST.json``) simulates 2.173 s per
    step as traced and 1.843 s with no straggler: a job slowdown of 1.179. Ours replays 1F1B
    per step (analytics.whatif)."""
    doc = _cli_json(capsys, "--whatif-trace", str(ST))
    ref = json.loads((ST.parent / "ms-ST.json").read_text())
    published = ref["tori"] / ref["tideal"]
    assert published == pytest.approx(1.1787, abs=1e-4)
    assert doc["job_slowdown"] == pytest.approx(published, rel=0.02)  # 1.161: 1.5 % under
    assert doc["whatif"]["actual_step_s"] == pytest.approx(ref["tori"], rel=0.01)
    assert doc["whatif"]["ideal_step_s"] == pytest.approx(ref["tideal"], rel=0.02)
    assert doc["whatif"]["steps"] == doc["context"]["steps"] == 32


def test_one_f_one_b_by_hand():
    """Two stages, two micro-batches, forward 1 s and backward 2 s everywhere, no hop: stage 0
    F0 [0,1] F1 [1,2]; stage 1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; stage 0 B0 [4,6] B1
    [7,9]: 9 s. A slow last stage (forward 3 s) stretches it to 13 s."""
    assert one_f_one_b(0, 2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert one_f_one_b(1, 2, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    assert makespan([[1, 1], [1, 1]], [[2, 2], [2, 2]], 0.0) == 9.0
    assert makespan([[1, 1], [3, 3]], [[2, 2], [2, 2]], 0.0) == 13.0
    with pytest.raises(ValueError, match="no compute time traced"):
        job_slowdown(
            pl.DataFrame({"dp_rank": [0], "stage": [0], "rank": [0], "step": [1],
                          "optype": ["forward-compute"], "mb_id": [0], "duration": [1.0]})
        )  # fmt: skip


@needs_data
def test_alibaba_job1_worker6_is_flagged_from_the_point_it_turns_slow(capsys):
    doc = _cli_json(capsys, "--minibatch-csv", str(ALIBABA / "job_1_norm.csv"))
    assert "alibaba/clusterdata" in doc["source"]
    by_worker = {f["worker"]: f for f in doc["findings"] if f["kind"] == "worker"}
    assert "6" in by_worker
    six = by_worker["6"]
    raw = pl.read_csv(ALIBABA / "job_1_norm.csv")
    med = raw.group_by("time").agg(pl.col("batch_time_norm").median().alias("m"))
    w6 = raw.filter(pl.col("worker") == 6).join(med, on="time").sort("time")
    first_slow = w6.filter(pl.col("batch_time_norm") > 1.5 * pl.col("m"))["time"][0]
    assert six["onset_step"] == first_slow  # not before, not later
    assert six["slowdown"] > 1.3
    assert max(by_worker.values(), key=lambda f: f["slowdown"])["worker"] == "6"


@needs_data
@pytest.mark.parametrize(
    ("job", "expected"), [(3, {"6", "7", "8", "9"}), (4, {"0", "5", "6", "7", "8"})]
)
def test_alibaba_slow_workers_of_jobs_3_and_4_are_flagged(job, expected):
    found = detect(read_minibatch_csv(ALIBABA / f"job_{job}_norm.csv"))
    assert {f.worker for f in found if f.kind == "worker"} == expected


def test_spread_imbalance_is_not_blamed_on_a_worker():
    """SIMULATED: the slowest worker changes every step (sequence-length imbalance)."""
    rows = []
    for step in range(200):
        for w in range(8):
            rows.append({"worker": str(w), "step": step, "time_s": 1.5 if w == step % 8 else 1.0})
    found = detect(pl.DataFrame(rows))
    assert [f.kind for f in found] == ["spread"]
    assert found[0].slowdown == pytest.approx(1.5)


def test_bad_trace_files_get_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match="missing columns"):
        read_minibatch_csv(bad)
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(TraceFormatError, match="not a readable parquet"):
        read_whatif_trace(tmp_path / "x.parquet")
    assert main(["stragglers", "--minibatch-csv", str(bad)]) == 2
    assert "missing columns" in capsys.readouterr().err


@needs_data
def test_bloom_logbook_149_tflops_is_48_percent_of_an_a100_and_is_hfu():
    """The logbook's iteration (105.22 s, global batch 2048 x 2048 tokens, 384 A100s) with
    BLOOM-176B's published shape (BLOOM paper: 176.2B parameters, 70 layers, hidden 14336,
    sequence 2048, vocabulary 250,880, LM head tied to the token embedding, ALiBi positions,
    activation recomputation on)."""
    log = (DATA / "bloom-chronicles" / "tr11-176B-chronicles.md").read_text()
    m = re.search(
        r"elapsed time per iteration \(s\): ([\d.]+) .*?global batch size:\s+(\d+)"
        r".*?TFLOPs: ([\d.]+)",
        log,
    )
    assert m is not None
    iteration_s, gbs, tflops = float(m[1]), int(m[2]), float(m[3])
    assert tflops * 1e12 / peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == pytest.approx(
        0.48, abs=0.01
    )
    tokens = gbs * 2048
    tp = JobThroughput(1, tokens, iteration_s, iteration_s, iteration_s, 0.0, 0.0, 0, 0)
    shape = ModelShape(
        176.2e9,
        70,
        14336,
        2048,
        384,
        "bf16",
        "NVIDIA A100-SXM4-80GB",
        True,
        vocab_size=250_880,
        tied_head=True,
        embedding_params=250_880 * 14336,
    )  # ALiBi: the token table only
    result = compute_mfu(shape, tp)
    # The logbook's figure counts the recomputed forward (Megatron's: the layers' forward again,
    # not the head's): it is HFU, and it matches ours.
    assert result.hfu == pytest.approx(tflops * 1e12 / 312e12, rel=0.005)
    assert result.mfu == pytest.approx(0.36, abs=0.01)
    assert result.flops is not None and result.flops.assumed == ""  # the shape said enough
    # an old caller (no vocabulary, no tied head) gets the untied assumption: 1.2 % lower HFU
    bare = dataclasses.replace(shape, vocab_size=0, tied_head=None, embedding_params=None)
    old = compute_mfu(bare, tp)
    assert old.hfu == pytest.approx(tflops * 1e12 / 312e12, rel=0.02)
    assert old.flops is not None and "untied head assumed" in old.flops.assumed


def test_peak_table_and_gpu_names():
    assert gpu_family("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert gpu_family("NVIDIA H100 PCIe") == "H100-PCIE"
    assert gpu_family("NVIDIA H200") == "H200"
    assert gpu_family("NVIDIA B200") == "B200"
    assert peak_flops("NVIDIA A100-SXM4-40GB", "bf16") == 312e12
    with pytest.raises(UnknownGpuError, match="no peak"):
        peak_flops("Tesla V100-SXM2-32GB", "fp16")
    with pytest.raises(UnknownGpuError, match="dtype"):
        peak_flops("NVIDIA A100", "fp8")


@pytest.mark.parametrize("name", ["NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GB200"])
def test_a_gpu_whose_peak_is_not_its_siblings_is_not_guessed(name: str, tmp_path: Path) -> None:
    """An NVL card is a PCIe card with a lower peak than the SXM part its name contains, and a
    GB200's GPU is not an HGX B200; before, the name's "H100"/"H200"/"B200" gave the sibling's
    peak and an MFU off by its ratio, silently. Now refused, until the operator states it in
    [mfu] peak_tflops (a dense peak per GPU: the figure here is CONSTRUCTED, not a data sheet's)."""
    with pytest.raises(UnknownGpuError, match=r"\[mfu\] peak_tflops"):
        peak_flops(name, "bf16")
    toml = tmp_path / "analytics.toml"
    toml.write_text('[mfu]\npeak_tflops = { "h100 nvl" = { bf16 = 800 }, "H200-NVL" = '
                    '{ bf16 = 801 }, "GB200" = { bf16 = 802, fp8 = 1604 } }\n')  # fmt: skip
    stated = analytics_load_config(str(toml)).mfu.peak_tflops
    expected = {"NVIDIA H100 NVL": 800e12, "NVIDIA H200 NVL": 801e12, "NVIDIA GB200": 802e12}
    assert peak_flops(name, "bf16", stated) == expected[name]
    assert peak_flops("NVIDIA H200", "bf16", stated) == 989.4e12  # a name it does not contain
    with pytest.raises(UnknownGpuError, match="without 'fp16'"):
        peak_flops("NVIDIA GB200", "fp16", stated)


def test_names_are_matched_on_whole_words() -> None:
    """A stated GPU that is not built in must not take a built-in sibling's name (a review:
    "H20" matched "H200", "A10" "A100", "L4" "L40", by substring), nor a built-in family a
    GPU it is not ("A100" in "RTX A1000"). Of two keys that both name a GPU, the one of most
    words, then the one reaching furthest into its name, wins."""
    stated = {"H20": {"bf16": 148.0}, "A10": {"bf16": 125.0}, "L4": {"bf16": 121.0},
              "L40S": {"bf16": 362.0}, "NVIDIA H100": {"bf16": 1.0},
              "H100 NVL": {"bf16": 835.0}}  # fmt: skip
    for gpu, tflops in [("NVIDIA H200", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0),
                        ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.0), ("NVIDIA H20", 148.0),
                        ("NVIDIA A10", 125.0), ("NVIDIA H100 NVL", 835.0),
                        ("NVIDIA H100 80GB HBM3", 1.0)]:  # fmt: skip
        assert peak_flops(gpu, "bf16", stated) == pytest.approx(tflops * 1e12), gpu
    with pytest.raises(UnknownGpuError, match="no peak"):
        peak_flops("NVIDIA L40", "bf16", stated)
    with pytest.raises(UnknownGpuError, match="no peak"):
        gpu_family("NVIDIA RTX A1000")
    assert gpu_family("NVIDIA GH200 480GB") == "H200"
    assert gpu_family("NVIDIA H100-SXM5-80GB") == "H100-SXM"
    assert gpu_family("NVIDIA A800 80GB PCIe") == "A100"


@pytest.mark.parametrize(
    ("toml", "environ", "said"),
    [
        ('peak_tflops = { "H100 NVL" = { bf16 = -1 } }', {}, "positive number"),
        ('peak_tflops = { "H100 NVL" = { bf16 = inf } }', {}, "positive number"),
        ('peak_tflops = { "H100 NVL" = { bf16 = true } }', {}, "positive number"),
        ('peak_tflops = { "H100 NVL" = 835.5 }', {}, "a table of dtype"),
        ('peak_tflops = { "" = { bf16 = 835.5 } }', {}, "a table of dtype"),
        ('peak_tflops = "H100 NVL=835.5"', {}, "must be a table"),
        ("", {"GPUWARDEN_MFU_PEAK_TFLOPS": "835.5"}, "must be a table"),
    ],
)
def test_stated_peaks_are_refused_unless_they_are_peaks(
    toml: str, environ: dict[str, str], said: str, tmp_path: Path
) -> None:
    path = tmp_path / "analytics.toml"
    path.write_text(f"[mfu]\n{toml}\n")
    with pytest.raises(ConfigError, match=said):
        analytics_load_config(str(path), environ=environ)


def test_counter_increases_handle_reset_and_saturation():
    df = pl.DataFrame(
        {
            "time": [0, 10**9, 2 * 10**9, 3 * 10**9, 4 * 10**9, 5 * 10**9],
            "port": ["1"] * 6,
            "c": [100, 150, 20, IB32_MAX, IB32_MAX, IB32_MAX],
        }
    )
    wide = df.with_columns(pl.Series("c", [0, 2**33, 2**34, 2**35, 2**36, 2**37]))
    assert increases(wide, ["port"], ["c"], ceilings={"c": IB32_MAX})["c_inc"][5] == 2**36
    inc = increases(df, ["port"], ["c"], ceilings={"c": IB32_MAX})["c_inc"].to_list()
    assert inc[0] is None  # no predecessor
    assert inc[1] == 50
    assert inc[2] == 20  # reset: counted from zero
    assert inc[3] == IB32_MAX - 20  # reached the ceiling: still a real increase
    assert inc[4] is None and inc[5] is None  # stuck at the ceiling: unknown, not zero


def test_attribution_tells_gpu_pcie_link_and_nic_apart():
    """SIMULATED node telemetry, built by hand: one case per cause."""
    from gpuwarden.analytics.attribution import attribute

    def gpus(clock3: float, x8_from: int = 20) -> pl.DataFrame:
        """GPU 3's SM clock, and from which sample on its PCIe link runs at x8 of x16."""
        rows = []
        for t in range(20):
            for g in range(8):
                narrow = g == 3 and t >= x8_from
                rows.append(
                    {
                        "time": t,
                        "gpu": str(g),
                        "sm_clock_mhz": clock3 if g == 3 else 1410.0,
                        "power_w": 350.0,
                        "gpu_util_pct": 99.0,
                        "clock_event_reasons_code": 0,
                        "pcie_link_downtrained_active": narrow,
                        "pcie_link_width_count": 8 if narrow else 16,
                        "pcie_link_width_max_count": 16,
                    }
                )
        return pl.DataFrame(rows)

    quiet = pl.DataFrame({"symbol_error_total_inc": [0.0] * 5, "xmit_wait_ratio": [0.0] * 5})
    cause, ev = attribute(gpus(1100.0), quiet, "3")
    assert cause == "gpu" and ev["clock_ratio"] == pytest.approx(1100 / 1410, abs=1e-3)
    errors = quiet.with_columns(pl.Series("symbol_error_total_inc", [0.0, 12.0, 40.0, 3.0, 0.0]))
    assert attribute(gpus(1410.0), errors, "3")[0] == "link"
    waiting = quiet.with_columns(pl.Series("xmit_wait_ratio", [0.2] * 5))
    assert attribute(gpus(1410.0), waiting, "3")[0] == "nic"
    assert attribute(gpus(1410.0), quiet, "3")[0] == "unknown"
    cause, ev = attribute(gpus(1410.0, x8_from=5), errors, "3")  # x8 for 15 of 20 samples
    assert cause == "pcie" and ev["pcie_downtrained_share"] == 0.75
    assert ev["pcie_link_width_max_count"] == 16
    assert attribute(gpus(1410.0, x8_from=15), quiet, "3")[0] == "unknown"  # a quarter: no
    assert attribute(gpus(1100.0, x8_from=0), quiet, "3")[0] == "gpu"  # slow clocks first


@needs_data
def test_the_real_lingjun_topology_has_its_119_tors():
    """REAL: alibaba-lingjun-dataset-2023's 847 hosts under 119 (PSW, ASW) switches; read by
    ASW name alone they were 48 "switches" of hosts from different pods (found by a review
    against the real file, 2026-11-28)."""
    from gpuwarden.analytics.topology import load_topology

    topo = load_topology(DATA / "lingjun-topology" / "topo.csv")
    assert (len(topo), len(set(topo.values()))) == (847, 119)
