#!/usr/bin/env bash
# GPU-host check of the CUDA kernels, run from inside the bundle that
# /work/shared/tools/bundle-for-gpu-host makes (bin/gpu_kernels_test + lib/):
#   .gpu-bundle/run bash gpu_device_check.sh [all|sanitize|both|budget|speed]
# Writes logs to $OUT (or /tmp/gpu-check): the device, the FP8 MMA instructions in the SASS,
# the full test log, and (sanitize) compute-sanitizer memcheck + racecheck on a small set.
# budget: the budget's products on the GPU (bin/gpu_budget_products_test and bin/moecheck in the
# bundle): the tests with both forms of the truncation pass, both sanitizers on its bit test, and
# compare's time on the GPU beside the CPU's (bench reference, line-buffered so a timeout keeps
# what was printed), within about 300 s.
# speed: compare's time with the GPU's products against the CPU's around --device auto's threshold
# (bench pairs, and one case end to end in fresh processes), within about 250 s.
set -uo pipefail
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
mode=${1:-all}
small='GpuQuant.*:GpuRouting.*:GpuPrologue.*:GpuGemm.Exact*:GpuGemm.Tiles*:GpuGemm.LargeBatch*:Cases/GpuMoe.StagesWithinBounds/large_batch_block_tiles:Cases/GpuMoe.StagesWithinBounds/t1_deepseek_grouped:Cases/GpuMoe.StagesWithinBounds/ep_tokens_without_local_expert:Cases/GpuMoe.StagesWithinBounds/ue8m0_up_gate_bf16:Cases/GpuMoe.StagesWithinBounds/bf16_entry_sigmoid_eps'
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv 2>&1 | tee "$out/device.txt"
if [ "$mode" != budget ] && [ "$mode" != speed ] && command -v cuobjdump >/dev/null; then
  cuobjdump -sass bin/gpu_kernels_test > "$out/sass.txt" 2>&1
  echo "MMA instructions in the SASS:"
  grep -oE '\b[A-Z]*MMA[.A-Z0-9_]*' "$out/sass.txt" | sort | uniq -c | tee "$out/mma.txt"
fi
rc=0
if [ "$mode" = budget ]; then
  step() {  # step LIMIT NAME COMMAND...: run, log to $out/NAME.txt, say the exit code and the tail
    local lim=$1 name=$2; shift 2
    timeout "$lim" stdbuf -oL "$@" > "$out/$name.txt" 2>&1
    local r=$?
    echo "== $name: exit $r"; tail -8 "$out/$name.txt"
    [ $r -ne 0 ] && rc=$r
  }
  step 60 budget-test bin/gpu_budget_products_test
  MOECHECK_TRUNCATION_KERNEL=simple step 40 budget-test-simple bin/gpu_budget_products_test --gtest_filter='*Truncation*'
  for tool in memcheck racecheck; do
    step 60 "$tool" compute-sanitizer --tool $tool --error-exitcode 9 bin/gpu_budget_products_test \
      --gtest_filter='*Truncation*'
  done
  step 40 bench-small bin/moecheck bench reference --preset small-deepseek --tokens 512 --compare \
    --budget-model hopper --device cuda --repeat 2
  step 90 bench-dsv3-t64 bin/moecheck bench reference --preset deepseek-v3 --tokens 64 --compare \
    --budget-model hopper --device cuda --repeat 1
  step 150 bench-dsv3-t1024 bin/moecheck bench reference --preset deepseek-v3 --tokens 1024 --compare \
    --budget-model hopper --device cuda --repeat 1
  # $OUT brings back few files: one archive of the logs.
  (cd "$out" && tar czf budget-logs.tgz --remove-files ./*.txt)
  exit $rc
fi
if [ "$mode" = speed ]; then
  # Where compare is faster with the GPU's products (ReferenceDevice::kAutoGpuFlops): bench pairs
  # around the threshold, then one case end to end, --device cpu against the default (auto), each
  # a fresh process so the GPU's start counts.
  step() {
    local lim=$1 name=$2; shift 2
    timeout "$lim" stdbuf -oL "$@" > "$out/$name.txt" 2>&1
    local r=$?
    echo "== $name: exit $r"; grep -E "round 1:|on the GPU|compare, budget|GPU vs CPU|budgets:" "$out/$name.txt" | tail -12
    [ $r -ne 0 ] && rc=$r
  }
  for t in 256 2048; do
    step 60 "bench-small-t$t" bin/moecheck bench reference --preset small-deepseek --tokens $t --compare \
      --budget-model hopper --device cuda --repeat 2
  done
  step 90 bench-dsv3-t64 bin/moecheck bench reference --preset deepseek-v3 --tokens 64 --compare \
    --budget-model hopper --device cuda --repeat 1
  case=/tmp/speed-case.h5
  bin/moecheck make-case --preset small-deepseek --tokens 2048 --seed 7 -o $case > "$out/make-case.txt" 2>&1 &&
    bin/moecheck run $case --backend emulated > "$out/run.txt" 2>&1
  for dev in cpu auto cpu auto; do
    t0=$(date +%s.%N)
    timeout 120 bin/moecheck compare $case --budget-model hopper --device $dev > "$out/compare-$dev.txt" 2>&1
    r=$?
    echo "compare small-deepseek T=2048 --device $dev: exit $r, $(awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN{printf "%.3f", b-a}') s; $(grep -o 'computed in .*' "$out/compare-$dev.txt" | head -1)"
  done
  (cd "$out" && tar czf speed-logs.tgz --remove-files ./*.txt)
  exit $rc
fi
if [ "$mode" = all ] || [ "$mode" = both ]; then
  timeout 200 bin/gpu_kernels_test 2>&1 | tee "$out/log.txt"
  rc=${PIPESTATUS[0]}
  grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$out/log.txt" | tail -30
fi
if [ "$mode" = sanitize ] || [ "$mode" = both ]; then
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 bin/gpu_kernels_test --gtest_filter="$small" \
      > "$out/$tool.txt" 2>&1
    r=$?
    echo "compute-sanitizer $tool: exit $r"; tail -5 "$out/$tool.txt"
    [ $r -ne 0 ] && rc=$r
  done
fi
exit $rc
