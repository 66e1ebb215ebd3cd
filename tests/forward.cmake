# The float64 MoE forward: agreement with a naive implementation, and its properties.
moecheck_add_test(moe_forward_test SOURCES moe_forward_test.cpp LABELS reference)
moecheck_add_test(moe_compare_test SOURCES moe_compare_test.cpp LABELS reference)
moecheck_add_test(truncation_bound_test SOURCES truncation_bound_test.cpp LABELS reference)
moecheck_add_test(tail_bound_test SOURCES tail_bound_test.cpp LABELS reference)
moecheck_add_test(rounded_mixture_test SOURCES rounded_mixture_test.cpp LABELS reference)
moecheck_add_test(weight_panel_test SOURCES weight_panel_test.cpp LABELS reference)
# The forward's weight products on another engine, and the agreement interval of BUDGETS.md §11.
moecheck_add_test(reference_products_test SOURCES reference_products_test.cpp reference_agreement.cpp LABELS reference
                  LIBS moecheck_sweep)
