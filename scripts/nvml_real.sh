#!/usr/bin/env bash
# Records a REAL NVML golden case and times the real collection cycle, on a GPU node.
#   bash scripts/nvml_real.sh OUTDIR
# Needs the NVIDIA driver, python3 with nvidia-ml-py and urllib3 (gpuwarden[agent]), and torch
# for the load and the check's GPU probes. Writes to OUTDIR (at most 8 files):
#   nvml-load.json  3 agent cycles (2 s apart) while a torch matmul loop runs on every GPU,
#                   its process tagged SLURM_JOB_ID=4242 (gpuwarden agent --record-nvml)
#   nvml-idle.json  3 cycles with the GPUs idle
#   environ.txt     the load process's /proc/<pid>/environ, NULs as spaces (for proc.csv)
#   once.lp         gpuwarden agent --once (its stdout)
#   check.json      gpuwarden check --json, every probe (gpu_matmul and allreduce named)
#   bench.txt       benchmarks/nvml_calls.py, then benchmarks/nvml_real.py (last line
#                   real_cycle_ms=); keep it under docs/data/nvml-real/ (docs/NVML-REAL.md,
#                   "How to run it again": benchmarks/doc_tables.py renders the page's tables)
#   smi.txt         nvidia-smi -q during the load, and nvidia-smi's own time per query
#   log.txt         everything else said on the way
# docs/NVML-REAL.md says what a run gave and how it became tests/golden/nvml-real-*.
set -uo pipefail
out=${1:?usage: nvml_real.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
exec 2>>"$out/log.txt"
export PYTHONUNBUFFERED=1 GPUWARDEN_AGENT_REPORTER_LISTEN= GPUWARDEN_CHECK_PROBE_TIMEOUT_S=120 \
  GPUWARDEN_CHECK_DEADLINE_S=600  # not under slurmd here: the probes may take their time
py=${PYTHON:-python3}
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
{
  date -u
  nvidia-smi -L
  "$py" -c "import pynvml, urllib3, sys; print(sys.version, pynvml.__file__, urllib3.__version__)"
} >>"$out/log.txt"

load() {  # a matmul loop on every GPU for $1 seconds
  SLURM_JOB_ID=4242 RANK=0 LOCAL_RANK=0 "$py" -c "
import time, torch
xs = [torch.randn(8192, 8192, device=f'cuda:{i}', dtype=torch.bfloat16)
      for i in range(torch.cuda.device_count())]
print('load: running on', len(xs), 'GPUs', flush=True)
end = time.time() + $1
while time.time() < end:
    for x in xs:
        x @ x
    torch.cuda.synchronize()
" >>"$out/log.txt" &
  load_pid=$!
}

load 60
sleep 15 # CUDA context up, clocks and power settled
tr '\0' ' ' <"/proc/$load_pid/environ" >"$out/environ.txt"
echo "load pid $load_pid" >>"$out/log.txt"
{
  nvidia-smi -q
  echo "--- nvidia-smi --query-gpu, 5 calls:"
  TIMEFORMAT="nvidia-smi query: %R s wall"
  for _ in 1 2 3 4 5; do
    time nvidia-smi --query-gpu=power.draw,temperature.gpu,utilization.gpu,clocks.sm,memory.used \
      --format=csv,noheader
  done 2>&1
} >"$out/smi.txt"
GPUWARDEN_AGENT_INTERVAL_S=2 "$py" -m gpuwarden agent --print --cycles 3 \
  --record-nvml "$out/nvml-load.json" >/dev/null
echo "record (load): exit $?" >>"$out/log.txt"
"$py" -m gpuwarden agent --once >"$out/once.lp"
echo "agent --once: exit $?" >>"$out/log.txt"
"$py" -m benchmarks.nvml_calls >"$out/bench.txt"
echo "calls: exit $?" >>"$out/log.txt"
"$py" -m benchmarks.nvml_real --recording "$out/nvml-load.json" >>"$out/bench.txt"
echo "bench: exit $?" >>"$out/log.txt"
wait "$load_pid"
# every probe, named: the default list leaves gpu_matmul and allreduce out (since 2ba405b), and
# docs/NVML-REAL.md reports what they said on a real GPU
"$py" -m gpuwarden check --json --probes gpu_count,infiniband,disk,dcgm,gpu_matmul,allreduce \
  >"$out/check.json"
echo "check: exit $?" >>"$out/log.txt"
GPUWARDEN_AGENT_INTERVAL_S=2 "$py" -m gpuwarden agent --print --cycles 3 \
  --record-nvml "$out/nvml-idle.json" >/dev/null
echo "record (idle): exit $?" >>"$out/log.txt"
