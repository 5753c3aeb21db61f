#!/usr/bin/env bash
# The device side of bench/gpu_prepare.sh: one call on a lent GPU machine (its image has CUDA, PyTorch and Triton,
# nothing fetchable) that verifies the prepared offline kernels again on the GPU at GPU sizes and times them
# against eager and torch.compile (bench_kernel_gpu). Everything it writes lands in $OUT:
#   log.txt       the whole output (versions first)      gpu.jsonl    one row per kernel, as each finishes
#   results.csv   KernelBench v3 columns
# DEADLINE_S (default 420): start no new work after this many seconds, so the call ends inside its 570 s.
# Arguments go to bench_kernel_gpu: a second call right after a first that hit its deadline (the machine stays warm
# for 30 s) can take the rest, e.g. `bash bench/gpu_session.sh --only level2`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:?run through the device tool: \$OUT is where the results go}"
exec > >(tee "$OUT/log.txt") 2>&1
[ -d .gpu/pairs ] || { echo "gpu_session: no .gpu/pairs: run bench/gpu_prepare.sh here first and carry .gpu"; exit 2; }
for deb in .gpu/deb/*.deb; do dpkg -x "$deb" /; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /opt/ffsite .gpu/whl/*.whl \
    || { echo "gpu_session: the carried wheels did not install"; exit 2; }
export PYTHONPATH="/opt/ffsite:$PWD" PYTHONUNBUFFERED=1
echo "commit: $(cat .gpu/COMMIT 2>/dev/null || echo unknown)"
nvidia-smi -L
bwrap --version
python3 -c "import sys, torch, triton, pydantic; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'triton', triton.__version__, 'pydantic', pydantic.__version__, 'gpu', torch.cuda.get_device_name())"
python3 -m bench.bench_kernel_gpu --pairs .gpu/pairs --jobs 8 --deadline-s "${DEADLINE_S:-420}" \
    --rows "$OUT/gpu.jsonl" --csv "$OUT/results.csv" "$@"
