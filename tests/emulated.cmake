# Area "emulated": the float32 CPU backend (kernels/emulated/): kernels vs their definitions,
# every stage of whole runs vs float64 loops, contract properties, and the fault switches.
moecheck_add_test(emulated_test SOURCES emulated_test.cpp LABELS emulated LIBS moecheck_emulated)
moecheck_add_test(emulated_faults_test SOURCES emulated_faults_test.cpp LABELS emulated LIBS moecheck_emulated)
# A layer over N tensor- or expert-parallel ranks on the emulated backend, judged as one layer.
moecheck_add_test(sharded_emulated_test SOURCES sharded_emulated_test.cpp LABELS emulated LIBS moecheck_emulated)
# The same through the binary: run --tp/--ep, compare's reports, the case file, gate --tp.
moecheck_add_test(sharded_cli_test SOURCES sharded_cli_test.cpp golden_test_support.cpp LABELS cli emulated
                  LIBS nlohmann_json::nlohmann_json)
add_dependencies(sharded_cli_test moecheck)
