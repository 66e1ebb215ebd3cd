# Area "gpu": the CUDA FP8 block-scale MoE paths (kernels/: backends cuda and cublaslt) against
# float64 CPU models.
# Built only with nvcc; on a machine without a CUDA device every GPU test reports SKIPPED
# ("no CUDA device: ..."), the host-side argument-check tests still run.
if(MOECHECK_HAVE_CUDA)
  moecheck_add_test(gpu_kernels_test
    SOURCES gpu_kernels_test.cpp gpu_moe_test.cpp gpu_test_support.cpp gpu_moe_checks.cpp gpu_cublaslt_test.cpp
    LABELS gpu
    LIBS moecheck_kernels)
endif()
if(TARGET gpu_kernels_test)
  # Link the shared CUDA runtime that moecheck_kernels uses (CMake would add the static one too).
  set_target_properties(gpu_kernels_test PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
endif()
