#!/usr/bin/env bash
# The scan-vs-loop suite on one GPU, then the parity tests on that GPU. Under 8 minutes on an H200.
#
#   bash benchmarks/gpu.sh                 # results under benchmarks/results/
#   OUT=/some/dir bash benchmarks/gpu.sh   # results under $OUT (a lent device machine sets $OUT)
#
# Needs a Python with jax[cuda], flax, optax and a CUDA torch; this package need not be installed (the
# repository root goes on PYTHONPATH). Runs, in order, each with its own time budget:
#   1. float32 with TF32 off (jax.default_matmul_precision("highest"), torch allow_tf32=False and
#      NVIDIA_TF32_OVERRIDE=0): the whole grid, T in {100, 1000, 10000}, B in {1, 64, 1024};
#   2. bfloat16 (inputs and compute in bf16, JAX parameters kept in float32), the rows where bf16 applies;
#   3. pytest parity_tests -q (float32 and float64 parity, matmul precision pinned by the tests);
#   4. the unroll sweep behind unroll="auto" (benchmarks/tune_scan.py; into the log only), so that
#      jax_scan_rnn.scan.auto_unroll can be set for GPUs from measurements;
#   5. the hoisting A/B behind hoist_inputs="auto" (scan.auto_hoist; into the log only).
# Writes at most 8 files (the device machine's limit): <kind>.json/.md and three PNGs, <kind>-bf16.json/.md,
# and gpu-run.log with everything printed. Without a GPU it says so and runs the quick suite on the CPU
# instead (GPU-only rows are then marked n/a), so the script can be checked anywhere.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="${OUT:-$ROOT/benchmarks/results}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
LOG="$OUT/gpu-run.log"
: >"$LOG"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the GPU in one process
export PYTHONUNBUFFERED=1
export MPLBACKEND=Agg
START=$(date +%s)

say() { echo "[gpu.sh $(($(date +%s) - START)) s] $*" | tee -a "$LOG"; }
run() { # run <seconds> <command...>: a hard time limit per step, output to the terminal and the log
    local limit=$1
    shift
    say "\$ $*"
    timeout --signal=INT --kill-after=20 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || say "exit code $rc (124: stopped at the ${limit} s limit)"
    return 0
}

say "root $ROOT, results in $OUT, python $($PY -c 'import sys; print(sys.version.split()[0])')"
GPU=$($PY - <<'EOF' 2>>"$LOG"
import jax
try:
    import torch
    torch_gpu = torch.cuda.is_available()
except Exception:  # noqa: BLE001
    torch_gpu = False
gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
print("yes" if gpus and torch_gpu else "no")
EOF
)
$PY - <<'EOF' 2>&1 | tee -a "$LOG"
import jax, platform
print("jax", jax.__version__, jax.devices())
try:
    import torch
    print("torch", torch.__version__, "cuda:", torch.cuda.is_available(),
          torch.cuda.get_device_name() if torch.cuda.is_available() else "")
except Exception as e:  # noqa: BLE001
    print("torch: not importable:", e)
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$LOG"

if [ "$GPU" != "yes" ]; then
    say "no GPU visible to both JAX and torch: running the quick suite on the CPU instead (GPU rows: n/a)"
    run 170 $PY -m jax_scan_rnn.bench --quick --out "$OUT"
    say "done (CPU fallback) in $(($(date +%s) - START)) s"
    exit 0
fi

# 1. float32, TF32 off. The suite stops starting new cases at --budget-s; the limit is a hard stop.
# (Worst case, every step at its limit: 190 + 85 + 120 + 45 + 30 s plus start-up, under the 8 minutes.)
NVIDIA_TF32_OVERRIDE=0 run 190 $PY -m jax_scan_rnn.bench --out "$OUT" \
    --sweep-seq-lens 5,10 --max-call-s 1.5 --budget-s 135

# 2. bfloat16 where it applies: the loops, lax.scan, nn.LSTM / jsr.LSTM, the limits (no plots: file limit).
run 85 $PY -m jax_scan_rnn.bench --out "$OUT" --dtype bfloat16 --no-plots \
    --methods torch-cell,torch-cuda-graph,torch-lstm-seq,jax-scan-u1,jax-scan-u4,jax-scan-u16,jax-lstm-seq \
    --sweep-seq-lens 5 --max-call-s 1 --budget-s 50

# 3. parity on the GPU (each layer and VAE test runs with the input projections hoisted and inside the loop).
run 120 $PY -m pytest parity_tests -q -p no:cacheprovider  # 114 s on the 2-core CPU

# 4. unroll on this GPU (time per step vs unroll 1..16, forward and train step): printed to the log.
NVIDIA_TF32_OVERRIDE=0 run 45 $PY benchmarks/tune_scan.py unroll 1x64 64x64 512x64

# 5. the input projection before the loop or inside each step, on this GPU: printed to the log.
NVIDIA_TF32_OVERRIDE=0 run 30 $PY benchmarks/tune_scan.py hoist 1x64 64x64 1024x64

say "done in $(($(date +%s) - START)) s; files in $OUT:"
ls -l "$OUT" | tee -a "$LOG"
