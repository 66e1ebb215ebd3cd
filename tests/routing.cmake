# Area "routing": the float64 routing reference (reference/moe_routing.*): known answers and
# RapidCheck properties.
moecheck_add_test(moe_routing_test SOURCES moe_routing_test.cpp LABELS routing reference)
moecheck_add_test(moe_routing_props SOURCES moe_routing_props.cpp LABELS routing reference)
