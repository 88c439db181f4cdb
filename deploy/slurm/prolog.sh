#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/gpuwarden/prolog.sh): tell the gpuwarden agent which
# job owns each GPU of this node, so idle or not-yet-started GPUs are attributed too.
# Writes one file per GPU index into the agent's jobmap_dir, holding the job id.
set -eu
dir="${GPUWARDEN_JOBMAP_DIR:-/run/gpuwarden/jobs}"
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
[ -n "${SLURM_JOB_ID:-}" ] && [ -n "$gpus" ] || exit 0
mkdir -p "$dir"
for gpu in $(echo "$gpus" | tr ',' ' '); do
    case "$gpu" in *[!0-9]*) continue ;; esac   # indices only (not UUIDs or MIG names)
    printf '%s\n' "$SLURM_JOB_ID" > "$dir/$gpu.tmp" && mv "$dir/$gpu.tmp" "$dir/$gpu"
done
exit 0
