#!/usr/bin/env bash
# Everything the GPU issue measures, as named steps under hard time limits; a run writes at most 8 files.
#
#   bash benchmarks/gpu.sh --prepare      # here, once: what a machine without a package index lacks, into .gpu/
#   OUT=/some/dir bash benchmarks/gpu.sh  # the run (a lent device machine sets $OUT; default runs/gpu-sh)
#   STEPS="parity vae" OUT=... bash benchmarks/gpu.sh   # only those steps (names below)
#   python benchmarks/render_bench.py /some/dir/gpu-h200*.json --out benchmarks/results   # tables and plots
#
# Needs a Python with jax[cuda], flax, optax, orbax and a CUDA torch; this package need not be installed (the
# repository root goes on PYTHONPATH). --prepare puts rdkit's wheel for Python 3.12 (the device's) and MOSES's
# training file (from this machine's molsets, laid out as molsets lays it out) under .gpu/, which the device
# call carries: the VAE steps need both, and the device machine reaches no package index.
# Steps, most wanted first, each under a hard time limit (seconds, its Python's ~15 s start-up on the H200
# included) so that one slow step cannot eat the rest. Five H200 runs (2026-12-04, benchmarks/results/gpu-h200-run*.log)
# sized them; together the default steps take ~11 minutes, more than one device call holds (10), so a session runs
# them as two calls, as the second session did:
#   STEPS="grid vae gen check" GRID_S=150 GRID_BATCHES=64,1024 bash benchmarks/gpu.sh   # ~5.5 min
#   STEPS="parity traveller train-vae" bash benchmarks/gpu.sh                             # ~5.5 min
# and next, STEPS="vae compile" (~6 min, the compile step's processes estimated from the compiles above): the VAE's torch train rows again (the bench's `train_copy`, which keeps
# cuDNN from repacking their weights every step, came after session 2) and XLA:GPU's autotuning options.
#   grid     (120, $GRID_S) float32, TF32 off (jax.default_matmul_precision("highest"), torch allow_tf32=False and
#            NVIDIA_TF32_OVERRIDE=0): the Traveller at T=1000, B in $GRID_BATCHES (1,64,1024), with compile
#            times: the seed's loop, the cell loop as a CUDA graph, nn.LSTM (the bound), jsr's scan at unroll 1, 4
#            and "auto", the limits (the other rows left out to fit: torch.compile's and TorchScript's compiles
#            alone would take minutes);
#   vae      (85) the VAE rows at T=60, H=256, B=128 (the training size): scheduled sampling and teacher forcing,
#            torch_ref's loop, that loop in a CUDA graph, and jsr, forward and train step;
#   gen      (45) greedy generation of 10,000 sequences (B=10000, T=60), the same three;
#   parity   (190) pytest parity_tests (float32 and float64; TF32 off in both frameworks, parity_tests/conftest.py);
#            150 s ran 190 of 192 tests on the H200; the Elman RNN's 55 came after, so the limit grew in proportion;
#   unroll   (60), hoist (25): the sweeps behind unroll="auto" and hoist_inputs="auto" ($SWEEP_CONFIGS);
#   traveller (35) `jax-scan-rnn train traveller` with its defaults (wall time, the out-of-sample table);
#   train-vae (75 + 20) `jax-scan-rnn train vae` with its defaults (B=128, H=256, MOSES's data, 1,800 updates),
#            then `sample vae --greedy -n 10000` from it: wall time, the samples' validity and uniqueness;
#   bf16     (30) bfloat16 where it applies (the loops, lax.scan, nn.LSTM / jsr.LSTM, the limits); not a default
#            step (STEPS="... bf16"): the float32 steps fill the call;
#   check    (40) `jax-scan-rnn check` as a user runs it (JAX's float32 matmuls pinned, as on the CPU); not a default
#            step either (its output goes to gpu-run.log);
#   compile  (300) `tune_scan.py gpu-compile`: compile and run time under XLA:GPU's autotuning options, one process
#            per option (the H200's compiles grew with the batch, up to ~16 s); not a default step.
# Files under $OUT (8 at most): <kind>.json, <kind>-vae.json, <kind>-gen10k.json or <kind>-bf16.json (the suite's results;
# render_bench.py makes their tables and plots), train-traveller-<kind>.json and train-vae-<kind>.json
# (benchmarks/timed_run.py: wall time, memory, the run's evaluation), unroll-<kind>.json, hoist-<kind>.json,
# gpu-compile-<kind>.json and gpu-run.log (everything printed). Without a GPU the same steps run at tiny sizes on
# the CPU, GPU-only rows marked n/a: a check of the script, not a measurement.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY="${PYTHON:-python3}"

