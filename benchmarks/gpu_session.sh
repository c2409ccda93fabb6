#!/usr/bin/env bash
# One GPU session, every measurement of issue #25's GPU part in one run of at most ~7 minutes (GPU_SESSION_BUDGET_S,
# default 420 s of wall time, start-up of the machine not included):
#   1. tests   the flex-vs-dense forward + backward test and the bf16 encoder test on CUDA (pytest when installed,
#              else the test functions called directly)
#   2. train   benchmarks/train.py --throughput: samples/s, wait (sampler) vs compute, GPU utilisation, at several batch
#              sizes, loader processes and precisions on one MovieLens window
#   3. attn_fwdbwd, attn_fwd   benchmarks/attention.py up to N = 16,384: the crossover table, auto_vs_best per N
#   4. budget  (only with the time left) the budget sweep: default vs full over the last MovieLens windows, with the
#              next-window recall proxy
# GPU_SESSION_STEPS (comma-separated, default all) picks steps, e.g. GPU_SESSION_STEPS=budget for a second call.
# Each step runs under its own `timeout` (cut to the time left), a failing step does not stop the next, and
# everything goes under $OUT (default /tmp/gpu_out): <step>.log (full output), summary.txt (step, rc, seconds) and
# results.txt (the key=value lines). The last lines printed are a condensed summary.
#
#     bash benchmarks/gpu_session.sh                # on the GPU machine, from the repository root (PYTHONPATH=.)
#     bash benchmarks/gpu_session.sh --cpu-smoke    # the same steps at toy sizes on CPU (also chosen without CUDA)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
rm -f "$OUT/summary.txt" "$OUT/results.txt"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}  # deterministic cuBLAS (TrainConfig.deterministic)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTHONUNBUFFERED=1
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=$(command -v python3 || command -v python); fi
fi
BUDGET=${GPU_SESSION_BUDGET_S:-420}
START=$(date +%s)
SMOKE=0
[ "${1:-}" = "--cpu-smoke" ] && SMOKE=1
if [ $SMOKE = 0 ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "no CUDA device: running the CPU smoke sizes" | tee -a "$OUT/summary.txt"
  SMOKE=1
fi
if [ $SMOKE = 1 ]; then  # the device has no dagster: make sure nothing here needs it
  mkdir -p "$OUT/.nodagster"
  printf '%s\n' 'import sys' 'class _NoDagster:' \
    '    def find_spec(self, name, path=None, target=None):' \
    '        if name.split(".")[0].startswith("dagster"):' \
    '            raise ImportError(f"{name}: not installed on the GPU machine")' \
    'sys.meta_path.insert(0, _NoDagster())' > "$OUT/.nodagster/sitecustomize.py"
  export PYTHONPATH="$OUT/.nodagster:$PYTHONPATH"
fi
export PY OUT

# step NAME LIMIT_S CMD...: run CMD under timeout (LIMIT_S, cut to the time left), output to $OUT/NAME.log
STEPS=",${GPU_SESSION_STEPS:-tests,tests_direct,train,attn_fwdbwd,attn_fwd,budget},"
step() {
  local name=$1 limit=$2; shift 2
  case "$STEPS" in *",$name,"*) ;; *) return 0 ;; esac
  local left=$((BUDGET - ($(date +%s) - START) - 5))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 20 ]; then
    echo "step=$name rc=skipped seconds=0 reason=no_time_left" | tee -a "$OUT/summary.txt"
    return 0
  fi
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*" >&2
  timeout -k 10 "$limit" bash -c '"$@"' _ "$@" > "$OUT/$name.log" 2>&1  # bash -c: the shell functions below too
  local rc=$?
  echo "step=$name rc=$rc seconds=$(($(date +%s) - t0)) limit=$limit$([ $rc = 124 ] && echo ' timed_out=yes')" | tee -a "$OUT/summary.txt"
  grep -E '^(case=|summary |torch=|step=|PASSED|FAILED|SKIPPED|tests )' "$OUT/$name.log" | sed "s/^/$name: /" >> "$OUT/results.txt"
  return 0
}

# The CUDA tests without pytest: its decorators stubbed, each case called directly.
run_tests_directly() {
  "$PY" - "$@" <<'EOF'
import sys, traceback, types
pytest = types.ModuleType("pytest")
class _Mark:
    def __getattr__(self, name):
        def mark(*args, **kwargs):
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]
            return lambda f: f
        return mark
pytest.mark = _Mark()
pytest.param = lambda *values, marks=(): values[0] if len(values) == 1 else values
pytest.fixture = lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda f: f))
sys.modules["pytest"] = pytest
import torch
from tests.hir_model.nn import test_backends_devices as t
devices = ["cuda"] if torch.cuda.is_available() else ["cpu"]
cases = [(f"test_flex_matches_dense_forward_and_backward[{d}]", t.test_flex_matches_dense_forward_and_backward, (d,)) for d in devices]
if torch.cuda.is_available():
    cases += [(f"test_encoder_under_bf16_autocast_tracks_float32[{b}]", t.test_encoder_under_bf16_autocast_tracks_float32, (b,))
              for b in ("dense", "flex")]
