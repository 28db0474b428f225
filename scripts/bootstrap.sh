#!/usr/bin/env bash
# Create or refresh ./.venv for gradalign, idempotently. Sourced by run.sh, run_grad.sh, test.sh.
#
# torch: reused from the base Python when it already imports there; otherwise torch==2.13.0 is
# taken from local wheels (pip's find-links) or, failing that, from the CPU-only PyTorch index.
# A plain `pip install torch` would pull several GB of CUDA packages; set GRADALIGN_TORCH to a pip
# requirement (e.g. "torch==2.13.0" with your own index settings) to choose another build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"
stamp="$venv/.gradalign-stamp"
want="$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -c1-16)"

# The package's bytecode, written ahead: pip compiles what it installs, but not an editable
# install's sources, and where PYTHONDONTWRITEBYTECODE is set (as in many containers) every
# command compiled ~130 modules again at start-up (0.3 s; docs/PERFORMANCE.md, "Start-up").
# Only changed files are compiled again; a file that does not compile is left to the import.
compiled() { "$venv/bin/python" -m compileall -q "$root/gradalign" >/dev/null 2>&1 || true; }

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/gradalign" ]]; then
  compiled
  return 0 2>/dev/null || exit 0
fi

log() { echo "[setup] $*" >&2; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "error: gradalign needs Python >= 3.10 (found $("$python" --version 2>&1))" >&2; exit 2; }

system_torch=0
if "$python" -c 'import torch' >/dev/null 2>&1; then system_torch=1; fi
if [[ ! -x "$venv/bin/python" ]]; then
  if (( system_torch )); then
    log "creating .venv (reusing the torch of $python)"
    "$python" -m venv --system-site-packages "$venv"
  else
    log "creating .venv"
    "$python" -m venv "$venv"
  fi
fi
pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
constraints="$venv/.constraints.txt"
if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  grep -v '^torch==' "$root/constraints.txt" > "$constraints"  # keep the torch that is there
else
  spec="${GRADALIGN_TORCH:-$(grep '^torch==' "$root/constraints.txt")}"
  log "installing $spec (CPU build)"
  # A local wheel (pip's find-links) first; its dependencies then come from the usual index.
  if "${pip[@]}" install --no-index --no-deps "$spec" >/dev/null 2>&1; then
    "${pip[@]}" install "$spec"
  else
    "${pip[@]}" install "$spec" --retries 2 --timeout 30 \
      --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple
  fi
  cp "$root/constraints.txt" "$constraints"
fi
log "installing gradalign and its test tools"
"${pip[@]}" install -c "$constraints" -e "$root[test]"
compiled
echo "$want" > "$stamp"