if [ "${1:-}" = --prepare ]; then
    set -e
    rm -rf .gpu && mkdir -p .gpu/wheels .gpu/site/moses/dataset/data
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/wheels rdkit
    TRAIN=$($PY -c 'import importlib.util, os; s = importlib.util.find_spec("moses")
print(os.path.join(s.submodule_search_locations[0], "dataset", "data", "train.csv.gz"))' 2>/dev/null) \
        || { echo "--prepare: MOSES's data is not installed here: pip install --no-deps molsets" >&2; exit 2; }
    cp "$TRAIN" .gpu/site/moses/dataset/data/
    : >.gpu/site/moses/__init__.py  # only found (importlib.util.find_spec), never imported
    du -sh .gpu
    echo "carry .gpu in the device call"
    exit 0
fi
if [ $# -gt 0 ]; then  # every other choice is an environment variable (STEPS, GRID_S, ...): the header says which
    echo "gpu.sh: expected no argument or --prepare, got '$*' (choose steps with STEPS=...; the header names them)" >&2
    exit 2
fi

STEPS="${STEPS:-grid vae gen parity unroll hoist traveller train-vae}"
GRID_S="${GRID_S:-120}"  # the grid step's hard limit; the suite stops starting cases 35 s before it
[[ "$GRID_S" =~ ^[0-9]+$ ]] && [ "$GRID_S" -ge 60 ] || { echo "GRID_S: expected whole seconds >= 60, got '$GRID_S'" >&2; exit 2; }
for step in $STEPS; do
    case " grid vae gen parity unroll hoist traveller train-vae bf16 check compile " in
        *" $step "*) ;;
        *) echo "STEPS: expected names among grid vae gen parity unroll hoist traveller train-vae bf16 check compile, got '$step'" >&2
           exit 2 ;;
    esac
done
want() { [[ " $STEPS " == *" $1 "* ]]; }

OUT="${OUT:-$ROOT/runs/gpu-sh}"
mkdir -p "$OUT"
if [ -n "$(ls -A "$OUT")" ]; then
    echo "OUT: expected an empty folder (no run writes over another's results), got $OUT holding $(ls "$OUT" | head -3 | tr '\n' ' ')" >&2
    exit 2
fi
LOG="$OUT/gpu-run.log"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# What --prepare carried, where this Python lacks it: rdkit's wheel, and the data folder of molsets.
if [ -d "$ROOT/.gpu/wheels" ] && ! $PY -c 'import rdkit' 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$ROOT"/.gpu/wheels/*.whl
    export PYTHONPATH="$PYTHONPATH:$WORK/site"
fi
if [ -d "$ROOT/.gpu/site/moses" ] && ! $PY -c 'import importlib.util as u, sys; sys.exit(u.find_spec("moses") is None)'; then
    export PYTHONPATH="$PYTHONPATH:$ROOT/.gpu/site"
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the GPU in one process
export PYTHONUNBUFFERED=1
export MPLBACKEND=Agg
START=$(date +%s)

