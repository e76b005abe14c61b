#!/usr/bin/env bash
# DeepSpeed's own unit tests (tests/unit of its repository) for the features dstrain implements, run with
# `import deepspeed` served by dstrain, in a throwaway virtual environment outside the repository.
#
#   facade/docs/deepspeed_unit_tests/run.sh                 # every file of files.txt, then results.md
#   facade/docs/deepspeed_unit_tests/run.sh runtime/test_lr_schedulers.py -k WarmupLR   # one file, pytest's args
#
# Environment: DEEPSPEED_SRC (a DeepSpeed git clone to take the tests from; default: cloned into the work folder),
# DEEPSPEED_COMMIT (the commit whose tests run), DS_UNIT_WORK (the work folder, outside the repository),
# DS_UNIT_RANKS (the most ranks a test may start: DeepSpeed's CPU device count, LOCAL_SIZE), DS_UNIT_FILE_TIMEOUT,
# DS_UNIT_LIST (run only the files of this list, same format as files.txt; the table still lists every file).
#
# DeepSpeed's harness runs unchanged. Its "not enough devices" skip compares a test's ranks with the accelerator's
# device count, which on the CPU is LOCAL_SIZE (DeepSpeed's rule, which dstrain's CPU accelerator follows): setting
# it here is the one relaxation. forkserver_preload.py only makes the ranks start faster.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
commit=${DEEPSPEED_COMMIT:-edaa7221267243c7be7fb49c5d5f5c4fb97b4641}
work=${DS_UNIT_WORK:-${TMPDIR:-/tmp}/dstrain-deepspeed-unit-tests}
src=${DEEPSPEED_SRC:-$work/deepspeed-src}
ranks=${DS_UNIT_RANKS:-4}
file_timeout=${DS_UNIT_FILE_TIMEOUT:-2400}
venv=$work/venv
mkdir -p "$work"
work=$(cd "$work" && pwd)
case "$work/" in "$repo"/*) echo "run.sh: the work folder must be outside the repository: $work" >&2; exit 2 ;; esac

# 1. DeepSpeed's tests at the pinned commit, and only them: no deepspeed/ package beside the tests.
if ! git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git clone --quiet --filter=blob:none --no-checkout https://github.com/deepspeedai/DeepSpeed "$src"
fi
git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null || git -C "$src" fetch --quiet origin "$commit"
rm -rf "$work/tests" && mkdir "$work/tests"
git -C "$src" archive "$commit:tests" | tar -x -C "$work/tests"  # the subtree alone (a partial clone has it)

# 2. A throwaway environment: every dstrain library of this checkout (editable, so fixes are seen at once),
#    `import deepspeed` served by dstrain in every process, and what DeepSpeed's tests import themselves.
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
libs=() names=()
while read -r line; do
  case "$line" in ./*) libs+=(-e "$repo/${line#./}"); names+=("$(basename "${line#./}" | sed "s/\[.*//")") ;; esac
done < "$repo/requirements.txt"
pip_install() {  # pip, without the notes about this machine's index settings
  "$venv/bin/pip" install --quiet -c "$repo/constraints.txt" "$@" 2>&1 | { grep -v 'is ignored: it is neither' || true; }
}
# Editable installs follow this checkout's sources, so an environment that already imports every library (from
# here) and DeepSpeed's name is reused as it is; a library new to requirements.txt installs everything again.
imports=$(printf '%s,' "${names[@]//facade/dstrain}" | sed 's/,$//')
if ! "$venv/bin/python" -c "
import importlib.metadata, sys, $imports, deepspeed, pytest, transformers, cpuinfo, hjson, wandb, comet_ml
sys.exit(0 if all(m.__file__.startswith('$repo/') for m in ($imports,)) else 1)" 2>/dev/null; then
  pip_install "${libs[@]}" 'pytest>=7.2.0,<8.4.0' numpy transformers accelerate hjson py-cpuinfo packaging pydantic \
    psutil wandb comet_ml  # monitor/test_monitor.py patches wandb.init and comet_ml.start
  pip_install "$repo/deepspeed-compat"
fi

# 3. Each file alone (a hung rank then costs one file), with a JUnit report per file.
results=$work/results
files=()
if [ $# -gt 0 ]; then
  files=("$1"); shift
else
  [ -n "${DS_UNIT_LIST:-}" ] || rm -rf "$results"  # a partial run keeps the other files' reports
  while read -r path _; do
    case "$path" in ''|'#'*) ;; *) files+=("$path") ;; esac
  done < "${DS_UNIT_LIST:-$here/files.txt}"
fi
mkdir -p "$results"
markers="not nightly and not inference and not seq_inference and not inference_ops and not inference_v2"
markers="$markers and not inference_v2_ops and not stable_diffusion and not evaluation"
cd "$work/tests"
for path in "${files[@]}"; do
  name=${path//\//__}
  echo "== $path" >&2
  status=0
  deselect=()  # hangs.txt: tests that would hang DeepSpeed's harness (summarize.py counts them as failed)
  while read -r test _; do
    case "$test" in "$path::"*) deselect+=(--deselect "unit/$test") ;; esac
  done < "$here/hangs.txt"
  # The venv's bin first, as in an activated venv: tests run the `deepspeed` command (launcher/test_user_args.py).
  PATH="$venv/bin:$PATH" PYTHONPATH="$here" LOCAL_SIZE="$ranks" DS_UNITTEST_TIMEOUT="${DS_UNITTEST_TIMEOUT:-300}" \
    timeout --kill-after=30 "$file_timeout" "$venv/bin/python" -m pytest -p forkserver_preload -p no:cacheprovider \
    -m "$markers" "unit/$path" ${deselect[@]+"${deselect[@]}"} --junitxml="$results/$name.xml" "$@" \
    > "$results/$name.log" 2>&1 || status=$?
  echo "$status" > "$results/$name.rc"
  tail -n 1 "$results/$name.log" | sed 's/\x1b\[[0-9;]*m//g' >&2
done

# 4. The table (only for a run of the whole list).
if [ $# -eq 0 ] && [ "${#files[@]}" -gt 1 ]; then
  "$venv/bin/python" "$here/summarize.py" "$here/files.txt" "$results" "$commit" > "$here/results.md"
  echo "wrote $here/results.md" >&2
fi
