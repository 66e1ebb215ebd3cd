# The HDF5 case format (golden/): round trips, every validation rule, h5py interoperability,
# hostile files through the CLI, and `moecheck inspect`.
#
# The h5py tests need the Debian python3 with python3-h5py (tools/install-deps.sh); the python3
# first on PATH may be another installation without it, so /usr/bin/python3 is preferred. When
# h5py is missing those tests FAIL with a message saying what to install (never skip).
find_program(MOECHECK_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(MOECHECK_PYTHON3 NAMES python3)

set(golden_support golden_test_support.cpp)
moecheck_add_test(golden_case_roundtrip_test SOURCES golden_case_roundtrip_test.cpp ${golden_support} LABELS golden)
moecheck_add_test(golden_case_rules_test SOURCES golden_case_rules_test.cpp ${golden_support} LABELS golden)
moecheck_add_test(golden_h5py_test SOURCES golden_h5py_test.cpp ${golden_support} LABELS golden)
moecheck_add_test(golden_hostile_files_test SOURCES golden_hostile_files_test.cpp ${golden_support} LABELS golden)
moecheck_add_test(golden_inspect_cli_test SOURCES golden_inspect_cli_test.cpp ${golden_support} LABELS golden
                  LIBS nlohmann_json::nlohmann_json)
foreach(t golden_h5py_test golden_hostile_files_test)
  target_compile_definitions(${t} PRIVATE MOECHECK_PYTHON3="${MOECHECK_PYTHON3}")
endforeach()
# These run the CLI binaries as subprocesses: build them with the tests.
add_dependencies(golden_hostile_files_test moecheck)
add_dependencies(golden_inspect_cli_test moecheck make_sample_case)

# The committed golden corpus: its GPU recordings judged against the reference on every run.
moecheck_add_test(golden_corpus_test SOURCES golden_corpus_test.cpp ${golden_support} LABELS golden)
# The pipeline commands through the binary (reference, run, compare, bench).
moecheck_add_test(cli_commands_test SOURCES cli_commands_test.cpp ${golden_support} LABELS cli)
# The judge through the binary (stored vs computed reference, --budget-model everywhere).
moecheck_add_test(judge_cli_test SOURCES judge_cli_test.cpp ${golden_support} LABELS cli
                  LIBS nlohmann_json::nlohmann_json)
add_dependencies(judge_cli_test moecheck)
# Clean interruption of make-case and gate (SIGINT / SIGTERM).
moecheck_add_test(interrupt_cli_test SOURCES interrupt_cli_test.cpp ${golden_support} LABELS cli)
add_dependencies(interrupt_cli_test moecheck)
# The hostile corpus through every command under ASan + UBSan: builds its own sanitized CPU-only
# moecheck (several minutes the first time), so it is the slowest test of the suite.
add_test(NAME sanitized_hostile_corpus
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/sanitized_hostile_corpus.sh ${PROJECT_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/sanitized ${MOECHECK_PYTHON3} ${CMAKE_CXX_COMPILER})
set_tests_properties(sanitized_hostile_corpus PROPERTIES LABELS "golden;sanitize" SKIP_RETURN_CODE 77 TIMEOUT 3600)
# The case reader's libFuzzer target over its seed corpus (g++, always), and a bounded libFuzzer
# run with clang (MOECHECK_CLANGXX, found in checkpoint.cmake; Skipped where clang cannot link libFuzzer).
moecheck_add_test(case_reader_fuzz_replay_test SOURCES case_reader_fuzz_replay_test.cpp ${golden_support}
                  ${PROJECT_SOURCE_DIR}/golden/fuzz_case_reader.cpp LABELS golden fuzz)
add_test(NAME case_reader_fuzz
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/case_reader_fuzz.sh "${MOECHECK_CLANGXX}" ${PROJECT_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/case-reader-fuzz 30)
set_tests_properties(case_reader_fuzz PROPERTIES LABELS "golden;fuzz" SKIP_RETURN_CODE 77 TIMEOUT 2400)