failed = 0
for name, fn, args in cases:
    try:
        fn(*args)
        print(f"PASSED {name}", flush=True)
    except Exception:
        failed += 1
        print(f"FAILED {name}", flush=True)
        traceback.print_exc()
print(f"tests passed={len(cases) - failed} failed={failed} runner=direct")
sys.exit(1 if failed else 0)
EOF
}

export -f run_tests_directly

run_tests() {
  if "$PY" -c "import pytest" 2>/dev/null; then
    # our own ini: the project's names dagster's warning class, and the device has no dagster
    printf '[pytest]\nmarkers =\n    slow: slow tests\n' > "$OUT/pytest.ini"
    "$PY" -m pytest -c "$OUT/pytest.ini" --rootdir . -p no:cacheprovider -rA -q "$@" \
      tests/hir_model/nn/test_backends_devices.py tests/hir_model/nn/test_backends.py
    local rc=$?
    echo "tests runner=pytest rc=$rc"
    return $rc
  fi
  run_tests_directly
}

export -f run_tests

"$PY" - > "$OUT/env.log" 2>&1 <<'EOF'
import os, platform, torch
print(f"torch={torch.__version__} python={platform.python_version()} cuda={torch.version.cuda} cores={os.cpu_count()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"gpu={p.name.replace(' ', '_')} memory_gib={p.total_memory / 2**30:.0f} capability={p.major}.{p.minor}")
EOF
command -v nvidia-smi > /dev/null && nvidia-smi >> "$OUT/env.log" 2>&1
cat "$OUT/env.log" | head -3

if [ $SMOKE = 1 ]; then
  step tests 120 run_tests -m "not slow"
  step tests_direct 120 run_tests_directly
  step attn_fwdbwd 60 "$PY" benchmarks/attention.py --device cpu --mode fwdbwd --lengths 128,256 --tokens 512 --repeats 2 --threads 1
  step attn_fwd 60 "$PY" benchmarks/attention.py --device cpu --mode fwd --lengths 128 --tokens 512 --repeats 2 --threads 1
  step train 120 "$PY" benchmarks/train.py --throughput --window-index 1 --steps 2 \
    --case "batch_size=64" --case 'batch_size=64 loader_workers=2 precision="bf16" profile=true' --case "batch_size=63"
  step budget 120 "$PY" benchmarks/train.py --budgets default --windows 1 --steps 2
else
  step tests 90 run_tests -m "not slow"
  # by priority: a cut-off run still has the first cases. Auto on CUDA: bf16, 12 lean loader processes
  step train 140 "$PY" benchmarks/train.py --throughput --window-index 7 --steps 25 --threads 4 \
    --case "batch_size=4096" \
    --case "batch_size=512" \
    --case 'batch_size=512 loader_workers=0 precision="fp32"' \
    --case "batch_size=4096 deterministic=false" \
    --case "batch_size=16384 shards=4" \
    --case "batch_size=4096 loader_workers=6" \
    --case 'budget="full"' \
    --case "batch_size=4096 profile=true"
  step attn_fwdbwd 100 "$PY" benchmarks/attention.py --device cuda --mode fwdbwd --lengths 1024,2048,4096,8192,16384 --repeats 3
  step attn_fwd 75 "$PY" benchmarks/attention.py --device cuda --mode fwd --lengths 256,1024,4096,16384 --repeats 3
  step budget 200 "$PY" benchmarks/train.py --budgets default,full --first 24 --windows 31 --threads 4
fi

echo "elapsed_s=$(($(date +%s) - START)) budget_s=$BUDGET smoke=$SMOKE" | tee -a "$OUT/summary.txt"
# condensed: per step its outcome, then the figures that matter (full lines in results.txt and the logs)
"$PY" - "$OUT" <<'EOF'
import re, sys
from pathlib import Path
out = Path(sys.argv[1])
keep = {"attn": ["case", "mode", "B", "dense_ms", "flex_ms", "auto_backend", "auto_why", "auto_vs_best", "dense_mb", "flex_mb"],
        "summary": ["mode", "flex_faster_at", "flex_from", "auto_worst_vs_best", "auto_within_10pct"],
        "throughput": ["set", "samples_per_s", "steady_samples_per_s", "wait_share", "loader", "precision", "gpu_util", "gpu_util_source",
                       "gpu_kernel_busy", "loop_share", "error"],
        "budget": ["budget", "samples_per_window", "train_s_per_window", "samples_per_s", "next_r20_dot_last4",
                   "next_r20_prior_last4", "evaluated"]}
for line in (out / "results.txt").read_text().splitlines() if (out / "results.txt").exists() else []:
    step, _, rest = line.partition(": ")
    kv = dict(re.findall(r"(\w+)=(\S+)", rest))
    kind = ("summary" if rest.startswith("summary") else "attn" if step.startswith("attn") and "case" in kv
            else "throughput" if kv.get("case") == "throughput" else "budget" if kv.get("case") == "budget" else None)
    if kind is None:
        if rest.startswith(("FAILED", "tests ")):
            print(f"{step}: {rest}")
        continue
    print(f"{step}: " + " ".join(f"{k}={kv[k]}" for k in keep[kind] if k in kv))
EOF
exit 0
