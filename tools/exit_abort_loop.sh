#!/usr/bin/env bash
# Reproduces (or shows the absence of) the abort at a clean exit under load: runs the migration test's
# DeepSpeed-style script under the dstrain launcher at 2 ranks RUNS times beside two busy-loop processes,
# and counts the runs that died with "terminate called without an active exception".
#   tools/exit_abort_loop.sh [RUNS]      (from the repository root, with the dev venv's python first on PATH)
# Before dscomm's exit_settle.py about 1 run in 9 aborted here; after it, 0 in 25.
set -uo pipefail
runs=${1:-25}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
python3 -c "while True: pass" & hog1=$!
python3 -c "while True: pass" & hog2=$!
trap 'kill $hog1 $hog2 2>/dev/null; rm -rf "$work"' EXIT
echo '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 0.5}},
       "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100}},
       "zero_optimization": {"stage": 1}}' > "$work/ds.json"
aborted=0
for i in $(seq 1 "$runs"); do
  out="$work/run$i" && mkdir -p "$out"
  port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  (cd "$out" && timeout 300 python3 -m dstrain.launcher --num_procs 2 --master_port "$port" \
     "$root/facade/tests/migration/cifar_style.py" --deepspeed --deepspeed_config "$work/ds.json" \
     --out "$out" > out.txt 2> err.txt)
  rc=$?
  grep -q "terminate called" "$out/err.txt" && aborted=$((aborted + 1))
  echo "run $i: exit $rc, aborted so far $aborted"
done
echo "$aborted of $runs runs aborted"
