"""FLOPs per token (analytics/mfu.py, docs/MFU.md): which parameters count, what is assumed
when a job does not say, HFU from what is recomputed; the Reporter's fields, old callers too.

CONSTRUCTED shapes worked by hand, except where a test says REAL (the H200 run's truth.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from gpuwarden.analytics.mfu import (
    JobThroughput,
    Mfu,
    MfuConfig,
    ModelShape,
    compute_mfu,
    estimate_ratio,
    flops_per_token,
    job_gpu_model,
)
from gpuwarden.collector.jobside.reporter import Reporter
from gpuwarden.core.catalogue import check_point
from gpuwarden.core.store.lineprotocol import Point

TRUTH = Path(__file__).resolve().parents[2] / "shared/data/h200-training-run/truth.json"
if not TRUTH.exists():
    TRUTH = Path(__file__).resolve().parents[1].parent / "shared/data/h200-training-run/truth.json"

# GPT-2 small (Radford et al. 2019; HF ``gpt2``): 12 layers, hidden 768, vocabulary 50,257,
# 1,024 learned positions, LM head tied to the token table: 124,439,808 parameters
L, H, V, T = 12, 768, 50_257, 1024
GPT2_PARAMS = 124_439_808
TOKEN_TABLE, POSITIONS = V * H, T * H


def shape(params: float, **kw) -> ModelShape:
    base = {
        "layers": L,
        "hidden": H,
        "seq_len": T,
        "world_size": 1,
        "dtype": "bf16",
        "gpu_model": "NVIDIA H100 80GB HBM3",
    }
    return ModelShape(params=params, **{**base, **kw})


def test_tied_head_counts_the_token_table_once_as_the_head():
    """Tied: the token table is the head's matmul weight, so it stays in; only the position
    table, a lookup, leaves: N = params - positions."""
    f = flops_per_token(
        shape(GPT2_PARAMS, vocab_size=V, tied_head=True, embedding_params=TOKEN_TABLE + POSITIONS)
    )
    assert f.matmul_params == GPT2_PARAMS - POSITIONS
    assert f.head_params == TOKEN_TABLE
    assert f.model == 6 * (GPT2_PARAMS - POSITIONS) + 12 * L * H * T
    assert f.assumed == ""


def test_untied_head_leaves_both_input_tables_out_and_counts_the_head():
    """The same model with an untied head has a second vocab x hidden matrix (the head): the
    matmul parameters are the same as the tied model's, the input tables out, the head in."""
    untied = GPT2_PARAMS + TOKEN_TABLE
    f = flops_per_token(
        shape(untied, vocab_size=V, tied_head=False, embedding_params=TOKEN_TABLE + POSITIONS)
    )
    assert f.matmul_params == untied - TOKEN_TABLE - POSITIONS == GPT2_PARAMS - POSITIONS
    assert f.head_params == TOKEN_TABLE and f.assumed == ""
    # 6N over every parameter (the old rule) counts both tables: +28 % on this small model
    assert (6 * untied + 12 * L * H * T) / f.model == pytest.approx(1.276, abs=0.001)


def test_vocab_size_alone_assumes_no_learned_positions_and_says_so():
    tied = flops_per_token(shape(GPT2_PARAMS, vocab_size=V, tied_head=True))
    assert tied.matmul_params == GPT2_PARAMS  # the position table (0.6 %) counted: assumed
    assert "no learned position table" in tied.assumed
    untied = flops_per_token(shape(GPT2_PARAMS + TOKEN_TABLE, vocab_size=V, tied_head=False))
    assert untied.matmul_params == GPT2_PARAMS
    unsaid = flops_per_token(shape(GPT2_PARAMS + TOKEN_TABLE, vocab_size=V))  # tied not said
    assert unsaid.matmul_params == GPT2_PARAMS and "untied" in unsaid.assumed


def test_tied_without_vocab_takes_embedding_params_for_the_token_table():
    f = flops_per_token(shape(GPT2_PARAMS, tied_head=True, embedding_params=TOKEN_TABLE))
    assert f.matmul_params == GPT2_PARAMS and "token table alone" in f.assumed


def test_old_callers_get_a_dense_decoder_with_an_untied_head_assumed():
    """Nothing about the embeddings (every caller before these fields, and the H200 run):
    the layers are taken for 12·L·H², the rest for the token table and an untied head in
    equal parts; half of it counts. Said in ``assumed``."""
    body = 12 * L * H * H
    untied = GPT2_PARAMS + TOKEN_TABLE
    f = flops_per_token(shape(untied))
    rest = untied - body
    assert f.matmul_params == untied - rest / 2 and f.head_params == rest / 2
    assert "untied head assumed" in f.assumed
    # a tied head said, nothing else: the rest is the one table, which is the head: all count
    assert flops_per_token(shape(GPT2_PARAMS, tied_head=True)).matmul_params == GPT2_PARAMS
    # not a dense decoder's count (MoE: far more than 12·L·H²; or less): every parameter,
    # PaLM's 6N, and said
    for params in (3 * body, body / 2):
        g = flops_per_token(shape(params))
        assert g.matmul_params == params and "every parameter counted" in g.assumed


