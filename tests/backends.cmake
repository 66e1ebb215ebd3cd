# The budgets against real backend runs: emulated (zero false alarms over random cases) and the
# faulty:<fault> backends (each caught).
moecheck_add_test(backend_compare_test SOURCES backend_compare_test.cpp LABELS backends LIBS moecheck_emulated)
# Engine recipes (BUDGETS.md §9): each judged by its own arithmetic, and told apart from the default.
moecheck_add_test(engine_recipe_test SOURCES engine_recipe_test.cpp LABELS backends LIBS moecheck_emulated)
