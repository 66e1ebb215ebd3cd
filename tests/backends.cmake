# The budgets against real backend runs: emulated (zero false alarms over random cases) and the
# faulty:<fault> backends (each caught).
moecheck_add_test(backend_compare_test SOURCES backend_compare_test.cpp LABELS backends LIBS moecheck_emulated)
