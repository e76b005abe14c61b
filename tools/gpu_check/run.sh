#!/usr/bin/env bash
# The GPU check: installs dstrain's libraries into this machine's PyTorch, runs every gpu-marked test and
# a short benchmark set, and writes gpu_report.md / gpu_report.json into OUTDIR. Exit 0 only when every
# check passed. See tools/gpu_check/README.md.
#
#   tools/gpu_check/run.sh OUTDIR                 # on a machine with one NVIDIA GPU (no network needed)
#   tools/gpu_check/run.sh --dry-run OUTDIR       # on a CPU machine: CUDA steps skipped with the reason
#
# PYTHON names the interpreter that holds the machine's torch (default: python3); everything runs under it.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
  echo "run.sh: no Python interpreter '$python' (set PYTHON to the one that holds torch)" >&2
  exit 2
fi
# The driver keeps to 450 s (a dry run, on a CPU machine that may be shared, to 1500 s); this is the
# backstop, which still leaves the report the driver rewrote after each step.
limit=470
for arg in "$@"; do [ "$arg" = "--dry-run" ] && limit=1520; done
exec timeout --kill-after=10 "$limit" "$python" "$here/gpu_check.py" "$@"
