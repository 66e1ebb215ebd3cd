# The measured FP8 tensor-core model against committed H200 outputs (golden/probe/h200).
moecheck_add_test(tensor_core_model_test SOURCES tensor_core_model_test.cpp LABELS reference LIBS moecheck_probe)