def test_old_positional_model_shape_still_works():
    """``ModelShape(params, layers, hidden, seq_len, world, dtype, gpu, recompute)``, as
    callers built it before the new fields, and an old ``job_model`` row."""
    old = ModelShape(1e9, 24, 2048, 2048, 8, "bf16", "NVIDIA A100-SXM4-80GB", False)
    assert old.vocab_size == 0 and old.tied_head is None and old.embedding_params is None
    row = {
        "params_count": 10**9,
        "layers_count": 24,
        "hidden_size_count": 2048,
        "seq_len_tokens": 2048,
        "world_size_count": 8,
        "dtype": "bf16",
        "recompute_active": False,
    }
    assert ModelShape.from_row(row) == ModelShape(1e9, 24, 2048, 2048, 8, "bf16", "", False)
    new = ModelShape.from_row(
        row
        | {
            "vocab_size_count": 50304,
            "tied_head_active": False,
            "embedding_params_count": 107_216_896,
        }
    )
    assert (new.vocab_size, new.tied_head, new.embedding_params) == (50304, False, 107_216_896)


def test_real_h200_counted_flops_are_palms_plus_the_fused_attention_backward():
    """REAL (truth.json): torch counted 6·(12·L·H² + V·H) + 14·L·H·T FLOPs per token, to the
    FLOP: every matmul weight (the layers' and the untied head's) 6 times, and the attention
    14 times where PaLM's MFU has 12: FlopCounterMode counts five matmuls in the fused
    attention's backward, one of them the scores computed again (recomputation). With the
    embedding count reported, ours is PaLM's 6N + 12·L·H·T with N the matmul parameters
    (biases and LayerNorms, 643,072 here, count 6 each, as in PaLM): 2.1 % under torch's."""
    t = json.loads(TRUTH.read_text())
    layers, hidden, seq, vocab = t["layers"], t["hidden"], t["seq"], t["vocab"]
    counted = t["flops_per_step_counted"] / t["tokens_per_step"]
    weights = 12 * layers * hidden**2 + vocab * hidden
    assert counted == 6 * weights + 14 * layers * hidden * seq
    f = flops_per_token(
        ModelShape(
            t["params_total"],
            layers,
            hidden,
            seq,
            1,
            "bf16",
            "NVIDIA H200",
            vocab_size=vocab,
            tied_head=False,
            embedding_params=t["params_embedding"],
        )
    )
    assert f.matmul_params == t["params_nonembedding"] and f.assumed == ""
    assert f.model / counted == pytest.approx(t["mfu_formula_nonembedding"] / t["mfu_true_counted"])
    assert f.model / counted == pytest.approx(0.979, abs=0.001)
    # the job's report as it stands (no vocabulary, no embeddings): the assumption lands
    # within 0.2 % of the reported count
    bare = flops_per_token(ModelShape(t["params_total"], layers, hidden, seq, 1, "bf16", ""))
    assert bare.matmul_params == pytest.approx(t["params_nonembedding"], rel=0.002)


def test_hfu_counts_what_is_recomputed():
    """Full recomputation: the layers' forward again, not the head's (Megatron: per token
    96·L·H² + 16·L·H·T + 6·V·H for a model of 12·L·H² + V·H matmul weights, tied); with the
    head unknown, PaLM's 8N + 16·L·H·T. Selective: the attention scores' forward again,
    4·L·H·T. Some layers only: that share of the full."""
    weights = 12 * L * H * H + V * H
    tied = shape(weights, vocab_size=V, tied_head=True, embedding_params=V * H, recompute=True)
    f = flops_per_token(tied)
    assert f.hardware == 96 * L * H * H + 16 * L * H * T + 6 * V * H
    assert f.model == 72 * L * H * H + 12 * L * H * T + 6 * V * H
    palm = flops_per_token(shape(weights, embedding_params=0, tied_head=False, recompute=True))
    assert palm.hardware == 8 * weights + 16 * L * H * T
    sel = flops_per_token(
        shape(
            weights,
            vocab_size=V,
            tied_head=True,
            embedding_params=V * H,
            recompute=True,
            recompute_selective=True,
        )
    )
    assert sel.hardware == f.model + 4 * L * H * T
    half = flops_per_token(
        shape(
            weights,
            vocab_size=V,
            tied_head=True,
            embedding_params=V * H,
            recompute=True,
            recompute_layers=L // 2,
        )
    )
    assert half.hardware == f.model + (f.hardware - f.model) / 2
    tp = JobThroughput(10, 10_000, 1.0, 1.0, 1.0, 0.0, 0.0, 0, 10**9)
    assert compute_mfu(shape(weights, vocab_size=V, tied_head=True), tp).hfu is None
    m = compute_mfu(tied, tp)
    assert m.hfu == pytest.approx(m.mfu * f.hardware / f.model)


