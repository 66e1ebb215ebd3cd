#!/usr/bin/env bash
# Re-records the GPU outputs of the golden corpus on a Hopper machine (see golden/README.md):
# for every case in cases/, /outputs/cuda and /outputs/cublaslt are (re)written with
# `moecheck run`, then `moecheck compare` judges them. Run it from a bundle made by
# ../shared/tools/bundle-for-gpu-host (bin/moecheck, bin/gpu_kernels_test, lib/) with the cases
# copied to cases/:   ./run bash gpu-record.sh OUTDIR
# OUTDIR receives the re-recorded cases and the logs. BACKENDS="cuda" (default "cuda cublaslt")
# re-records only those; with ONLY_RECORDED=1 a backend is re-recorded only in the cases that
# already hold its output.
set -uo pipefail
out=${1:?usage: gpu-record.sh OUTDIR}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
status=0
if [ -x bin/gpu_kernels_test ]; then
  bin/gpu_kernels_test --gtest_brief=1 > "$out/gpu_tests.log" 2>&1 || status=1
  tail -3 "$out/gpu_tests.log"
fi
for c in cases/*.h5; do
  name=$(basename "$c")
  cp "$c" "$out/$name"
  for b in ${BACKENDS:-cuda cublaslt}; do
    if [ "${ONLY_RECORDED:-0}" = 1 ] && ! bin/moecheck inspect "$c" 2>/dev/null | grep -q "/outputs/$b/output "; then
      continue
    fi
    eo=""; case "$name" in tiny-*) eo=--expert-outputs;; esac  # slot outputs only where small
    bin/moecheck run "$out/$name" --backend "$b" $eo >> "$out/record.log" 2>&1 || { echo "run $b $name failed"; status=1; }
  done
  echo "== $name" >> "$out/compare.log"
  bin/moecheck compare "$out/$name" -q >> "$out/compare.log" 2>&1 || { echo "compare $name: exit $?"; status=1; }
  tail -1 "$out/compare.log"
done
exit $status
