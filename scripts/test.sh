#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, format, lint, types, tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -k spool).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

uv run --frozen ruff format --check .
uv run --frozen ruff check .
uv run --frozen mypy
uv run --frozen pytest "$@"
