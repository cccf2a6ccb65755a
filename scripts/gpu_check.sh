#!/usr/bin/env bash
# One-shot GPU check for a lent device machine (see README "GPU checks").
# Runs the sgl-cuda tests compiled (no interpreter), the HiCache bench (+ sweep,
# SM budget), the GGML bench and one ncu profile; every step has its own timeout.
# Writes at most 10 files under $OUT: gpu.txt (env + step status), cuda_tests.log,
# hicache.json, hicache.log, hicache_mha.json, hicache_mha.log, ggml.json, ggml.log,
# ncu.txt. hicache.json's meta.copy_calibration says what SGL_CUDA_DIRECT_COPY=auto
# picked per kind of transfer, and why (its auto rows time it). Needs .whl/*.whl
# (gguf, hatchling). Worst case 8.3 min: 15+25 pip, 15 env, 135 tests, 100 hicache, 40 MHA hicache, 130 ggml, 35 ncu (each overridable:
# TEST_TIMEOUT, HICACHE_TIMEOUT, MHA_TIMEOUT, GGML_TIMEOUT, NCU_TIMEOUT).
# CPU dry run of the python steps: GPU_CHECK_TINY=1 TRITON_INTERPRET=1 (see tests).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
TINY=${GPU_CHECK_TINY:-0}
SITE=${GPU_CHECK_SITE:-/tmp/sgl-gpu-site}
mkdir -p "$SITE"
T0=$(date +%s)
step() { echo "$1 rc=$2 ($(($(date +%s) - T0))s)" >> "$OUT/gpu.txt"; }

: > "$OUT/gpu.txt"
if [ "$TINY" = 1 ]; then
  export PYTHONPATH=$PWD/packages/core/src:$PWD/packages/cuda/src${PYTHONPATH:+:$PYTHONPATH}
  DEV="--device cpu --tiny"
else
  timeout 15 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE/whl" .whl/*.whl >> "$OUT/gpu.txt" 2>&1; step "pip wheels" $?
  export PYTHONPATH=$SITE/whl
  timeout 25 $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
    --target "$SITE/sgl" packages/core packages/cuda > "$SITE.pip.log" 2>&1
  rc=$?; step "pip sgl" $rc
  if [ $rc = 0 ]; then
    export PYTHONPATH=$SITE/sgl:$SITE/whl
  else  # pure Python packages: run from the sources rather than not at all
    tail -3 "$SITE.pip.log" >> "$OUT/gpu.txt"
    echo "install failed: running from packages/*/src" >> "$OUT/gpu.txt"
    export PYTHONPATH=$PWD/packages/core/src:$PWD/packages/cuda/src:$SITE/whl
  fi
  DEV=""
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  timeout 15 $PY -c "import torch, triton, sgl_cuda; from sgl_cuda import _copy_engine, _cudart
rt = _cudart.runtime() if torch.cuda.is_available() else None
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)
print('cudart', rt.version if rt else None, 'batch', _copy_engine.available(), rt.lib._name if rt else '')" 2>&1
} >> "$OUT/gpu.txt"

TESTS=packages/cuda/tests
[ "$TINY" = 1 ] && TESTS="packages/cuda/tests/test_copy_engine.py"
timeout ${TEST_TIMEOUT:-135} $PY -m pytest $TESTS -q -p no:cacheprovider -rfE \
  --durations=5 > "$OUT/cuda_tests.log" 2>&1; step "cuda tests" $?

HT=${HICACHE_TIMEOUT:-100}
timeout $HT $PY packages/cuda/benchmarks/gpu_hicache.py "$OUT/hicache.json" \
  --budget-s $((HT * 7 / 10)) $DEV ${HICACHE_ARGS:-} > "$OUT/hicache.log" 2>&1; step "hicache" $?

# MHA pools (kernel and direct io of every MHA layout), random host pages.
timeout ${MHA_TIMEOUT:-40} $PY packages/cuda/benchmarks/gpu_hicache_mha.py "$OUT/hicache_mha.json" \
  --shuffle-host $DEV > "$OUT/hicache_mha.log" 2>&1; step "hicache mha" $?

GGML_DEV=""
[ "$TINY" = 1 ] && GGML_DEV="--help"
timeout ${GGML_TIMEOUT:-130} $PY packages/cuda/benchmarks/gpu_ggml_moe.py --json "$OUT/ggml.json" \
  $GGML_DEV > "$OUT/ggml.log" 2>&1; step "ggml" $?

if command -v ncu > /dev/null && [ "$TINY" != 1 ]; then
  timeout ${NCU_TIMEOUT:-35} ncu --clock-control none --kernel-name regex:_copy_rows_kernel \
    --launch-skip 1 --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section LaunchStats --section Occupancy \
    $PY packages/cuda/benchmarks/gpu_hicache.py /dev/null --ncu-target > "$OUT/ncu.txt" 2>&1
  step "ncu" $?
else
  $PY packages/cuda/benchmarks/gpu_hicache.py /dev/null --ncu-target $DEV > "$OUT/ncu.txt" 2>&1
  step "ncu target (no ncu)" $?
fi

# Printed last to first in importance: the run's output keeps only its last 12,000 chars.
echo "=== ncu (per-layer loads: layer_first, then page_first)"
grep -E "_copy_rows_kernel|  Duration|DRAM Throughput|  Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|  Grid Size|Waves Per SM|Mem Busy|Max Bandwidth|L2 Hit Rate|==ERROR" \
  "$OUT/ncu.txt" | cut -c1-110 | head -30
echo "=== ggml"; tail -10 "$OUT/ggml.log" | cut -c1-160
echo "=== hicache mha"; tail -16 "$OUT/hicache_mha.log" | cut -c1-160
echo "=== hicache"
if grep -q "^=== compact" "$OUT/hicache.log"; then
  sed -n '/^=== compact/,$p' "$OUT/hicache.log"
else  # killed by its timeout: summarize what it saved after each step
  tail -12 "$OUT/hicache.log" | cut -c1-200
  timeout 20 $PY packages/cuda/benchmarks/gpu_hicache.py "$OUT/hicache.json" --summarize 2>&1 | tail -60
fi
echo "=== cuda tests"; grep -E "^(FAILED|ERROR)" "$OUT/cuda_tests.log" | cut -c1-160 | head -15
tail -2 "$OUT/cuda_tests.log" | cut -c1-200
echo "=== steps ($(($(date +%s) - T0))s)"
cat "$OUT/gpu.txt"
