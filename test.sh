#!/usr/bin/env bash
# The whole test suite: set up ./.venv on first use, lint, then run every test.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh
.venv/bin/ruff check gradalign tests bench
.venv/bin/ruff format --check gradalign tests bench
exec .venv/bin/python -m pytest "$@"
