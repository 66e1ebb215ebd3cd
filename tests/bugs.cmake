# Area "bugs": the bug corpus golden/bugs/<fault>.h5, one regression test per fault (each case's
# recording flagged, the fault re-run flagged, the correct backend passing, local faults named).
moecheck_add_test(bug_corpus_test SOURCES bug_corpus_test.cpp golden_test_support.cpp LABELS golden bugs
                  LIBS moecheck_emulated nlohmann_json::nlohmann_json)
add_dependencies(bug_corpus_test moecheck)
