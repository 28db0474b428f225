#!/bin/sh
# The merged half alone: train with gradient merge (K from the options, default 4) using the
# configuration recorded in an existing baseline run, then compare against that baseline.
#   ./run_grad.sh runs/verify/baseline [--accum-steps K] [--out DIR] [--json FILE] ...
# Exit 0 aligned, 1 not aligned, 2 bad input: usable as a CI gate that keeps one baseline.
# Relative paths are the caller's. Works as `./run_grad.sh`, `sh run_grad.sh` and `bash ...`.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: ./run_grad.sh BASELINE_RUN_DIR [gradalign merged options]" >&2
  exit 2
fi
baseline="$1"
shift
source "$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/gradalign" merged --against "$baseline" "$@"
