#!/usr/bin/env bash
# Installs everything gpuwarden needs on a fresh Debian (bookworm) machine, as root.
# Idempotent: a second run installs nothing. Used by scripts/test.sh and scripts/demo.sh.
#   apt:    influxdb (the real server for tests and the demo; 1.6.7 on bookworm),
#           victoria-metrics (a real server that accepts the InfluxDB v2 write API),
#           slurm-wlm + munge (a real Slurm 22.05 for the remediation tests and the demo),
#           prometheus + prometheus-alertmanager (a real Prometheus that scrapes /metrics, a
#           real Alertmanager that posts alerts to the engine),
#           postgresql (a real PostgreSQL 15 holds the standby engine's lease in the tests),
#           debootstrap (a clean Debian root in which the container recipe's steps run),
#           systemd (systemd-analyze verify and systemd-sysusers check the shipped units;
#           journalctl, which the agent's kernel_journal source runs),
#           systemd-journal-remote (its systemd-journal-remote writes real journal files from
#           Journal Export Format for the kernel_journal tests),
#           python3 + python3-venv (to install the pinned uv)
#   python: the locked environment (uv.lock) in .venv, via the pinned uv
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
APT_PACKAGES=(influxdb victoria-metrics slurm-wlm munge prometheus prometheus-alertmanager postgresql debootstrap
  systemd systemd-journal-remote python3 python3-venv ca-certificates)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  tools="$PWD/.cache/tools"
  if [ ! -x "$tools/bin/uv" ] || [ "$("$tools/bin/uv" --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    echo "bootstrap: installing uv $UV_VERSION into $tools"
    python3 -m venv "$tools"
    "$tools/bin/pip" install -q "uv==$UV_VERSION"
  fi
  export PATH="$tools/bin:$PATH"
fi

export UV_PYTHON_DOWNLOADS=never
# every extra but torch (`all`), and the dev group. --inexact keeps torch (below): the lock
# names the registry's build for the `torch` extra, which is never synced here
uv sync --frozen --inexact --quiet --extra all

# PyTorch for the elastic-remediation tests and the demo's torchrun job: the CPU build of
# 2.13.0 that these machines carry as a local wheel (the registry's build brings GBs of CUDA
# libraries). It is the training job's dependency, not gpuwarden's: the `torch` extra, which
# `all` leaves out.
TORCH_WHEELS=/opt/wheels
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if ls "$TORCH_WHEELS"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
    echo "bootstrap: installing torch 2.13.0 (CPU) from $TORCH_WHEELS"
    uv pip install --quiet --python .venv/bin/python --find-links "$TORCH_WHEELS" "torch==2.13.0"
  else
    echo "bootstrap: no CPU torch wheel in $TORCH_WHEELS; the torchrun tests will be skipped"
  fi
fi
