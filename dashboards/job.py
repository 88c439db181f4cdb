"""Job: MFU, goodput and throughput from analytics; step time per rank with the stragglers
analytics flagged drawn over it; the XIDs that hit its GPUs; the model's shape and its
energy."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as model

from gpuwarden.dashboards.influxql import Agg, Cond, Scope, agg
from gpuwarden.dashboards.panels import XID_COLUMNS, board, graph, grid, marks, single

UID = "gpuwarden-job"
S = Scope("cluster", "job")


def build() -> model.Dashboard:
    efficiency = [
        single(
            "MFU",
            "Model FLOPs utilisation (PaLM definition) of the last analysis window; an "
            "estimate from GPM tensor activity when the job reports no model shape",
            S("mfu", Agg("last", "mfu_ratio"), every=False),
            unit="percentunit",
            thresholds=((None, "red"), (0.3, "orange"), (0.4, "green")),
        ),
        single(
            "HFU",
            "Hardware FLOPs utilisation (counts activation recomputation)",
            S("mfu", Agg("last", "hfu_ratio"), every=False),
            unit="percentunit",
        ),
        single(
            "Goodput",
            "Share of wall time spent on steps that were kept (not redone after a restart)",
            S("mfu", Agg("last", "goodput_ratio"), every=False),
            unit="percentunit",
            thresholds=((None, "red"), (0.8, "orange"), (0.95, "green")),
        ),
        single(
            "Tokens per second",
            "Whole job, last analysis window",
            S("mfu", Agg("last", "tokens_per_s"), every=False),
            unit="suffix: tok/s",
        ),
        single(
            "Energy per token",
            "GPU energy from the energy counters over tokens trained",
            S("energy", Agg("last", "j_per_token"), every=False),
            unit="suffix: J/token",
        ),
        single(
            "Model FLOP/s per GPU",
            "Model FLOPs per second per GPU",
            S("mfu", Agg("last", "model_flops_per_s"), every=False),
            unit="flops",
        ),
    ]
    trend = [
        graph(
            "MFU, HFU and goodput",
            "Per analysis window; tensor_active_ratio is the GPUs' own GPM tensor activity beside "
            "it (far apart: an mfu_mismatch finding); estimate_active marks MFU estimated from "
            "GPM alone (docs/MFU.md)",
            S(
                "mfu",
                agg("last", "mfu_ratio", "hfu_ratio", "tensor_active_ratio", "goodput_ratio"),
                group_tags=("job",),
            ),
            S("mfu", Agg("last", "estimate_active"), group_tags=("job",)),
            unit="percentunit",
            alias="$tag_job $col",
            points=True,
        ),
        graph(
            "Throughput",
            "Tokens per second",
            S("mfu", Agg("last", "tokens_per_s"), group_tags=("job",)),
            unit="suffix: tok/s",
            alias="$tag_job",
            points=True,
        ),
    ]
    steps = [
        graph(
            "Step time per rank (stragglers as points)",
            "A: each rank's own step time (compute, without waiting in collectives). "
            "B: the ranks analytics flagged as stragglers, at their slow step time",
            S("job_step", Agg("mean", "step_time_s"), group_tags=("job", "rank")),
            S(
                "straggler",
                Agg("last", "step_time_s", "straggler_step_time_s"),
                group_tags=("job", "rank", "kind"),
            ),
            unit="s",
            alias=["rank $tag_rank", "STRAGGLER rank $tag_rank ($tag_kind)"],
            w=24,
            h=10,
        ),
        graph(
            "Step time spread",
            "Slowest, median and fastest rank per interval: the synchronous step waits for "
            "the slowest",
            S(
                "job_step",
                Agg("max", "step_time_s", "slowest"),
                Agg("median", "step_time_s", "median"),
                Agg("min", "step_time_s", "fastest"),
                group_tags=("job",),
            ),
            unit="s",
            alias="$tag_job $col",
        ),
        graph(
            "Steps, tokens and samples",
            "Step index reached and work per step, as the training reporter wrote them",
            S(
                "job_step",
                agg("max", "step_index", "tokens_count", "samples_count"),
                group_tags=("job",),
            ),
            S("job_step", Agg("mean", "loss_ratio"), group_tags=("job",)),
            unit="none",
            alias="$tag_job $col",
        ),
        graph(
            "Time since each rank's last step (heartbeats)",
            "From each rank's reporter thread every 30 s, whatever its training loop does: a "
            "saw-tooth near zero while the job steps; lines that climb together are a hang "
            "(analytics says job_hang past the job's own patience), one that climbs alone a "
            "rank stuck between steps. in_step_active tells which ranks wait inside a step",
            S("job_heartbeat", Agg("max", "since_step_s"), group_tags=("job", "rank")),
            unit="s",
            alias="rank $tag_rank",
            w=24,
        ),
        graph(
            "Badput by cause",
            "From analytics (badput), per analysis window: the time that did not train the "
            "model, by cause. checkpoint, recompute, restart and hang are outside the kept "
            "steps; straggler and mixed_config are inside them (what fixing the slow rank, "
            "or its node's setting, would give back)",
            S(
                "badput",
                agg(
                    "sum",
                    "checkpoint_s",
                    "recompute_s",
                    "restart_s",
                    "hang_s",
                    "straggler_s",
                    "mixed_config_s",
                ),
                group_tags=("job",),
            ),
            unit="s",
            alias="$tag_job $col",
            w=24,
        ),
        graph(
            "Checkpoint interval: the job's and the advised",
            "From analytics (checkpoint_advice): the interval that minimises the job's "
            "expected waste (Young/Daly) from what its saves cost (job_checkpoint) and its "
            "nodes' failure rate (the fleet's faults over the StepFun prior), against the "
            "interval it checkpoints at",
            S(
                "checkpoint_advice",
                agg("last", "current_interval_s", "advised_interval_s", "save_s"),
                group_tags=("job",),
            ),
            unit="s",
            alias="$tag_job $col",
        ),
        graph(
            "Expected waste at each interval",
            "Share of wall time the job is expected to lose to saving, recomputation and "
            "restarts at its interval and at the advised one",
            S(
                "checkpoint_advice",
                agg("last", "waste_current_ratio", "waste_advised_ratio"),
                group_tags=("job",),
            ),
            unit="percentunit",
            alias="$tag_job $col",
        ),
        grid(
            "Stragglers",
            "What analytics flagged: the rank, node or stage, how much slower than its "
            "peers, for how much of the window, and the likely cause",
            S.latest(
                "straggler",
                (
                    "job",
                    "kind",
                    "rank",
                    "node",
                    "stage",
                    "dp_rank",
                    "slowdown_ratio",
                    "step_time_s",
                    "peer_median_step_time_s",
                    "persistence_ratio",
                    "cause",
                ),
                limit=200,
            ),
        ),
    ]
    events = [
        grid(
            "GPU events (XID) that hit the job",
            "Newest first: the XIDs and lost GPUs on the job's GPUs (or naming its processes) "
            "while it ran, with the rank hit and NVIDIA's recommended resolution",
            S.latest(
                "gpu_event",
                ("job", "rank", "node", "gpu", *XID_COLUMNS, "source"),
                limit=200,
            ),
            h=6,
        ),
    ]
    model_rows = [
        grid(
            "Model and parallelism",
            "What the training reporter declared: shape, parallelism, precision and GPU",
            S.latest(
                "job_model",
                (
                    "job",
                    "dtype",
                    "gpu_model",
                    "params_count",
                    "layers_count",
                    "hidden_size_count",
                    "heads_count",
                    "seq_len_tokens",
                    "world_size_count",
                    "tensor_parallel_count",
                    "pipeline_parallel_count",
                    "recompute_active",
                ),
                limit=20,
            ),
            h=5,
        ),
    ]
    return board(
        UID,
        "gpuwarden / Job",
        "Training efficiency (MFU, goodput), step time per rank and stragglers",
        [
            ("Efficiency", efficiency),
            ("Trend", trend),
            ("Step time", steps),
            ("GPU events", events),
            ("Model", model_rows),
        ],
        scope=S,
        annotations=[
            marks(
                S,
                "Job findings",
                "finding",
                "summary",
                "kind",
                "orange",
                where=(Cond("job", "!=", ""),),
            ),
            marks(S, "XIDs on the job's GPUs", "gpu_event", "message", "event", "red"),
        ],
    )
