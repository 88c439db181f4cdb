#!/usr/bin/env bash
# The image's install steps (deploy/container/Containerfile runs this as its one RUN step;
# tests/test_container_recipe.py runs the same script into an empty folder in CI).
#   install.sh WHEEL [EXTRAS]
# Environment: GPUWARDEN_ROOT  where to install ("" = this machine, as in the image; a
#                              folder = a clean root for the test: apt is only checked there)
#              GPUWARDEN_PIP   the installer ("pip", the default; the test passes "uv" to
#                              reuse its package cache: the same wheel, the same extras)
set -euo pipefail
wheel=${1:?usage: install.sh WHEEL [EXTRAS]}
extras=${2:-agent,remediation,standby}
if [ "$#" -gt 2 ] || [[ "$extras" == *.whl ]]; then
  # the Containerfile's glob matched more than one wheel (an old build left in dist/)
  echo "install.sh: one wheel, please: $*" >&2
  exit 2
fi
root=${GPUWARDEN_ROOT:-}
installer=${GPUWARDEN_PIP:-pip}
case "$installer" in
  pip | uv) ;;
  *) echo "install.sh: GPUWARDEN_PIP must be pip or uv" >&2; exit 2 ;;
esac
# python3 + venv to run it; systemd for journalctl (the agent's kernel_journal source reads
# the host's journal with it); ca-certificates for https to InfluxDB and the engine
packages=(python3 python3-venv systemd ca-certificates)

if [ -z "$root" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${packages[@]}"
  rm -rf /var/lib/apt/lists/*
else
  # a clean root in a test: the packages must exist for this Debian, and be what the host
  # runs the same way (journalctl in particular)
  for p in "${packages[@]}"; do
    apt-cache show "$p" >/dev/null 2>&1 || dpkg-query -W "$p" >/dev/null
  done
  command -v journalctl >/dev/null
fi

venv="$root/opt/gpuwarden/.venv"
python3 -m venv "$venv"
case "$installer" in
  pip) "$venv/bin/pip" install --no-cache-dir --quiet "${wheel}[${extras}]" ;;
  uv) uv pip install --quiet --python "$venv/bin/python" "${wheel}[${extras}]" ;;
esac
# the state and runtime folders the DaemonSet and the engine mount over
mkdir -p "$root/var/lib/gpuwarden" "$root/run/gpuwarden" "$root/etc/gpuwarden"
"$venv/bin/gpuwarden" --help >/dev/null
