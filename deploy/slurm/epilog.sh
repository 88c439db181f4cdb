#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/gpuwarden/epilog.sh): forget the job's GPUs, but only
# the files that still name this job (a later job may already own the GPU).
set -eu
dir="${GPUWARDEN_JOBMAP_DIR:-/run/gpuwarden/jobs}"
[ -n "${SLURM_JOB_ID:-}" ] && [ -d "$dir" ] || exit 0
for f in "$dir"/*; do
    [ -f "$f" ] || continue
    if [ "$(cat "$f" 2>/dev/null)" = "$SLURM_JOB_ID" ]; then rm -f "$f"; fi
done
exit 0
