#!/bin/sh
# The whole test suite: set up .venv on first use, lint, then run every test. Extra arguments go
# to pytest. Works as `./test.sh`, `sh test.sh` and `bash test.sh`.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
source scripts/bootstrap.sh
.venv/bin/ruff check gradalign tests bench examples
.venv/bin/ruff format --check gradalign tests bench examples
exec .venv/bin/python -m pytest "$@"