def test_estimate_ratio_compares_hfu_over_the_same_span():
    cfg = MfuConfig()
    tp = JobThroughput(100, 10**6, 80.0, 100.0, 80.0, 0.0, 20.0, 0, 10**11)
    m = Mfu(0.5, None, 0.0, 0.0, 0.8, 1.0)
    # MFU is over the 80 s the job ran, the estimate over the 100 s from first step to last
    assert estimate_ratio(m, 0.4, tp, "bf16", cfg) == pytest.approx(1.0)
    assert estimate_ratio(m, 0.2, tp, "bf16", cfg) == pytest.approx(2.0)
    assert estimate_ratio(Mfu(0.5, 0.6, 0.0, 0.0, 0.8, 1.0), 0.48, tp, "bf16", cfg) == 1.0
    assert estimate_ratio(m, None, tp, "bf16", cfg) is None  # no GPM (an A100)
    assert estimate_ratio(m, 0.0, tp, "fp32", cfg) is None  # no tensor cores in plain fp32
    idle = Mfu(0.02, None, 0.0, 0.0, 1.0, 1.0)
    assert estimate_ratio(idle, 0.01, tp, "bf16", cfg) is None  # both under mismatch_min
    assert estimate_ratio(m, 0.0, tp, "bf16", cfg) == float("inf")
    with pytest.raises(ValueError, match="mismatch_ratio"):
        MfuConfig(mismatch_ratio=0.0)


def test_gpu_model_of_a_job_from_the_agents_gpu_info():
    placed = pl.DataFrame(
        {"node": ["n1", "n1", "n2"], "gpu": ["0", "1", "0"], "gpu_model": [None, None, None]}
    )
    info = pl.DataFrame(
        {
            "node": ["n1", "n1", "n2", "n3"],
            "gpu": ["0", "1", "0", "0"],
            "gpu_model": ["NVIDIA H200"] * 3 + ["NVIDIA A100-SXM4-80GB"],
        }
    )
    assert job_gpu_model(placed, info) == ("NVIDIA H200", "")  # n3 is not the job's
    mixed = info.with_columns(
        pl.when(pl.col("node") == "n2")
        .then(pl.lit("NVIDIA H100 PCIe"))
        .otherwise(pl.col("gpu_model"))
        .alias("gpu_model")
    )
    model, note = job_gpu_model(placed, mixed)
    assert model == "NVIDIA H200" and "several models" in note
    # no gpu_info (an older agent): the series' own gpu_model tag
    tagged = placed.with_columns(pl.lit("NVIDIA B200").alias("gpu_model"))
    assert job_gpu_model(tagged, info.head(0)) == ("NVIDIA B200", "")
    assert job_gpu_model(placed.head(0), info)[0] == ""


class _Captured(Reporter):
    """A Reporter that keeps its points instead of sending them."""

    def __init__(self) -> None:
        super().__init__(job="j", rank=0, cluster="c", node="n", heartbeat_s=0)
        self.points: list[Point] = []

    def _put(self, point: Point) -> None:
        self.points.append(point)


def test_reporter_old_call_writes_no_new_fields_and_new_fields_when_given():
    old = _Captured()
    old.model(params=10**9, layers=24, hidden_size=2048, heads=16, seq_len=2048, world_size=8)
    (p,) = old.points
    assert set(p.fields) == {
        "params_count",
        "layers_count",
        "hidden_size_count",
        "heads_count",
        "seq_len_tokens",
        "world_size_count",
        "recompute_active",
    }  # absent is not zero
    assert p.fields["recompute_active"] is False
    new = _Captured()
    new.model(
        params=1_418_842_112,
        layers=24,
        hidden_size=2048,
        heads=16,
        seq_len=2048,
        world_size=1,
        vocab_size=50304,
        tied_head=False,
        embedding_params=107_216_896,
        recompute="selective",
    )
    (q,) = new.points
    assert q.fields["vocab_size_count"] == 50304 and q.fields["tied_head_active"] is False
    assert q.fields["embedding_params_count"] == 107_216_896
    assert q.fields["recompute_active"] is True and q.fields["recompute_selective_active"]
    assert check_point("job_model", q.tags, q.fields) == []
    shape = ModelShape.from_row({**q.tags, **q.fields})
    assert flops_per_token(shape).matmul_params == 1_418_842_112 - 107_216_896
    full = _Captured()
    full.model(
        params=1,
        layers=4,
        hidden_size=8,
        heads=1,
        seq_len=8,
        world_size=1,
        recompute="full",
        recompute_layers=2,
    )
    assert full.points[0].fields["recompute_layers_count"] == 2
    with pytest.raises(ValueError, match="recompute"):
        full.model(
            params=1,
            layers=4,
            hidden_size=8,
            heads=1,
            seq_len=8,
            world_size=1,
            recompute="sometimes",
        )
