#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, format, lint, types, the import rule, tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -k spool).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

uv run --frozen ruff format --check .
uv run --frozen ruff check .
uv run --frozen mypy
uv run --frozen lint-imports --no-logo --no-cache
uv run --frozen pytest "$@"
