"""MFU on a REAL GPU: ``../shared/data/h200-training-run/`` (see its SOURCE.md).

Everything there was measured on one NVIDIA H200: the gpuwarden agent's telemetry at 1 s
(``points.lp``: every point the store held), the step log of a bf16 GPT-style job (1.42 B
parameters, 16,384 tokens a step) sent through the job-side ``Reporter`` and the relay exactly
as its docstring shows (so **no** ``gpu_model``, no vocabulary, no embedding count), the FLOPs
of one step counted by torch's ``FlopCounterMode`` (``truth.json``: 51.4 % MFU against the
H200's dense bf16 peak), and nvidia-smi's readings of the same minutes (``nvidia-smi.csv``).

The store is the real influxd (Debian 1.6.7, the session's server), loaded with ``points.lp``
as it is; the analysis is the real ``gpuwarden analyze run`` command in a subprocess.
"""

from __future__ import annotations

import bisect
import csv
import json
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.store.lineprotocol.strict import parse_lines

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if not DATA.exists():
    DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
RUN = DATA / "h200-training-run"
# skipped only where ../shared is not beside the checkout at all (CI always has it); with it
# there, a missing or renamed run fails rather than passing as skipped
needs_data = pytest.mark.skipif(not DATA.exists(), reason="../shared/data not beside the checkout")


def _truth() -> dict[str, Any]:
    truth: dict[str, Any] = json.loads((RUN / "truth.json").read_text())
    return truth


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


@pytest.fixture(scope="module")
def h200_db(influxd) -> str:
    """A database on the session's influxd holding ``points.lp`` exactly as it was stored."""
    name = "h200_training_run"
    influxd.create_database(name)
    influxd.write(name, (RUN / "points.lp").read_text())
    return name


def _analyze(influxd, db: str, tmp_path: Path, *extra: str) -> str:
    """``gpuwarden analyze run`` over the job's minutes (a minute either side), writing back."""
    truth = _truth()
    conf = tmp_path / "analytics.toml"
    conf.write_text(
        f'[influxdb]\nurl = "{influxd.url}"\ndatabase = "{db}"\n'
        f'[analysis]\nspool_dir = "{tmp_path / "spool"}"\n'
    )
    start, end = truth["start_ns"] - 60 * 10**9, truth["end_ns"] + 60 * 10**9
    args = ["run", "--config", str(conf), "--start", _iso(start), "--end", _iso(end), *extra]
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "analyze", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _query(influxd, db: str, q: str) -> list[dict]:
    body = json.loads(influxd.query(q, db))
    series = body["results"][0].get("series", [])
    return [dict(zip(s["columns"], row, strict=True)) for s in series for row in s["values"]]


@needs_data
def test_real_h200_mfu_is_within_3_percent_of_torchs_counted_flops(influxd, h200_db, tmp_path):
    """REAL (issue 40, must show 1). The job reported its shape as the Reporter's docstring
    shows: no ``gpu_model`` (the GPU's model comes from the agent's ``gpu_info`` for the GPU the
    job ran on) and nothing about its embeddings (analytics assumes a dense decoder with an
    untied head: docs/MFU.md). ``gpuwarden analyze run`` must give MFU within 3 % (relative)
    of the 51.4 % that torch's FlopCounterMode counted. Measured: 50.4 % (-2.0 %); the gap is
    the attention scores the fused attention's backward computes again, which torch counts
    and MFU by PaLM's definition does not (docs/MFU.md)."""
    truth = _truth()
    out = _analyze(influxd, h200_db, tmp_path, "--local")
    rows = _query(influxd, h200_db, "SELECT * FROM mfu WHERE job = 'gpt-a'")
    assert len(rows) == 1, f"no MFU written for gpt-a; analyze said:\n{out}"
    (mfu,) = rows
    assert mfu["estimate_active"] is False
    assert mfu["gpu_model"] == "NVIDIA H200" == truth["device"]  # from gpu_info, not the job
    assert mfu["mfu_ratio"] == pytest.approx(truth["mfu_true_counted"], rel=0.03), out
    assert mfu["mfu_ratio"] == pytest.approx(0.5038, abs=0.0001)  # as docs/MFU.md quotes it
    # the embedding tables are not counted: 6N with N = all parameters was +4.8 % off
    assert mfu["mfu_ratio"] < truth["mfu_formula_total_params"] * 0.98
    counted_tokens_s = truth["tokens_per_step"] / truth["step_s_mean"]
    assert mfu["tokens_per_s"] == pytest.approx(counted_tokens_s, rel=0.005)
    assert round(mfu["tokens_per_s"]) == 54_845 and round(counted_tokens_s) == 54_847
    assert mfu["flops_assumed_active"] is True  # the job said nothing: assumed, and said
    # the GPM estimate beside it (REAL: 58.9 % while the job stepped; it counts what the
    # hardware runs, recomputation and all), and no mfu_mismatch: the shape is right
    assert mfu["tensor_active_ratio"] == pytest.approx(0.589, abs=0.01)
    found = _query(influxd, h200_db, "SELECT finding_id FROM finding WHERE kind = 'mfu_mismatch'")
    assert found == []
    assert "job gpt-a: MFU 50." in out and "GPM tensor activity 58.9%" in out


