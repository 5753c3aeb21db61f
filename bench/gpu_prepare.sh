#!/usr/bin/env bash
# Prepares the one `device` call that times offline kernels on a lent GPU (issue 37's GPU line), on this machine,
# before any device time is spent: everything the call needs goes into .gpu/ (git-ignored, carried by the call).
#
#   bash bench/gpu_prepare.sh                 # make the pairs: every 3rd public Level 1 and 2 task (about 15-25 min on 2 cores)
#   bash bench/gpu_prepare.sh --pairs DIR     # or use a bench_kernelbench workdir's recheck/ folder
#
# .gpu/pairs  NAME/task.py + NAME/candidate.py, the kernels the offline agents verified (bench_kernel_gpu's input)
# .gpu/whl    the Python packages the bench imports that the GPU image lacks or has older (pydantic and its
#             needs, this checkout's versions, for the image's CPython 3.12)
# .gpu/deb    bubblewrap, the sandbox every kernel child runs in (the image has none)
# Then it prints the device call: `bash bench/gpu_session.sh`, carrying .gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
GPU=.gpu
pairs=""
if [ "${1:-}" = "--pairs" ]; then pairs="${2:?--pairs DIR}"; fi
[ -x "$PY" ] || { echo "gpu_prepare: run 'make setup' first (no $PY)" >&2; exit 2; }
rm -rf "$GPU/pairs" "$GPU/whl" "$GPU/deb"
mkdir -p "$GPU/pairs" "$GPU/whl" "$GPU/deb"

if [ -z "$pairs" ]; then
    # every 3rd file of each level by its number (1, 4, 7, ...): the third the issue asks to time
    only=$(cd examples/kernelbench && for level in level1 level2; do
               ls "$level" | sort -n | awk -F_ 'NR % 3 == 1 { sub(/\.py$/, ""); print }'
           done | paste -sd, -)
    run=.fleetforge/gpu-run  # not under .gpu: only what the call needs travels
    rm -rf "$run"
    echo "gpu_prepare: verifying every 3rd public Level 1 and 2 task offline (workdir $run)"
    # a candidate may take 300 s under the interpreter (one conv-transposed 3-D task takes over 1,000 s: left out)
    "$PY" -m bench.bench_kernelbench --suite public --level 1,2 --only "$only" --workdir "$run" --csv "$run/results.csv" \
        --time-limit-ceiling 300
    pairs="$run/recheck"
fi
[ -d "$pairs" ] || { echo "gpu_prepare: no folder $pairs" >&2; exit 2; }
for dir in "$pairs"/*/; do
    name=$(basename "$dir")
    if [ -f "$dir/task.py" ] && [ -f "$dir/candidate.py" ]; then
        mkdir -p "$GPU/pairs/$name"
        cp "$dir/task.py" "$dir/candidate.py" "$GPU/pairs/$name/"
    fi
done
count=$(find "$GPU/pairs" -name candidate.py | wc -l)
[ "$count" -gt 0 ] || { echo "gpu_prepare: no verified pair (task.py + candidate.py) under $pairs" >&2; exit 1; }

# the versions this checkout runs with, as wheels for the image's CPython 3.12
wheels=()
for pkg in pydantic pydantic-core annotated-types typing-inspection typing-extensions; do
    wheels+=("$pkg==$("$PY" -m pip show "$pkg" | awk '/^Version:/ { print $2 }')")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$GPU/whl" "${wheels[@]}"
(cd "$GPU/deb" && apt-get download bubblewrap >/dev/null 2>&1) \
    || { echo "gpu_prepare: 'apt-get download bubblewrap' failed: run it here to see why (the device has no" \
              "bubblewrap and fetches nothing, so the call needs the .deb)" >&2; exit 1; }
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' plus uncommitted changes')" > "$GPU/COMMIT"

echo "gpu_prepare: $count pairs, $(ls "$GPU/whl" | wc -l) wheels, $(ls "$GPU/deb"), $(du -sh "$GPU" | cut -f1) to carry"
echo "next, one device call:  run(command='bash bench/gpu_session.sh', carry=['.gpu'], timeout_s=570)"
echo "beside it, here (no GPU; about a minute a pair):  $PY -m bench.bench_kernel_gpu --pairs $GPU/pairs --model h100 --rows $GPU/model.jsonl"
echo "then:  $PY -m bench.bench_kernel_gpu --report-from FILES_AT/gpu.jsonl $GPU/model.jsonl"
