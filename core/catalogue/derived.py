"""What gpuwarden writes of itself and derives: the agent's and the sink's self-reports,
findings, analytics' results, the remediation engine's actions and outcomes, and the
simulator's injected faults."""

from __future__ import annotations

from gpuwarden.core.catalogue.schema import (
    AN,
    IN,
    RM,
    ST,
    A,
    B,
    C,
    F,
    G,
    I,
    Producer,
    S,
    _f,
    _m,
)

_m(
    "agent",
    A,
    "agent self-metrics: per source and cycle, how long it took and whether it worked",
    ("cluster", "node", "source"),
    [
        _f("collect_duration_s", F, "s", G, "wall time of the source's collection"),
        _f("collect_success_active", B, "", ST, "the collection succeeded"),
        _f("points_count", I, "", G, "points the source produced"),
        _f("errors_total", I, "", C, "collection errors since start"),
        _f(
            "implausible_total",
            I,
            "",
            C,
            "readings left out since start as physically impossible (sensor sentinels)",
        ),
        _f("cycle_lag_s", F, "s", G, "how late the cycle started against its schedule"),
        _f("sink_errors_total", I, "", C, "cycles whose points the sink refused (raised)"),
    ],
)
_m(
    "sink",
    A,
    "sink self-metrics: what was written, spooled, retried, rejected and dropped",
    ("cluster", "node", "sink"),
    [
        _f("points_written_total", I, "", C, "points the server acknowledged"),
        _f("points_rejected_total", I, "", C, "points the server refused (400, partial write)"),
        _f("points_invalid_total", I, "", C, "points dropped by the encoder (no valid field)"),
        _f("fields_invalid_total", I, "", C, "fields dropped by the encoder (NaN, inf)"),
        _f(
            "points_unencodable_total",
            I,
            "",
            C,
            "points dropped by the encoder: a name or tag value line protocol cannot carry",
        ),
        _f("points_dropped_total", I, "", C, "points dropped because the spool was full"),
        _f("spool_bytes", I, "B", G, "bytes held in the on-disk spool"),
        _f("spool_memory_bytes", I, "B", G, "bytes of batches waiting in memory (write-behind)"),
        _f("spool_points_count", I, "", G, "points not yet delivered, in memory or on disk"),
        _f("batches_sent_total", I, "", C, "batches acknowledged"),
        _f("retries_total", I, "", C, "send attempts that were retried"),
        _f("send_duration_s", F, "s", G, "duration of the last successful send"),
        _f("sender_errors_total", I, "", C, "failures the sender survived (it backed off)"),
        _f(
            "spool_write_errors_total",
            I,
            "",
            C,
            "spool writes and cursor saves the disk refused (the data waited in memory)",
        ),
        _f(
            "spool_cursor_resets_total",
            I,
            "",
            C,
            "unreadable spool cursors on open: resent from the oldest segment",
        ),
        _f(
            "spool_cut_bytes_total",
            I,
            "B",
            C,
            "bytes of torn or damaged spool records skipped or cut on open",
        ),
    ],
)
_m(
    "finding",
    AN,
    "findings from analytics and the agent's event rules (the Finding contract)",
    (
        "cluster",
        "node",
        "gpu",
        "hca",
        "port",
        "switch",
        "job",
        "rank",
        "kind",
        "severity",
        "source",
    ),
    [
        _f("finding_id", S, "", IN, "stable id for de-duplication"),
        _f("probability_ratio", F, "", G, "probability, for predictions"),
        _f("confidence_ratio", F, "", G, "confidence, for detections"),
        _f("summary", S, "", IN, "one line a person can read"),
        _f("evidence_json", S, "", IN, "the numbers that led to the finding, as JSON"),
    ],
)
_m(
    "mfu",
    AN,
    "model FLOPs utilisation and goodput per job",
    ("cluster", "job", "gpu_model", "dtype", "source"),
    [
        _f("mfu_ratio", F, "", G, "model FLOPs utilisation (PaLM appendix B)"),
        _f("hfu_ratio", F, "", G, "hardware FLOPs utilisation (with recomputation)"),
        _f("model_flops_per_s", F, "FLOP/s", G, "achieved model FLOP/s per GPU"),
        _f("tokens_per_s", F, "tokens/s", G, "job throughput"),
        _f("goodput_ratio", F, "", G, "productive time over elapsed time (ETTR)"),
        _f("estimate_active", B, "", ST, "telemetry-only estimate (from GPM tensor activity)"),
        _f(
            "tensor_active_ratio",
            F,
            "",
            G,
            "GPM tensor-core activity of the job's GPUs while it stepped (the estimate)",
        ),
        _f("model_flops_per_token", F, "FLOP", G, "model FLOPs per token (forward + backward)"),
        _f(
            "flops_assumed_active",
            B,
            "",
            ST,
            "the FLOPs per token rest on an assumption (the job did not report its embeddings)",
        ),
        _f("flops_assumption", S, "", IN, "what the FLOPs per token assumed, for a person"),
    ],
)
_m(
    "straggler",
    AN,
    "ranks, stages or workers persistently slower than their peers",
    ("cluster", "job", "node", "rank", "dp_rank", "stage", "kind"),
    [
        _f("slowdown_ratio", F, "", G, "step time over the peer median"),
        _f("step_time_s", F, "s", G, "the rank's step time"),
        _f("peer_median_step_time_s", F, "s", G, "median step time of its peers"),
        _f("persistence_ratio", F, "", G, "fraction of the window the rank was slow"),
        _f("cause", S, "", IN, "attributed cause: gpu, pcie, nic, link, stage, imbalance, unknown"),
    ],
)
_m(
    "congestion",
    AN,
    "per-port congestion and error rates computed from the counters",
    ("cluster", "node", "hca", "port", "switch"),
    [
        _f("xmit_util_ratio", F, "", G, "transmit throughput over link rate"),
        _f("rcv_util_ratio", F, "", G, "receive throughput over link rate"),
        _f("xmit_wait_ratio", F, "", G, "fraction of time in xmit_wait"),
        _f("cnp_per_s", F, "1/s", G, "CNPs sent and handled per second"),
        _f("ecn_marked_per_s", F, "1/s", G, "ECN-marked packets per second"),
        _f("symbol_errors_per_s", F, "1/s", G, "symbol errors per second"),
        _f("score_ratio", F, "", G, "congestion score used for ranking"),
    ],
)
_m(
    "energy",
    AN,
    "energy per job",
    ("cluster", "job"),
    [
        _f("energy_j", F, "J", G, "energy used in the window"),
        _f("j_per_token", F, "J/token", G, "energy per token"),
        _f("j_per_step", F, "J/step", G, "energy per step"),
        _f("power_w", F, "W", G, "mean power of the job's GPUs"),
    ],
)
_m(
    "failure_risk",
    AN,
    "predicted probability that a GPU or node fails within the horizon",
    ("cluster", "node", "gpu", "horizon"),
    [
        _f("probability_ratio", F, "", G, "calibrated probability of failure within horizon"),
        _f("threshold_ratio", F, "", G, "the model's operating threshold for alerts"),
        _f("alert_active", B, "", ST, "the probability is at or above the threshold"),
        _f("model_version", S, "", IN, "the model that scored it"),
    ],
)
_m(
    "badput",
    AN,
    "per job and analysis window: the time that did not train the model, by cause "
    "(analytics.badput); straggler and mixed_config are inside the productive steps' time",
    ("cluster", "job", "source"),
    [
        _f("elapsed_s", F, "s", G, "the job's first step to its last in the window"),
        _f("productive_s", F, "s", G, "time of the steps it kept"),
        _f("checkpoint_s", F, "s", G, "training time its checkpoint saves held up"),
        _f("recompute_s", F, "s", G, "steps run again after a restart rolled them back"),
        _f("restart_s", F, "s", G, "no step at all: failures, requeue, start-up, loading"),
        _f("hang_s", F, "s", G, "hung at the window's end: its silence so far"),
        _f("straggler_s", F, "s", G, "steps slowed by a straggling rank: what fixing it gives"),
        _f("mixed_config_s", F, "s", G, "the same, for ranks on nodes set up unlike the fleet"),
    ],
)
_m(
    "checkpoint_advice",
    AN,
    "per job that reports its checkpoint saves: the interval that minimises its expected "
    "waste (Young/Daly) from its save time and the fleet's failure rate, against its own",
    ("cluster", "job"),
    [
        _f("advised_interval_s", F, "s", G, "checkpoint interval advised"),
        _f("current_interval_s", F, "s", G, "the job's interval now"),
        _f("save_s", F, "s", G, "median training time a save holds up"),
        _f("mtbf_s", F, "s", G, "the job's mean time between failures (its nodes, the fleet)"),
        _f("waste_current_ratio", F, "", G, "expected share of wall time lost at the current"),
        _f("waste_advised_ratio", F, "", G, "expected share of wall time lost at the advised"),
        _f("history_weight_ratio", F, "", G, "how much of the rate is fleet history, not prior"),
    ],
)
_m(
    "remediation_action",
    RM,
    "actions the remediation engine decided and took, with their outcome (audit trail)",
    ("cluster", "node", "job", "action", "adapter", "outcome"),
    [
        _f("finding_id", S, "", IN, "the finding that led to the action"),
        _f("action_id", S, "", IN, "idempotency key of the action"),
        _f("dry_run_active", B, "", ST, "the action was only simulated"),
        _f("duration_s", F, "s", G, "how long the action took"),
        _f("message", S, "", IN, "what happened, for a person"),
    ],
)
_m(
    "remediation_outcome",
    RM,
    "whether each node the engine took out needed it (confirmed, refuted, unknown), one point "
    "per plan once known",
    ("cluster", "node", "policy", "kind", "verdict"),
    [
        _f("finding_id", S, "", IN, "the finding whose plan took the node out (the plan id)"),
        _f("action_id", S, "", IN, "the plan's cordon/drain and requeue action ids, commas"),
        _f("after_removal_s", F, "s", G, "from the removal to the verdict"),
        _f("message", S, "", IN, "the evidence that decided it, for a person"),
    ],
)
_m(
    "scenario_fault",
    Producer.SCENARIO,
    "SIMULATED ground truth: the faults a scenario injected, one point per phase change",
    ("cluster", "node", "gpu", "hca", "port", "job", "kind", "source"),
    [
        _f("fault_id", S, "", IN, "id of the injected fault, unique within the scenario"),
        _f("phase_code", I, "", ST, "1 precursor starts, 2 onset, 3 repaired"),
        _f("fatal_active", B, "", ST, "the fault takes the GPU, node or job down"),
        _f("xid_code", I, "", ST, "the XID the onset raises, if any"),
        _f("summary", S, "", IN, "what was injected, for a person"),
    ],
)
