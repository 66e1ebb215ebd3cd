# Area "generator": synthetic cases from model presets (golden/case_generator.*, golden/GENERATOR.md)
# and the `moecheck make-case` command line.
moecheck_add_test(case_generator_test SOURCES case_generator_test.cpp LABELS generator golden)
moecheck_add_test(case_generator_features_test SOURCES case_generator_features_test.cpp LABELS generator golden)
moecheck_add_test(make_case_cli_test SOURCES make_case_cli_test.cpp LABELS generator cli)
add_dependencies(make_case_cli_test moecheck)  # runs ${MOECHECK_BINARY_DIR}/moecheck
