#!/usr/bin/env bash
# Regenerates golden/bugs/<fault>.h5: one minimal failing case per fault of the faulty:<fault>
# backend (golden/bugs/README.md). Each starts from a case of the gate's sweep on which the fault
# shows (`moecheck gate --backend faulty:<fault> --seed 1` finds them: the case index is noted),
# shrunk by `moecheck shrink` with the correct backend (emulated) as the control, so every
# minimal case fails with its fault and passes with the correct backend. The failing output is
# recorded in the case (/outputs/faulty:<fault>).
#
#   bash tools/make-bug-corpus.sh [MOECHECK]     (from the repository root; default build/moecheck)
set -euo pipefail
M=${1:-build/moecheck}
cd "$(dirname "$0")/.."
out=golden/bugs

# fault | make-case options of the source case | shrink options. The sources were cases of the
# gate's sweep (seed 1, the index noted) under generator version 2; version 3 (golden/GENERATOR.md)
# draws other sweep cases and changes the tiny-deepseek sources' biases and token-4 logits, and
# each source still shows its fault (checked 2026-12-05: this script's 18 shrunk cases all fail
# with their fault and pass with emulated). The committed cases are those of version 2.
QWEN="--preset tiny-qwen --tokens 25 --seed 4757656282214993731 --dist uniform --near-ties --ep 2 --ep-rank 1 --scale-format ue8m0 --routing-weight-dtype bf16"  # case 0
DSV3="--preset tiny-deepseek --tokens 6 --seed 5269990960655507417"                                                                                              # case 1
BF16="--preset tiny-kimi --tokens 2 --seed 5768259054600759159 --dist adversarial --scale-format ue8m0 --routing-weight-dtype bf16"                                                         # case 258
GMZ="--preset tiny-deepseek --tokens 7 --seed 3466396090391494297 --tp 2 --tp-rank 1 --scale-format ue8m0 --intermediate-dtype bf16 --gate-up-layout up_gate"      # --presets tiny-deepseek case 1278
cases=(
  "gate_up_swap|$QWEN|"
  "scaling_factor_missing|$DSV3|"
  "scaling_factor_twice|$DSV3|"
  "bias_ignored|$DSV3|"
  "bias_bf16|$BF16|"
  "act_scale_transposed|$QWEN|"
  "weight_scale_transposed|$DSV3|"
  "zero_group_nan|$DSV3|"
  "empty_expert_garbage|$QWEN|"
  "ep_offset_ignored|$QWEN|"
  "ue8m0_mismatch|$QWEN|"
  "group_mask_zero|$GMZ|"
  "int32_overflow|$DSV3|--int32-threshold 256"
  "no_renormalize|$QWEN|"
  "w2_scale_doubled|$DSV3|"
  "no_requant|$DSV3|"
  "output_scale_2pct|$DSV3|"
  "last_token_zeroed|$DSV3|"
)
# Only some faults: FAULTS="a b" bash tools/make-bug-corpus.sh
if [ -n "${FAULTS:-}" ]; then
  keep=()
  for c in "${cases[@]}"; do [[ " $FAULTS " == *" ${c%%|*} "* ]] && keep+=("$c"); done
  cases=("${keep[@]}")
fi
for c in "${cases[@]}"; do
  IFS='|' read -r fault make shrink <<<"$c"
  src=$out/$fault-source.h5
  # shellcheck disable=SC2086
  "$M" make-case $make -q -o "$src"
  # shellcheck disable=SC2086
  "$M" shrink "$src" --backend "faulty:$fault" $shrink -q -o "$out/$fault.h5"
  rm -f "$src"
done
ls -l $out/*.h5
