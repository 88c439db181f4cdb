#!/bin/sh
# Slurm HealthCheckProgram: slurmd runs this every HealthCheckInterval seconds as root.
#   slurm.conf:  HealthCheckProgram=/etc/gpuwarden/healthcheck.sh
#                HealthCheckInterval=300
#                HealthCheckNodeState=IDLE,CYCLE    # probe idle nodes, a few at a time
# A failing probe drains this node with the probes that failed as the reason; a node that
# passes is left as it is (returning it to service is the engine's job, after its own check).
# The GPU probes (gpu_matmul, allreduce, dcgm) take the GPUs: run them on idle nodes only.
set -u
out=$(gpuwarden check --config /etc/gpuwarden/agent.toml 2>&1)
rc=$?
if [ "$rc" -eq 1 ]; then
  reason=$(printf '%s\n' "$out" | grep '^FAIL' | cut -c14- | tr '\n' ';' | cut -c1-200)
  scontrol update NodeName="$(hostname -s)" State=DRAIN Reason="gpuwarden check: ${reason}"
fi
exit 0
