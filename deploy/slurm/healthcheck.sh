#!/bin/sh
# Slurm HealthCheckProgram: slurmd runs this every HealthCheckInterval seconds as root.
#   slurm.conf:  HealthCheckProgram=/etc/gpuwarden/healthcheck.sh
#                HealthCheckInterval=300
#                HealthCheckNodeState=IDLE,CYCLE    # probe idle nodes, a few at a time
# A failing probe drains this node at once, with the probes that failed as the reason; a node
# that passes is left as it is. With GPUWARDEN_CHECK_REPORT=1 the results also go to InfluxDB
# and the engine (gpuwarden check --report): a failure is a node_check_failed finding (the
# engine drains the node as its own), and a pass on a node the engine took out is the passing
# check it needs to resume it ([engine] return_requires = "check").
# The GPU probes (gpu_matmul, allreduce, dcgm) take the GPUs: run them on idle nodes only.
set -u
node=${SLURMD_NODENAME:-$(hostname -s)}
config=${GPUWARDEN_CHECK_CONFIG:-/etc/gpuwarden/agent.toml}
report=""
[ "${GPUWARDEN_CHECK_REPORT:-0}" = "1" ] && report="--report"
out=$(gpuwarden check --config "$config" $report 2>&1)
rc=$?
if [ "$rc" -eq 1 ]; then
  # "FAIL         disk        /scratch: no answer within 10 s  (10.00 s)" -> "disk: /scratch: ..."
  reason=$(printf '%s\n' "$out" | sed -n 's/^FAIL  *\([a-z_]*\)  *\(.*\)  ([0-9.]* s)$/\1: \2/p' \
    | tr '\n' ';' | cut -c1-200)
  scontrol update NodeName="$node" State=DRAIN Reason="gpuwarden check: ${reason}"
fi
exit 0
