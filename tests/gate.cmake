# Area "gate": `moecheck gate` (sweep + golden corpus, JUnit), `shrink`, `repro`, `faults`
# through the binary (tools/cmd_gate.cpp, case_check, case_shrink).
moecheck_add_test(gate_cli_test SOURCES gate_cli_test.cpp golden_test_support.cpp LABELS cli gate)
add_dependencies(gate_cli_test moecheck)
