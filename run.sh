#!/usr/bin/env bash
# Quick start: set up ./.venv on first use, then verify the built-in default (the seed experiment:
# batch 128 for 12 updates against batch 32 x K=4). Extra arguments go to `gradalign verify`.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh
exec .venv/bin/gradalign verify "$@"
