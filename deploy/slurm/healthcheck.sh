#!/bin/sh
# Slurm HealthCheckProgram: slurmd runs this every HealthCheckInterval seconds as root.
#   slurm.conf:  HealthCheckProgram=/etc/gpuwarden/healthcheck.sh
#                HealthCheckInterval=300
#                HealthCheckNodeState=IDLE,CYCLE    # probe idle nodes, a few at a time
# It fails closed, as LBNL NHC does: a check that cannot run has failed.
#   * a failing probe drains this node, with the probes that failed as the reason;
#   * gpuwarden missing (GPUWARDEN_BIN, else PATH, else /opt/gpuwarden/.venv/bin), its
#     configuration missing or broken, a check that crashes or does not
#     finish within GPUWARDEN_CHECK_TIMEOUT_S (55 s: slurmd kills the program at 60) drains it
#     too, with what went wrong as the reason;
#   * a passing check resumes the node only if this script drained it (its reason starts with
#     "gpuwarden check"); a node drained for any other reason (an operator, the engine, Slurm)
#     is left as it is, and a failing check leaves its reason as it is too.
# With GPUWARDEN_CHECK_REPORT=1 the results also go to InfluxDB and the engine (gpuwarden check
# --report, with a spool of its own beside the running agent's): a failure is a
# node_check_failed finding (the engine drains the node as its own), and a pass on a node the
# engine took out is the passing check it needs to resume it ([engine] return_requires).
# The GPU probes (gpu_matmul, allreduce, dcgm) take the GPUs: run them on idle nodes only.
set -u
node=${SLURMD_NODENAME:-$(hostname -s)}
config=${GPUWARDEN_CHECK_CONFIG:-/etc/gpuwarden/agent.toml}
limit=${GPUWARDEN_CHECK_TIMEOUT_S:-55}
ours="gpuwarden check"

drain() {
  # a node already out for someone else's reason (an operator's RMA, the engine, Slurm) keeps
  # that reason: overwriting it made the next passing check resume the node as this script's
  # own (an unreadable state is drained, as any check that cannot run). A hot spare's reason
  # is taken over: a spare that fails its check leaves the pool (the engine puts a spare back
  # in service, unchecked, when a job is requeued)
  case $(sinfo -h -N -n "$node" -o '%T|%E' 2>/dev/null | head -n 1) in
    *"|$ours"*|*"|none"|""|*"|gpuwarden: hot spare") ;;
    *drain*"|"*|*down*"|"*|*fail*"|"*|*maint*"|"*) exit 1 ;;
  esac
  scontrol update NodeName="$node" State=DRAIN Reason="$(printf '%s' "$ours: $1" | cut -c1-200)"
  exit 1
}

# slurmd's PATH rarely holds the venv docs/DEPLOY.md installs into: that venv is looked in too
gw=${GPUWARDEN_BIN:-$(command -v gpuwarden 2>/dev/null || echo /opt/gpuwarden/.venv/bin/gpuwarden)}
[ -x "$gw" ] || drain "could not run: gpuwarden is not on PATH ($PATH) nor at $gw"
[ -r "$config" ] || drain "could not run: no readable configuration at $config"
report=""
[ "${GPUWARDEN_CHECK_REPORT:-0}" = "1" ] && report="--report"
# this script's own switches are not the check's settings (GPUWARDEN_CHECK_<KEY> would read
# as [check] <key>): kept from it
# the check names the node as Slurm does (a host named gpu01.cluster, or a NodeHostname that
# differs, would report a node the engine cannot drain, nor resume): unless the
# environment names it already (it overrides [agent] node: on Slurm, the name Slurm knows)
[ -n "${GPUWARDEN_AGENT_NODE:-}" ] || export GPUWARDEN_AGENT_NODE="$node"
out=$(env -u GPUWARDEN_CHECK_CONFIG -u GPUWARDEN_CHECK_REPORT -u GPUWARDEN_CHECK_TIMEOUT_S \
  timeout -k 2 "$limit" "$gw" check --config "$config" $report 2>&1)
rc=$?
last=$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c1-150)
case $rc in
  0)
    # resume the node if, and only if, this check drained it
    reason=$(sinfo -h -N -n "$node" -o '%E' 2>/dev/null | head -n 1)
    case $reason in
      "$ours"*) scontrol update NodeName="$node" State=RESUME ;;
    esac
    exit 0 ;;
  1)
    # "FAIL         disk        /scratch: no answer within 10 s  (10.00 s)" -> "disk: /scratch: ..."
    failed=$(printf '%s\n' "$out" | sed -n 's/^FAIL  *\([a-z_]*\)  *\(.*\)  ([0-9.]* s)$/\1: \2/p' \
      | tr '\n' ';')
    drain "${failed:-failed without naming a probe: $last}" ;;
  124|137)
    drain "did not finish within ${limit} s" ;;
  *)
    drain "could not run (exit $rc): $last" ;;
esac
