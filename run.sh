#!/bin/sh
# Quick start: set up .venv on first use, then verify the built-in default (the seed experiment:
# batch 128 for 12 updates against batch 32 x K=4). Extra arguments go to `gradalign verify`;
# relative paths in them are the caller's. Works as `./run.sh`, `sh run.sh` and `bash run.sh`.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/gradalign" verify "$@"
