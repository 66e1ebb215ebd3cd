#!/usr/bin/env bash
# One call on a Hopper GPU host that checks the whole GPU side (a device-tool session's budget is
# short, so everything in one command). Run from the repository root, with the bundle made here:
#
#   cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a -DMOECHECK_NATIVE=OFF \
#         -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DPython3_EXECUTABLE=<the host's python3, e.g. 3.12>
#   cmake --build build-gpu --target moecheck gpu_kernels_test gpu_reference_test _moecheck
#   ../shared/tools/bundle-for-gpu-host .gpu-bundle build-gpu/moecheck build-gpu/tests/gpu_kernels_test \
#       build-gpu/tests/gpu_reference_test
#   mkdir -p .gpu-bundle/python && cp -r build-gpu/python/moecheck .gpu-bundle/python/
#   bash tools/gpu-host-check.sh          # on the GPU host; logs under $OUT (or /tmp/gpu-host-check)
#
# Steps, each bounded by a timeout (STEPS, comma-separated, picks some; default all):
#   tests      the GPU tests; compute-sanitizer memcheck and racecheck on a representative set
#              (tests/gpu_device_check.sh)
#   reference  the float64 reference on the GPU against the CPU's (gpu_reference_test, memcheck
#              on its larger case) and `bench reference --device cuda` on DeepSeek-V3 (REF_TOKENS)
#   cpu        the host CPU's figures: `bench reference --compare` on DeepSeek-V3 at T = 64
#   gate       `gate --backend cuda` with the golden corpus (GATE_CASES)
#   bench      `bench --backend cuda,cublaslt` on DeepSeek-V3
#   python     the Python module's pytest suite (torch included) and the Triton kernel of
#              tests/triton gated through the module and the exec backend (tests/triton/gate_triton.py;
#              CASES, EXEC_CASES, EXEC_VARIANTS size it)
set -uo pipefail
R=$(pwd)
B=$R/.gpu-bundle
O=${OUT:-/tmp/gpu-host-check}
mkdir -p "$O"
[ -x "$B/bin/moecheck" ] || { echo "no bundle at $B (see the comment at the top of $0)" >&2; exit 2; }
cp "$R/tests/gpu_device_check.sh" "$B/"
# moecheck in the caller's working directory (relative case paths stay valid), with the bundle's libraries
printf '#!/bin/bash\nexport LD_LIBRARY_PATH="%s/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\nexec %s/bin/moecheck "$@"\n' \
  "$B" "$B" > "$B/moecheck"
chmod +x "$B/moecheck"
status=0
steps=",${STEPS:-tests,reference,cpu,gate,bench,python},"
want() { [[ $steps == *",$1,"* ]]; }
for s in ${STEPS//,/ }; do
  case $s in tests|reference|cpu|gate|bench|python) ;; *) echo "STEPS: unknown step '$s' (tests, reference, cpu, gate, bench, python)" >&2; exit 2 ;; esac
done

if want tests; then
echo "== GPU tests and SASS =="
(cd "$B" && OUT=$O/check timeout 300 ./run bash gpu_device_check.sh both > "$O/check.txt" 2>&1) || status=1
grep -E "MMA|PASSED|FAILED|compute-sanitizer|ERROR SUMMARY" "$O/check.txt" | head -20
fi

if want reference; then
echo "== float64 reference on the GPU =="
(cd "$B" && timeout 240 ./run bin/gpu_reference_test > "$O/gpu-reference.txt" 2>&1) || status=1
grep -E "outputs|^\[  (PASSED|FAILED|SKIPPED)|Failure" "$O/gpu-reference.txt" | head -12
(cd "$B" && timeout 120 ./run compute-sanitizer --tool memcheck --error-exitcode 9 bin/gpu_reference_test \
  --gtest_filter='*LargerLayer*' > "$O/gpu-reference-memcheck.txt" 2>&1) || status=1
tail -2 "$O/gpu-reference-memcheck.txt"
(cd "$B" && timeout 240 ./run bin/moecheck bench reference --preset deepseek-v3 --tokens "${REF_TOKENS:-4096}" \
  --repeat 1 --device cuda > "$O/bench-reference.txt" 2>&1) || status=1
grep -vE "^bench reference: round" "$O/bench-reference.txt" | tail -12
fi

if want cpu; then
echo "== the host CPU: compare's time against the reference's =="
(cd "$B" && timeout 200 ./run bin/moecheck bench reference --preset deepseek-v3 --tokens 64 --compare --repeat 3 \
  > "$O/bench-compare.txt" 2>&1) || status=1
grep -E "wall time|compare," "$O/bench-compare.txt"
fi

if want gate; then
echo "== gate cuda with the corpus =="
(cd "$B" && timeout 300 ./run bin/moecheck gate --backend cuda --cases "${GATE_CASES:-300}" --seed 45 -q \
  > "$O/gate-cuda.txt" 2>&1) || status=1
tail -3 "$O/gate-cuda.txt"
fi

if want bench; then
echo "== bench =="
(cd "$B" && timeout 200 ./run bin/moecheck bench --backend cuda,cublaslt --preset deepseek-v3 --tokens 1,64,4096 \
  -o "$O/bench.json" > "$O/bench.txt" 2>&1) || status=1
sed -n '/^side by side/,/^$/p' "$O/bench.txt"
fi

if want python; then
echo "== Python module and the Triton kernel =="
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH=$B/python:$R/tests/triton MOECHECK_BIN=$B/moecheck
python3 -c "import torch, triton, moecheck; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
  2>&1 | tail -1
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/python > "$O/pytest.txt" 2>&1 || status=1
tail -3 "$O/pytest.txt"
variants=${EXEC_VARIANTS:-correct,$(cd tests/triton && python3 -c "import fp8_moe; print(','.join(fp8_moe.MUTANTS))")}
timeout 480 python3 tests/triton/gate_triton.py --moecheck "$B/moecheck" --cases "${CASES:-10}" \
  --exec-cases "${EXEC_CASES:-4}" --exec-variants "$variants" > "$O/gate-triton.txt" 2>&1 || status=1
tail -25 "$O/gate-triton.txt"
fi
exit $status
