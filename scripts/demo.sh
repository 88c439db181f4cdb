#!/usr/bin/env bash
# The main job on local defaults (installs what it needs first). See README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
uv run --frozen gpuwarden demo "$@"