@needs_data
def test_real_h200_run_with_a_misreported_world_size_raises_mfu_mismatch(influxd, tmp_path):
    """CONSTRUCTED on the REAL run: the same points, plus a later ``job_model`` that says the
    job ran on two GPUs (it ran on one). MFU halves (25 %) while the GPUs' own tensor activity
    stays at 58.9 %: more apart than ``[mfu] mismatch_ratio`` allows, so an ``mfu_mismatch``
    finding names the job."""
    db = "h200_misreported"
    influxd.create_database(db)
    influxd.write(db, (RUN / "points.lp").read_text())
    truth = _truth()
    influxd.write(
        db,
        "job_model,cluster=default,dtype=bf16,job=gpt-a heads_count=16i,hidden_size_count=2048i,"
        "layers_count=24i,params_count=1418842112i,recompute_active=false,seq_len_tokens=2048i,"
        f"world_size_count=2i {truth['start_ns'] + 1}\n",
    )
    out = _analyze(influxd, db, tmp_path, "--local")
    (mfu,) = _query(influxd, db, "SELECT mfu_ratio, tensor_active_ratio FROM mfu")
    assert mfu["mfu_ratio"] == pytest.approx(truth["mfu_true_counted"] / 2, rel=0.03)
    rows = _query(influxd, db, "SELECT evidence_json FROM finding WHERE kind = 'mfu_mismatch'")
    assert len(rows) == 1, out
    evidence = json.loads(rows[0]["evidence_json"])
    assert evidence["ratio"] > 2.0 and evidence["gpu_model"] == "NVIDIA H200"


# -- the agent's readings against nvidia-smi's ------------------------------------------------


def _agent_gpu() -> list[tuple[float, dict]]:
    """The agent's ``gpu`` points (seconds, fields), parsed by the store's strict parser."""
    points = parse_lines((RUN / "points.lp").read_text(), now_ns=0)
    return sorted((p.time_ns / 1e9, dict(p.fields)) for p in points if p.measurement == "gpu")


