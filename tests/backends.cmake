# The budgets against real backend runs: emulated (zero false alarms over random cases) and the
# faulty:<fault> backends (each caught).
moecheck_add_test(backend_compare_test SOURCES backend_compare_test.cpp LABELS backends LIBS moecheck_emulated)
# Engine recipes (BUDGETS.md §9): each judged by its own arithmetic, and told apart from the default.
moecheck_add_test(engine_recipe_test SOURCES engine_recipe_test.cpp LABELS backends LIBS moecheck_emulated)
# The noise model (BUDGETS.md §10): building blocks, the bit-exact Hopper emulation inside it,
# and the FP8 validation matrix on small-deepseek (needs the moecheck binary).
moecheck_add_test(noise_model_test SOURCES noise_model_test.cpp golden_test_support.cpp LABELS backends
                  LIBS moecheck_emulated nlohmann_json::nlohmann_json)
add_dependencies(noise_model_test moecheck)
