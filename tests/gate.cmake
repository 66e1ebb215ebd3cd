# Area "gate": `moecheck gate` (sweep + golden corpus, JUnit), `shrink`, `repro`, `faults`
# through the binary (tools/cli/cmd_gate.cpp, judge/case_check, sweep/case_shrink).
moecheck_add_test(gate_cli_test SOURCES gate_cli_test.cpp golden_test_support.cpp LABELS cli gate)
add_dependencies(gate_cli_test moecheck)
moecheck_add_test(reference_device_test SOURCES reference_device_test.cpp golden_test_support.cpp LABELS cli gate
                  LIBS moecheck_judge)
add_dependencies(reference_device_test moecheck)
