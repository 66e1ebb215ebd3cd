#!/usr/bin/env bash
# Bounded libFuzzer run of the case reader and its rules (golden/fuzz_case_reader.cpp).
#   tests/case_reader_fuzz.sh CLANGXX SOURCE_DIR WORK_DIR [SECONDS]
# Configures a CPU-only clang build of the golden library and the target with
# -fsanitize=fuzzer-no-link,address,undefined in WORK_DIR/build (later runs rebuild what
# changed) and fuzzes for SECONDS (default 30) from a copy of the seed corpus golden/fuzz_corpus/
# (the committed corpus is never written). Exit 0: no finding; 1: a crash, an exception other
# than InputError, a sanitizer report or a leak (the reproducer is in WORK_DIR/artifacts, its path
# printed; replay it with WORK_DIR/build/golden/fuzz_case_reader FILE); 77: SKIP (CTest shows
# Skipped) when no clang++ can link libFuzzer: install clang and libclang-rt-14-dev.
set -uo pipefail
cxx=${1:-clang++}; src=${2:?source dir}; work=${3:?work dir}; seconds=${4:-30}
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIP: no clang++ ('$cxx' not found): install clang and libclang-rt-14-dev (tools/install-deps.sh)"; exit 77
fi
mkdir -p "$work"
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' > "$work/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address "$work/probe.cpp" -o "$work/probe" >"$work/probe.log" 2>&1; then
  echo "SKIP: $cxx cannot link -fsanitize=fuzzer,address (libclang_rt.fuzzer missing?): install libclang-rt-14-dev"
  cat "$work/probe.log"; exit 77
fi
cc=${cxx/clang++/clang}
flags="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
echo "building the fuzz target with $cxx in $work/build"
t0=$(date +%s)
cmake -S "$src" -B "$work/build" -DMOECHECK_ENABLE_CUDA=OFF -DMOECHECK_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >"$work/configure.log" 2>&1 ||
  { echo "FAIL: configure"; tail -20 "$work/configure.log"; exit 1; }
cmake --build "$work/build" --target fuzz_case_reader -j"$(nproc)" >"$work/build.log" 2>&1 ||
  { echo "FAIL: the fuzz target does not build"; grep -m5 -A3 "error" "$work/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
rm -rf "$work/corpus" "$work/artifacts"; mkdir -p "$work/corpus" "$work/artifacts"
cp "$src"/golden/fuzz_corpus/* "$work/corpus/"
printf 'leak:libhdf5\n' > "$work/lsan.supp"
echo "fuzzing for ${seconds} s (seed corpus: $(ls "$work/corpus" | wc -l) files)"
LSAN_OPTIONS="suppressions=$work/lsan.supp" "$work/build/golden/fuzz_case_reader" -max_total_time="$seconds" \
  -rss_limit_mb=2048 -max_len=128 -len_control=0 -timeout=20 -artifact_prefix="$work/artifacts/" -print_final_stats=1 \
  "$work/corpus" 2>&1 | tail -n 25
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "FAIL: libFuzzer exit $rc; reproducer(s):"; ls -l "$work/artifacts"; exit 1
fi
echo "fuzzing: no finding in ${seconds} s"
