"""What a training job reports of itself (the job-side reporter, through the relay)."""

from __future__ import annotations

from gpuwarden.core.catalogue.schema import (
    IN,
    ST,
    B,
    F,
    G,
    I,
    R,
    S,
    _f,
    _m,
)

_m(
    "job_step",
    R,
    "one point per training step per rank, from the training-side reporter",
    ("cluster", "node", "job", "rank"),
    [
        _f("step_index", I, "", ST, "step number"),
        _f(
            "step_time_s",
            F,
            "s",
            G,
            "the rank's own time for the step (up to its gradient collective); the wall time "
            "of a synchronous step is equal on all ranks and cannot show who is slow",
        ),
        _f("tokens_count", I, "", G, "tokens processed in the step by this rank"),
        _f("samples_count", I, "", G, "samples processed in the step by this rank"),
        _f("loss_ratio", F, "", G, "training loss (dimensionless), where reported"),
    ],
)
_m(
    "job_heartbeat",
    R,
    "every few seconds from each rank's reporter thread, whatever its training loop does: "
    "a rank that stops stepping but still beats is alive and stuck (a hang), not gone",
    ("cluster", "node", "job", "rank"),
    [
        _f("step_index", I, "", ST, "the last step the rank reported"),
        _f("since_step_s", F, "s", G, "time since the rank last reported a step (or started)"),
        _f(
            "in_step_active",
            B,
            "",
            ST,
            "the rank is inside a timed step (computing, or waiting in its collectives); "
            "false: between steps (data loading, checkpointing, evaluation)",
        ),
    ],
)
_m(
    "job_checkpoint",
    R,
    "one point per checkpoint a rank saves, from the training-side reporter: what a save "
    "costs the job and how often it saves, from which analytics advises the interval",
    ("cluster", "node", "job", "rank"),
    [
        _f("step_index", I, "", ST, "the step the checkpoint holds"),
        _f("save_s", F, "s", G, "training time the save held up (the blocking part of it)"),
        _f("interval_s", F, "s", G, "the job's checkpoint interval at the time"),
    ],
)
_m(
    "job_model",
    R,
    "the model shape of a job, reported once at start; MFU is computed from it",
    ("cluster", "job", "dtype"),
    [
        _f("params_count", I, "", IN, "parameters (N)"),
        _f("layers_count", I, "", IN, "layers (L)"),
        _f("hidden_size_count", I, "", IN, "hidden size (H)"),
        _f("heads_count", I, "", IN, "attention heads"),
        _f("seq_len_tokens", I, "tokens", IN, "sequence length (T)"),
        _f("world_size_count", I, "", IN, "ranks in the job"),
        _f("tensor_parallel_count", I, "", IN, "tensor-parallel size (ranks per TP group)"),
        _f("pipeline_parallel_count", I, "", IN, "pipeline-parallel stages"),
        _f("recompute_active", B, "", IN, "activation recomputation is on (for HFU)"),
        _f("recompute_selective_active", B, "", IN, "only the attention scores are recomputed"),
        _f("recompute_layers_count", I, "", IN, "layers fully recomputed (absent: all)"),
        _f("vocab_size_count", I, "", IN, "vocabulary size (the token table and LM head)"),
        _f("tied_head_active", B, "", IN, "the LM head shares the token embedding's weight"),
        _f(
            "embedding_params_count",
            I,
            "",
            IN,
            "parameters of the input embedding tables (token + position) inside params_count",
        ),
        _f("gpu_model", S, "", IN, "GPU product name as the job sees it"),
    ],
)
