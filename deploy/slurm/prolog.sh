#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/gpuwarden/prolog.sh): tell the gpuwarden agent which
# job owns each GPU of this node, so idle or not-yet-started GPUs are attributed too.
# Writes one file per GPU index into the agent's jobmap_dir, holding the job id.
set -eu
# Optional (GPUWARDEN_PROLOG_CHECK=1 in slurmd's environment): the quick probes of
# `gpuwarden check` before the job starts. A prolog that fails makes Slurm drain this node and
# requeue the job elsewhere, with the probes' summary in slurmd's log.
# gpuwarden is GPUWARDEN_BIN, else the one on PATH, else the venv docs/DEPLOY.md installs into.
# GPUWARDEN_PROLOG_PROBES: which probes (comma-separated); GPUWARDEN_CHECK_CONFIG: the
# configuration, as for healthcheck.sh, whose switches are kept out of the check's environment.
if [ "${GPUWARDEN_PROLOG_CHECK:-0}" = 1 ]; then
    gw=${GPUWARDEN_BIN:-$(command -v gpuwarden 2>/dev/null || echo /opt/gpuwarden/.venv/bin/gpuwarden)}
    config=${GPUWARDEN_CHECK_CONFIG:-/etc/gpuwarden/agent.toml}
    env -u GPUWARDEN_CHECK_CONFIG -u GPUWARDEN_CHECK_REPORT -u GPUWARDEN_CHECK_TIMEOUT_S \
        "$gw" check --config "$config" \
        --probes "${GPUWARDEN_PROLOG_PROBES:-gpu_count,infiniband,disk}" >&2 || exit 1
fi
dir="${GPUWARDEN_JOBMAP_DIR:-/run/gpuwarden/jobs}"
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
[ -n "${SLURM_JOB_ID:-}" ] && [ -n "$gpus" ] || exit 0
mkdir -p "$dir"
for gpu in $(echo "$gpus" | tr ',' ' '); do
    case "$gpu" in *[!0-9]*) continue ;; esac   # indices only (not UUIDs or MIG names)
    printf '%s\n' "$SLURM_JOB_ID" > "$dir/$gpu.tmp" && mv "$dir/$gpu.tmp" "$dir/$gpu"
done
exit 0
