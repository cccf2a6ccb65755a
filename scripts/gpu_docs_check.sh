#!/usr/bin/env bash
# One-shot GPU check of the README example, sgl-bench on a real GPU and its exit-2 paths.
# Run from the repository root on a lent GPU machine; needs the wheels in .whl/ (hatchling).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/sgl \
  packages/core packages/cuda packages/ascend || exit 1
export PYTHONPATH=/tmp/sgl:/tmp/site
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
echo "== README example (auto backend)"
python3 - <<'PY' 2>&1 | tee "$OUT/readme.log"
import re
text = open("README.md").read()
exec(compile(re.findall(r"```python\n(.*?)```", text, re.S)[0], "README.md", "exec"), {"__name__": "x"})
PY
echo "== sgl-bench hicache (default run)"
timeout 180 python3 -m sgl_core.cli.main hicache 2>&1 | tee "$OUT/hicache_default.log"; echo "rc=${PIPESTATUS[0]}"
echo "== sgl-bench hicache --backend cuda small"
timeout 120 python3 -m sgl_core.cli.main hicache --backend cuda --layers 4 --pages 4 --repeats 2 2>&1 | tail -12; echo "rc=${PIPESTATUS[0]}"
echo "== exit-2 paths on a GPU machine"
for a in "hicache --device cuda:99" "hicache --pages 1000000000" "moe --tokens 1000000000" "moe --device meta" "hicache --repeats 0"; do
  python3 -m sgl_core.cli.main $a; echo "rc=$? ($a)"
done
echo "== pytest"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE packages/core/tests/test_cli.py packages/core/tests/test_discovery.py \
  -k "not all_backends_and_plot and not moe_json_and_plot" 2>&1 | tail -15
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE packages/cuda/tests/test_cuda_conformance.py -k default_io 2>&1 | tail -3
