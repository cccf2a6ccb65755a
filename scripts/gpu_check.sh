#!/usr/bin/env bash
# One-shot GPU check for a lent device machine (see README "GPU checks").
# Runs the sgl-cuda tests compiled (no interpreter) and the GPU benchmarks;
# writes logs and JSON under $OUT. Needs the wheels in .whl/ (gguf, hatchling).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
  --no-deps --target /tmp/sgl packages/core packages/cuda || exit 1
export PYTHONPATH=/tmp/sgl:/tmp/site
{ nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } \
  > "$OUT/gpu.txt" 2>&1
timeout ${TEST_TIMEOUT:-240} python3 -m pytest packages/cuda/tests -q -p no:cacheprovider -rfE \
  --durations=8 > "$OUT/cuda_tests.log" 2>&1; echo "cuda tests rc=$?" >> "$OUT/gpu.txt"
timeout ${BENCH_TIMEOUT:-150} python3 packages/cuda/benchmarks/gpu_hicache.py "$OUT/hicache.json" \
  > "$OUT/hicache.log" 2>&1; echo "hicache rc=$?" >> "$OUT/gpu.txt"
timeout ${BENCH_TIMEOUT:-150} python3 packages/cuda/benchmarks/gpu_ggml_moe.py \
  --json "$OUT/ggml.json" > "$OUT/ggml.log" 2>&1; echo "ggml rc=$?" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"; tail -5 "$OUT/cuda_tests.log"; cat "$OUT/hicache.log" "$OUT/ggml.log" | tail -40
