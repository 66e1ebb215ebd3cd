# The float64 MoE forward: agreement with a naive implementation, and its properties.
moecheck_add_test(moe_forward_test SOURCES moe_forward_test.cpp LABELS reference)
moecheck_add_test(moe_compare_test SOURCES moe_compare_test.cpp LABELS reference)
moecheck_add_test(truncation_bound_test SOURCES truncation_bound_test.cpp LABELS reference)
moecheck_add_test(weight_panel_test SOURCES weight_panel_test.cpp LABELS reference)