say() { echo "[gpu.sh $(($(date +%s) - START)) s] $*" | tee -a "$LOG"; }
run() { # run <seconds> <command...>: a hard time limit per step, output to the terminal and the log
    local limit=$1
    shift
    say "\$ $*"
    timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$LOG"
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
import jax
from importlib.util import find_spec
from jax_scan_rnn.bench.machine import host_kind
print("jax", jax.__version__, jax.devices(), "host kind", host_kind())
try:
    import torch
    print("torch", torch.__version__, "cuda:", torch.cuda.is_available(),
          torch.cuda.get_device_name() if torch.cuda.is_available() else "")
except Exception as e:  # noqa: BLE001
    print("torch: not importable:", e)
print("rdkit:", "yes" if find_spec("rdkit") else "MISSING", "| MOSES data:", "yes" if find_spec("moses") else "MISSING")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$LOG"
# A first call of the library, so that a JAX it does not run with costs seconds, not the whole run.
if ! $PY -c 'import jax.numpy as jnp; from flax import nnx; import jax_scan_rnn as jsr
m = jsr.LSTM(3, 4, 1, batch_first=True, rngs=nnx.Rngs(0)); print("preflight: jsr.LSTM", m(jnp.ones((2, 5, 3)))[0].shape)' \
    2>&1 | tee -a "$LOG"; then
    say "preflight failed: this package does not run with this Python's JAX (above); nothing else was run"
    exit 1
fi
KIND=$($PY -c 'from jax_scan_rnn.bench.machine import host_kind; print(host_kind())' 2>>"$LOG")
BENCH=($PY -m jax_scan_rnn.bench --out "$WORK/bench" --no-plots)
CLI=($PY -m jax_scan_rnn.cli)


if [ "$GPU" = yes ]; then
    GRID=(--seq-lens 1000 --batch-sizes "${GRID_BATCHES:-1,64,1024}" --sweep-seq-lens 10 --max-call-s 1 --repeats 3
          --budget-s $((GRID_S - 35)))
    VAE=(--vae-batch-sizes 128 --vae-seq-lens 60 --batch-sizes 1 --seq-lens 10 --sweep-seq-lens 10 --repeats 3
         --max-call-s 5 --budget-s 60)
    GEN=(--vae-batch-sizes 10000 --vae-seq-lens 60 --batch-sizes 1 --seq-lens 10 --sweep-seq-lens 10 --repeats 3
         --max-call-s 5 --budget-s 20)
    BF16=(--seq-lens 1000 --batch-sizes 1,64,1024 --sweep-seq-lens 5 --max-call-s 1 --budget-s 15)
    PARITY=(-n 8)
    read -ra SWEEP <<<"${SWEEP_CONFIGS:-1x64 1024x64}"
    TRAVELLER=()
    TRAIN_VAE=()
    GREEDY_N=10000
    CHECK=()
else
    say "no GPU visible to both JAX and torch: the same steps at tiny sizes on the CPU (a check of this script)"
    GRID=(--seq-lens 20 --batch-sizes 1 --sweep-seq-lens 5 --repeats 3 --budget-s 10)
    VAE=(--vae-batch-sizes 4 --vae-seq-lens 6 --batch-sizes 1 --seq-lens 10 --sweep-seq-lens 5 --repeats 3 --budget-s 10)
    GEN=(--vae-batch-sizes 16 --vae-seq-lens 6 --batch-sizes 1 --seq-lens 10 --sweep-seq-lens 5 --repeats 3 --budget-s 10)
    BF16=(--seq-lens 20 --batch-sizes 1 --sweep-seq-lens 5 --repeats 3 --budget-s 5)
    PARITY=(-n 2 -k "lstm and forward")
    read -ra SWEEP <<<"${SWEEP_CONFIGS:-1x16}"
    TRAVELLER=(--steps 20 --eval-every 0 --hidden-size 8 --seq-len 16 --train-paths 64 --eval-paths 64)
    TRAIN_VAE=(--steps 20 --limit 2000 --hidden-size 16 --latent-size 4 --eval-every 0 --eval-samples 50)
    GREEDY_N=200
    CHECK=(--steps 50)
fi
GRID_ROWS=torch-cuda-graph,torch-lstm-seq,jax-scan-u1,jax-scan-u4,jax-scan-auto
VAE_ROWS=vae-ss-torch,vae-ss-torch-graph,vae-ss-jax,vae-tf-torch,vae-tf-jax
GEN_ROWS=vae-greedy-torch,vae-greedy-torch-graph,vae-greedy-jax
keep() { cp "$WORK"/bench/*.json "$OUT"/ 2>/dev/null; }  # each step's results reach $OUT as soon as it ends

# The Traveller, float32, TF32 off. The suite stops starting new cases at --budget-s; the limit is a hard stop.
want grid && { NVIDIA_TF32_OVERRIDE=0 run "$GRID_S" "${BENCH[@]}" --methods $GRID_ROWS "${GRID[@]}"; keep; }

# The VAE rows: a train step (whole ELBO + Adam) and decoding at B=128; then generation at B=10000 (the
# Traveller's seed and limit rows, which every run has, at T=10 only).
want vae && { NVIDIA_TF32_OVERRIDE=0 run 85 "${BENCH[@]}" --label vae --methods $VAE_ROWS "${VAE[@]}"; keep; }
want gen && { NVIDIA_TF32_OVERRIDE=0 run 45 "${BENCH[@]}" --label gen10k --modes forward --methods $GEN_ROWS "${GEN[@]}"
    keep; }

# Parity on the GPU (each layer and VAE test runs with the input projections hoisted and inside the loop).
# (-o addopts="": the repository's default options are CI's)
want parity && NVIDIA_TF32_OVERRIDE=0 run 190 $PY -m pytest parity_tests -q -rfE -p no:cacheprovider -o addopts="" \
    "${PARITY[@]}"

# unroll (time per step vs unroll 1..16, forward and train step) and hoisting, on this GPU.
want unroll && NVIDIA_TF32_OVERRIDE=0 run 60 $PY benchmarks/tune_scan.py unroll "${SWEEP[@]}" --rounds 2 \
    --out "$OUT/unroll-$KIND.json"
want hoist && NVIDIA_TF32_OVERRIDE=0 run 25 $PY benchmarks/tune_scan.py hoist "${SWEEP[@]}" --out "$OUT/hoist-$KIND.json"

# The Traveller as a user trains it: the README's first command, its defaults, a first run (empty cache).
want traveller && run 35 $PY benchmarks/timed_run.py --results "$OUT/train-traveller-$KIND.json" \
    --report "$WORK/traveller/evaluation.json" -- "${CLI[@]}" train traveller --out "$WORK/traveller" "${TRAVELLER[@]}"

# The VAE as a user trains it (its defaults: B=128, H=256, MOSES's data), then greedy generation from it.
if want train-vae; then
    run 75 $PY benchmarks/timed_run.py --results "$OUT/train-vae-$KIND.json" \
        --report "$WORK/vae/evaluation.json" -- "${CLI[@]}" train vae --out "$WORK/vae" "${TRAIN_VAE[@]}"
    if [ -d "$WORK/vae/checkpoints" ]; then
        T0=$(date +%s.%N)
        run 20 "${CLI[@]}" sample vae --checkpoint "$WORK/vae" --greedy -n $GREEDY_N --output "$WORK/greedy.txt"
        $PY - "$WORK/greedy.txt" "$T0" "$(date +%s.%N)" <<'EOF' 2>&1 | tee -a "$LOG"
import sys
from importlib.util import find_spec
path, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
try:
    lines = open(path).read().splitlines()
except OSError:
    sys.exit("greedy generation: no samples were written (its output is above)")
print(f"greedy generation: {len(lines)} samples in {t1 - t0:.1f} s (the command's wall time, start-up and "
      f"compilation included)")
if find_spec("rdkit"):
    from jax_scan_rnn.metrics import uniqueness, validity
    print(f"greedy generation: validity {validity(lines):.4f}, uniqueness {uniqueness(lines):.4f}")
else:
    print("greedy generation: validity not measured: rdkit is not installed")
EOF
    else
        say "greedy generation skipped: the VAE run left no checkpoint"
    fi
fi

# The user's parity self-check, on this device (the parity step above is the thorough one).
want check && run 40 "${CLI[@]}" check "${CHECK[@]}"

# What XLA:GPU's autotuning costs at compile time and gains at run time (on a CPU: tiny cases, a check).
want compile && NVIDIA_TF32_OVERRIDE=0 run 300 $PY benchmarks/tune_scan.py gpu-compile --out "$OUT/gpu-compile-$KIND.json"

# bfloat16 where it applies (inputs and compute in bf16, JAX parameters kept in float32).
want bf16 && { run 30 "${BENCH[@]}" --dtype bfloat16 \
    --methods torch-cell,torch-cuda-graph,torch-lstm-seq,jax-scan-u1,jax-scan-u4,jax-scan-u16,jax-lstm-seq "${BF16[@]}"; keep; }

rm -f "$OUT"/*.lock  # timed_run.py's holds on its results files while it ran (jax_scan_rnn/lock.py), not results
say "done in $(($(date +%s) - START)) s; files in $OUT:"
ls -l "$OUT" | tee -a "$LOG"
