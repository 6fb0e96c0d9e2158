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
#   5. the hoisting A/B behind hoist_inputs="auto" (scan.auto_hoist; into the log only);
#   6. `train vae --preset moses` (MOSES's VAE and data) for a fixed 90 s, its speed (updates/s, and the
#      time of the preset's full run at that speed), then `evaluate vae --metrics moses` of its latest
#      checkpoint on 500 prior samples: into the log only (the run folder is a temporary one). Training needs
#      MOSES's data files (molsets: `pip install --no-deps molsets`; only moses/dataset/data/train.csv.gz is
#      read), the evaluation rdkit and fcd_torch too; the GPU image has none of them, so the step says what is
#      missing and skips what needs it. When it runs it takes step 2's time: bf16 is then skipped and step 1
#      shortened (SKIP_MOSES=1 keeps steps 1 and 2 whole and skips 6).
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
# Step 6's packages, found without importing them (importing moses itself fails on current pandas).
MOSES_MISSING=$($PY - <<'EOF' 2>>"$LOG"
from importlib.util import find_spec
need = {"moses": "molsets", "rdkit": "rdkit", "fcd_torch": "fcd_torch"}
print(" ".join(package for module, package in need.items() if find_spec(module) is None))
EOF
)

if [ "$GPU" != "yes" ]; then
    say "no GPU visible to both JAX and torch: running the quick suite on the CPU instead (GPU rows: n/a)"
    run 170 $PY -m jax_scan_rnn.bench --quick --replace --out "$OUT"
    rm -f "$OUT/.lock"  # the benchmark's hold on --out while it ran (jax_scan_rnn/lock.py), not a result
    say "done (CPU fallback) in $(($(date +%s) - START)) s"
    exit 0
fi

# Step 6 runs when MOSES's data is there (and SKIP_MOSES is not 1); its 90 + 60 s then come out of steps 1 and 2.
if [ "${SKIP_MOSES:-0}" != 1 ] && [[ " $MOSES_MISSING " != *" molsets "* ]]; then MOSES=yes; else MOSES=no; fi

# 1. float32, TF32 off. The suite stops starting new cases at --budget-s; the limit is a hard stop.
# (Worst case, every step at its limit: 190 + 85 + 120 + 45 + 30 s plus start-up, under the 8 minutes; with
# step 6: 125 + 0 + 120 + 45 + 30 + 150 s.)
if [ "$MOSES" = yes ]; then SUITE_S=125 SUITE_BUDGET_S=70; else SUITE_S=190 SUITE_BUDGET_S=135; fi
NVIDIA_TF32_OVERRIDE=0 run $SUITE_S $PY -m jax_scan_rnn.bench --replace --out "$OUT" \
    --sweep-seq-lens 5,10 --max-call-s 1.5 --budget-s $SUITE_BUDGET_S

# 2. bfloat16 where it applies: the loops, lax.scan, nn.LSTM / jsr.LSTM, the limits (no plots: file limit).
if [ "$MOSES" = yes ]; then
    say "2. bfloat16 skipped: its time goes to step 6 (--preset moses); SKIP_MOSES=1 runs it instead"
else
    run 85 $PY -m jax_scan_rnn.bench --replace --out "$OUT" --dtype bfloat16 --no-plots \
        --methods torch-cell,torch-cuda-graph,torch-lstm-seq,jax-scan-u1,jax-scan-u4,jax-scan-u16,jax-lstm-seq \
        --sweep-seq-lens 5 --max-call-s 1 --budget-s 50
fi

# 3. parity on the GPU (each layer and VAE test runs with the input projections hoisted and inside the loop).
# (-o addopts="": the device's Python may lack pytest-xdist, which the repository's default -n 2 needs)
run 120 $PY -m pytest parity_tests -q -p no:cacheprovider -o addopts=""  # 114 s on the 2-core CPU

# 4. unroll on this GPU (time per step vs unroll 1..16, forward and train step): printed to the log.
NVIDIA_TF32_OVERRIDE=0 run 45 $PY benchmarks/tune_scan.py unroll 1x64 64x64 512x64 --rounds 2

# 5. the input projection before the loop or inside each step, on this GPU: printed to the log.
NVIDIA_TF32_OVERRIDE=0 run 30 $PY benchmarks/tune_scan.py hoist 1x64 64x64 1024x64

# 6. --preset moses: 90 s of training (start-up, data and compilation included), stopped by the limit (exit
# code 124 is the normal end here: the preset's full run is 309,600 updates); a checkpoint every 200 updates,
# so the evaluation has one, and no evaluation in training (the next command evaluates). The run folder is
# temporary: the files under $OUT stay within their limit.
if [ "$MOSES" = no ]; then
    WHY="not installed: $MOSES_MISSING (the MOSES data ships in molsets)"
    [ "${SKIP_MOSES:-0}" = 1 ] && WHY="SKIP_MOSES=1"
    say "6. --preset moses skipped: $WHY"
else
    RUN=$(mktemp -d)
    trap 'rm -rf "$RUN"' EXIT
    run 90 $PY -m jax_scan_rnn.cli train vae --preset moses --checkpoint-every 200 --eval-every 0 --out "$RUN/moses"
    $PY - "$RUN/moses/metrics.jsonl" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
from jax_scan_rnn.tasks.vae import PRESETS
try:
    rows = [r for r in map(json.loads, open(sys.argv[1])) if r["split"] == "train"]
except OSError:
    rows = []
if not rows:
    sys.exit("--preset moses: no training row was logged (its output is above)")
last, full = rows[-1], PRESETS["moses"].configs()[1].steps
# The first window holds the compilation; later ones a checkpoint save every other time: the median of those.
rates = sorted(r["steps_per_s"] for r in rows[1:]) or [rows[0]["steps_per_s"]]
rate = rates[len(rates) // 2]
print(f"--preset moses on this GPU: {last['step']} updates in {last['elapsed_s']:.0f} s of training (compilation "
      f"included); {rate:.1f} updates/s (median of {len(rates)} logging windows), so its {full:,} updates take "
      f"about {full / rate / 3600:.1f} h (evaluations aside); loss {last['loss']:.4g}")
EOF
    if [ -n "$MOSES_MISSING" ]; then
        say "6. evaluate vae --metrics moses skipped: not installed: $MOSES_MISSING"
    else
        run 60 $PY -m jax_scan_rnn.cli evaluate vae --checkpoint "$RUN/moses" --metrics moses -n 500
    fi
fi

rm -f "$OUT/.lock"  # the benchmark's hold on --out while it ran (jax_scan_rnn/lock.py), not a result
say "done in $(($(date +%s) - START)) s; files in $OUT:"
ls -l "$OUT" | tee -a "$LOG"
