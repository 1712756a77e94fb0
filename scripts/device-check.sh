#!/usr/bin/env bash
# scripts/device-check.sh — the CUDA backend on a machine with a GPU, in under
# 5 minutes: configure and build the CUDA targets (test_cuda_attention,
# bench_cuda_attention) for this GPU's architecture, run the CUDA tests, run
# the benchmark within the time left, and print one table.
#
# Usage: bash scripts/device-check.sh [BUILD_DIR]   (default build-device)
# Environment: CUDA_ARCH (default "native": only this GPU's architecture, to
# keep the build short; CI builds 80;90), DEVICE_CHECK_SECONDS (default 290).
# Exit status: non-zero if the build fails, no GPU is visible, or a test fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$(date +%s)
total=${DEVICE_CHECK_SECONDS:-290}
build=${1:-build-device}
arch=${CUDA_ARCH:-native}
log=$(mktemp -d)
left() { echo $(( total - ($(date +%s) - start) )); }

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

echo "== configure ($build, CUDA architectures: $arch)"
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCONTINUUM_ENABLE_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCONTINUUM_BUILD_EXAMPLES=OFF -DCONTINUUM_GPU_TESTS_ONLY=ON \
     "${launcher[@]}" >"$log/configure.txt" 2>&1; then
  tail -30 "$log/configure.txt"; echo "device-check: configure failed"; exit 1
fi
echo "== build test_cuda_attention bench_cuda_attention"
t0=$(date +%s)
if ! cmake --build "$build" --target test_cuda_attention bench_cuda_attention \
     --parallel "$(nproc)" >"$log/build.txt" 2>&1; then
  grep -E "error" "$log/build.txt" | head -30; echo "device-check: build failed"; exit 1
fi
build_s=$(( $(date +%s) - t0 ))

echo "== tests (time left $(left) s)"
t0=$(date +%s)
timeout $(( $(left) > 200 ? 150 : $(left) - 50 )) \
  "$build/tests/cuda/test_cuda_attention" >"$log/tests.txt" 2>&1
test_rc=$?
test_s=$(( $(date +%s) - t0 ))
test_line=$(grep -E "^(All tests passed|test cases:|SKIPPED)" "$log/tests.txt" | tail -1)
[ "$test_rc" -ne 0 ] && grep -B2 -A8 "FAILED" "$log/tests.txt" | head -60
device=$(grep -m1 "^CUDA device" "$log/tests.txt")

budget=$(( $(left) - 10 ))
[ "$budget" -lt 20 ] && budget=20
echo "== benchmark (budget $budget s)"
"$build/bench/cuda/bench_cuda_attention" --budget "$budget" >"$log/bench.txt" 2>&1
bench_rc=$?

echo
echo "=================== continuum CUDA device check ==================="
echo "${device:-no device line (see $log/tests.txt)}"
printf "build %ss (arch %s) | tests %ss rc=%s: %s\n" "$build_s" "$arch" "$test_s" "$test_rc" "${test_line:-no summary}"
cat "$log/bench.txt"
echo "total $(( $(date +%s) - start ))s; logs in $log"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
