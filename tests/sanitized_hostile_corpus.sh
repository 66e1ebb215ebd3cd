#!/usr/bin/env bash
# The hostile corpus through every command that reads a case, under AddressSanitizer and
# UndefinedBehaviorSanitizer (issue 15).
#   tests/sanitized_hostile_corpus.sh SOURCE_DIR WORK_DIR PYTHON3 [CXX]
# Builds a CPU-only moecheck with -O0 -fsanitize=address,undefined (-O0: half the compile time;
# the corpus is small) into WORK_DIR/build (once; later
# runs rebuild what changed), writes the h5py hostile files (tests/h5py/write_hostile.py) plus
# truncated copies of golden/cases/sample.h5, and runs inspect, run, reference, compare, repro,
# shrink and gate (its golden corpus) on each. Every run must exit 2 (the valid base case: 0 or
# 1) with no sanitizer report. Exit 0: clean; 1: a finding (the command and its report printed);
# 77: SKIP (CTest shows Skipped) when the compiler cannot link the sanitizers or h5py is missing.
set -uo pipefail
src=${1:?source dir}; work=${2:?work dir}; py=${3:-python3}; cxx=${4:-c++}
mkdir -p "$work"
printf 'int main() { return 0; }\n' > "$work/probe.cpp"
if ! "$cxx" -fsanitize=address,undefined "$work/probe.cpp" -o "$work/probe" >"$work/probe.log" 2>&1; then
  echo "SKIP: $cxx cannot link -fsanitize=address,undefined (libasan / libubsan missing)"; cat "$work/probe.log"; exit 77
fi
if ! "$py" -c "import h5py, numpy" 2>/dev/null; then
  echo "SKIP: $py cannot import h5py and numpy: install python3-h5py python3-numpy (tools/install-deps.sh)"; exit 77
fi

flags="-O0 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
echo "building a sanitized CPU-only moecheck in $work/build ($flags)"
t0=$(date +%s)
cmake -S "$src" -B "$work/build" -DMOECHECK_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >"$work/configure.log" 2>&1 ||
  { echo "FAIL: configure"; tail -20 "$work/configure.log"; exit 1; }
cmake --build "$work/build" --target moecheck -j"$(nproc)" >"$work/build.log" 2>&1 ||
  { echo "FAIL: build"; tail -30 "$work/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
M="$work/build/moecheck"

files="$work/files"
rm -rf "$files" "$work/out"; mkdir -p "$files" "$work/out"
"$py" "$src/tests/h5py/write_hostile.py" "$files" >/dev/null || { echo "FAIL: write_hostile.py"; exit 1; }
sample="$src/golden/cases/sample.h5"
size=$(stat -c %s "$sample")
for len in 0 8 512 4096 $((size / 3)) $((size - 1)); do
  head -c "$len" "$sample" > "$files/truncated_$len.h5"
  printf 'truncated_%s.h5\t\n' "$len" >> "$files/manifest.tsv"
done

# HDF5 keeps some library state until exit: leaks inside libhdf5 are not ours.
printf 'leak:libhdf5\n' > "$work/lsan.supp"
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:exitcode=99"
export LSAN_OPTIONS="suppressions=$work/lsan.supp"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=98"

findings=0 runs=0
while IFS=$'\t' read -r name where; do
  f="$files/$name"
  if [ "$where" = "-" ]; then  # the valid case, with an output recorded for compare, repro, shrink and gate
    "$M" run "$f" --backend faulty:gate_up_swap -o "$files/valid-run.h5" >/dev/null 2>&1 && f="$files/valid-run.h5"
  fi
  corpus="$work/out/corpus"; rm -rf "$corpus"; mkdir -p "$corpus"; cp "$f" "$corpus/case.h5"
  for cmd in "inspect $f" "run $f --backend emulated -o $work/out/o.h5" "reference $f -o $work/out/o.h5" "compare $f" \
             "repro $f --backend emulated" "shrink $f --backend emulated -o $work/out/m.h5" \
             "gate --backend emulated --golden $corpus --cases 1 -q"; do
    runs=$((runs + 1))
    # shellcheck disable=SC2086
    "$M" $cmd >"$work/out/stdout" 2>"$work/out/stderr"
    rc=$?
    want="2"; [ "$where" = "-" ] && want="0 or 1"
    report=$(grep -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$work/out/stderr" | head -3)
    if [ -n "$report" ] || { [ "$where" = "-" ] && [ "$rc" -gt 1 ]; } || { [ "$where" != "-" ] && [ "$rc" -ne 2 ]; }; then
      findings=$((findings + 1))
      echo "FINDING: moecheck $cmd -> exit $rc (want $want)"
      head -c 3000 "$work/out/stderr"; echo
    fi
    rm -f "$work/out/o.h5" "$work/out/m.h5"
  done
done < "$files/manifest.tsv"
echo "$runs sanitized runs over $(wc -l < "$files/manifest.tsv") files: $findings finding(s)"
[ "$findings" -eq 0 ]
