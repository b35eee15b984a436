#!/usr/bin/env bash
# Issue #9's GPU run on a lent device machine (no TVM there; calls carry at most 64 MiB, the TVM wheel is 100 MB).
#   here:            bash benchmarks/gpu_session.sh prepare      # wheels for Python 3.12 into .dev1/ (part 1) and .dev2/
#   device call 1:   run(carry=[".dev1"], command="bash benchmarks/gpu_session.sh stage")
#   device call 2:   run(carry=[".dev2"], command="bash benchmarks/gpu_session.sh go")   # within ~30 s of call 1
# `go` installs into /tmp/site, then writes to $OUT: the CUDA benchmark at batch 8 and 64 (cuda8.json, cuda64.json;
# k8.md, k64.md: per-kernel GPU times), gpu tests (gpu_tests.txt), each GEMM with both weight layouts (stdout) and
# CUDA graphs (cuda8_graph.json).
set -euo pipefail
case "${1:-}" in
prepare)
  rm -rf .whl .dev1 .dev2 && mkdir -p .whl .dev1 .dev2
  pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl \
    'apache-tvm==0.27.*' apache-tvm-ffi==0.1.14.post1 onnxruntime-extensions==0.15.2 onnx-graphsurgeon
  tvm=$(ls .whl/apache_tvm-0.27*.whl)
  split -b 50m "$tvm" .dev1/tvm.part.
  mv .dev1/tvm.part.a[b-z] .dev2/ && cp .whl/*.whl .dev2/ && rm .dev2/"$(basename "$tvm")"
  echo "$(basename "$tvm")" > .dev2/tvm.name
  du -sh .dev1 .dev2 ;;
stage)
  cp .dev1/tvm.part.* /tmp/ && ls -la /tmp/tvm.part.* ;;
go)
  cp .dev2/tvm.part.* /tmp/ && cat /tmp/tvm.part.* > "/tmp/$(cat .dev2/tvm.name)"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "/tmp/$(cat .dev2/tvm.name)" .dev2/*.whl
  python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site .
  rm -rf ivit_onnx  # the tree's copy would shadow the installed one (and its built library)
  export PYTHONPATH=/tmp/site:$PWD/tests/tvm
  export PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,driver_version --format=csv
  # most important first, each step bounded by its cap and by what is left of a 570 s budget (the call's limit is
  # 600 s), so one slow step cannot take the others' results with it
  left() { local l=$((570 - SECONDS)); echo $((l < $1 ? (l > 1 ? l : 1) : $1)); }
  timeout "$(left 230)" python3 benchmarks/bench_tvm.py --target cuda --json "$OUT/cuda8.json" \
    --kernels-out "$OUT/k8.md" 2>&1 | tee "$OUT/cuda8.txt" || true
  timeout "$(left 100)" python3 -m pytest -q -m gpu tests/tvm/test_cuda_tiles.py tests/tvm/test_cuda_tc.py \
    -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt" || true
  timeout "$(left 200)" python3 benchmarks/bench_tvm.py --target cuda --batch 64 --json "$OUT/cuda64.json" \
    --kernels-out "$OUT/k64.md" 2>&1 || true
  timeout "$(left 90)" python3 benchmarks/bench_tc_layout.py 2>&1 || true  # each GEMM, [K, N] vs [N, K] weights
  timeout "$(left 200)" python3 -m pytest -q -m gpu tests/tvm tests/e2e -p no:cacheprovider \
    --deselect tests/tvm/test_cuda_tiles.py --deselect tests/tvm/test_cuda_tc.py 2>&1 | tail -15 \
    | tee -a "$OUT/gpu_tests.txt" || true
  timeout "$(left 120)" python3 benchmarks/bench_tvm.py --target cuda --cuda-graph --json "$OUT/cuda8_graph.json" \
    2>&1 | tail -20 || true ;;
*)
  echo "usage: $0 prepare|stage|go" >&2; exit 2 ;;
esac