def _smi() -> list[tuple[float, dict[str, float]]]:
    """nvidia-smi's rows (its timestamps are the VM's clock, UTC, like the agent's)."""
    out = []
    with (RUN / "nvidia-smi.csv").open() as fh:
        rows = csv.reader(fh, skipinitialspace=True)
        header = next(rows)
        for row in rows:
            t = datetime.strptime(row[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC)
            value = dict(zip(header, row, strict=True))
            out.append((t.timestamp(), {
                "power_w": float(value["power.draw [W]"].split()[0]),
                "mem_used_mib": float(value["memory.used [MiB]"].split()[0]),
                "gpu_temp_c": float(value["temperature.gpu"]),
                "gpu_util_pct": float(value["utilization.gpu [%]"].split()[0]),
            }))  # fmt: skip
    return out


@needs_data
def test_real_h200_agent_readings_agree_with_nvidia_smi_over_the_same_minutes():
    """REAL: the agent's NVML readings against nvidia-smi's (``-lms 1000``, beside it), over
    the 90 s the job stepped (truth.json start..end: 700 W, 58.8 GiB, 62 C, 100 % busy).

    The two tools sample about 140 ms apart, and a GPU under a 700 W training load moves a few
    watts, a degree and a percent from one second to the next (both tools show it), so single
    temperature and utilisation readings are not compared one to one; their medians and means
    over the same seconds are. Tolerances, with what was measured:

    * memory used: every pair (each agent sample with nvidia-smi's nearest, within 0.5 s)
      within 0.5 MiB (nvidia-smi prints whole MiB; measured at most 0.19 MiB);
    * power: median of the pairs' absolute differences at most 2.5 W (measured 2.0 W), no
      bias (median signed difference within 1 W, measured -0.16 W), medians within 1 W
      (692.16 W against 691.97 W);
    * temperature and utilisation: medians equal (62 C, 100 %); means within 0.5 (61.77
      against 61.82 C; 99.62 against 99.59 %).
    """
    truth = _truth()
    lo, hi = truth["start_ns"] / 1e9, truth["end_ns"] / 1e9
    agent = [(t, f) for t, f in _agent_gpu() if lo <= t <= hi]
    smi = [(t, f) for t, f in _smi() if lo <= t <= hi]
    assert len(agent) >= 85 and len(smi) >= 85  # 1 s each over 90 s
    smi_t = [t for t, _ in smi]
    pairs = []
    for t, f in agent:
        i = bisect.bisect_left(smi_t, t)
        j = min((k for k in (i - 1, i) if 0 <= k < len(smi)), key=lambda k: abs(smi_t[k] - t))
        if abs(smi_t[j] - t) <= 0.5:
            pairs.append((f, smi[j][1]))
    assert len(pairs) >= 85
    mem = [abs(a["mem_used_bytes"] / 2**20 - s["mem_used_mib"]) for a, s in pairs]
    assert max(mem) <= 0.5
    power = [a["power_w"] - s["power_w"] for a, s in pairs]
    assert statistics.median(abs(d) for d in power) <= 2.5
    assert abs(statistics.median(power)) <= 1.0
    med, mean = statistics.median, statistics.fmean
    assert med(f["power_w"] for _, f in agent) == pytest.approx(
        med(f["power_w"] for _, f in smi), abs=1.0
    )
    for name in ("gpu_temp_c", "gpu_util_pct"):
        ours, theirs = [f[name] for _, f in agent], [f[name] for _, f in smi]
        assert med(ours) == med(theirs), name
        assert mean(ours) == pytest.approx(mean(theirs), abs=0.5), name


@needs_data
def test_real_h200_gpu_model_from_the_nodes_its_ranks_run_on_when_no_gpu_has_its_tag(
    influxd, tmp_path
):
    """CONSTRUCTED on the REAL run: no GPU point carries the job's tag (the agent could not
    attribute its processes) and its ranks report from the agent's node (``gpu0``; in the
    real run the VM's hostname, ``vm``). The GPU model then comes from ``gpu_info`` of every
    GPU on the nodes its ranks run on, and says so; there is no GPM estimate (no job GPUs)."""
    lines = []
    for line in (RUN / "points.lp").read_text().splitlines():
        if line.startswith(("gpu,", "gpu_process,")):
            lines.append(line.replace(",job=gpt-a", ""))
        elif line.startswith(("job_step,", "job_heartbeat,")):
            lines.append(line.replace(",node=vm,", ",node=gpu0,"))
        else:
            lines.append(line)
    db = "h200_untagged"
    influxd.create_database(db)
    influxd.write(db, "\n".join(lines) + "\n")
    out = _analyze(influxd, db, tmp_path, "--local")
    (mfu,) = _query(influxd, db, "SELECT mfu_ratio, tensor_active_ratio, gpu_model FROM mfu")
    assert mfu["gpu_model"] == "NVIDIA H200"
    assert mfu["mfu_ratio"] == pytest.approx(_truth()["mfu_true_counted"], rel=0.03)
    assert mfu["tensor_active_ratio"] is None
    assert "NVIDIA H200 is the model of its nodes' GPUs" in out
