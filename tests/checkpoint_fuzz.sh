#!/usr/bin/env bash
# Bounded libFuzzer run of the safetensors header parser (tools/checkpoint/fuzz_safetensors_header.cpp).
#   tests/checkpoint_fuzz.sh CLANGXX SOURCE_DIR WORK_DIR [SECONDS]
# Builds the parser + target with clang++ -fsanitize=fuzzer,address,undefined into WORK_DIR and
# fuzzes for SECONDS (default 20) from a copy of the seed corpus (the committed corpus is never
# written). Exit 0: no finding; 1: a crash, sanitizer report, leak or OOM (the reproducer is in
# WORK_DIR, its path printed); 77: SKIP (CTest shows Skipped) when no clang++ with libFuzzer is
# there: install the Debian packages clang and libclang-rt-14-dev (tools/install-deps.sh).
set -uo pipefail
cxx=${1:-clang++}; src=${2:?source dir}; work=${3:?work dir}; seconds=${4:-20}
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIP: no clang++ ('$cxx' not found): install clang and libclang-rt-14-dev (tools/install-deps.sh)"; exit 77
fi
mkdir -p "$work"
probe="$work/probe.cpp"
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' > "$probe"
if ! "$cxx" -fsanitize=fuzzer,address "$probe" -o "$work/probe" >"$work/probe.log" 2>&1; then
  echo "SKIP: $cxx cannot link -fsanitize=fuzzer,address (libclang_rt.fuzzer missing?): install libclang-rt-14-dev"
  cat "$work/probe.log"; exit 77
fi
echo "building the fuzz target with $cxx"
"$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$src" \
  "$src/tools/checkpoint/safetensors.cpp" "$src/tools/checkpoint/fuzz_safetensors_header.cpp" \
  -o "$work/fuzz_safetensors_header" || { echo "FAIL: the fuzz target does not build"; exit 1; }
rm -rf "$work/corpus" "$work/artifacts"; mkdir -p "$work/corpus" "$work/artifacts"
cp "$src"/tools/checkpoint/fuzz_corpus/* "$work/corpus/"
echo "fuzzing for ${seconds} s (seed corpus: $(ls "$work/corpus" | wc -l) files)"
"$work/fuzz_safetensors_header" -max_total_time="$seconds" -rss_limit_mb=1024 -max_len=65536 -timeout=10 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus" 2>&1 | tail -n 25
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "FAIL: libFuzzer exit $rc; reproducer(s):"; ls -l "$work/artifacts"; exit 1
fi
echo "fuzzing: no finding in ${seconds} s"
