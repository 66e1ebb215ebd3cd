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
