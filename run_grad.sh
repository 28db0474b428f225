#!/usr/bin/env bash
# The merged half alone: train with gradient merge (K from the options, default 4) using the
# configuration recorded in an existing baseline run, then compare against that baseline.
#   ./run_grad.sh runs/verify/baseline [--accum-steps K] [--out DIR] [--json FILE] ...
# Exit 0 aligned, 1 not aligned, 2 bad input: usable as a CI gate that keeps one baseline.
set -euo pipefail
cd "$(dirname "$0")"
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: ./run_grad.sh BASELINE_RUN_DIR [gradalign merged options]" >&2
  exit 2
fi
baseline="$1"
shift
source scripts/bootstrap.sh
exec .venv/bin/gradalign merged --against "$baseline" "$@"
