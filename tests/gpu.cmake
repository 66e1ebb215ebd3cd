# Area "gpu": the CUDA FP8 block-scale MoE paths (kernels/: backends cuda and cublaslt) against
# float64 CPU models.
# Built only with nvcc; on a machine without a CUDA device every GPU test reports SKIPPED
# ("no CUDA device: ..."), the host-side argument-check tests still run.
if(MOECHECK_HAVE_CUDA)
  moecheck_add_test(gpu_kernels_test
    SOURCES gpu_kernels_test.cpp gpu_moe_test.cpp gpu_test_support.cpp gpu_moe_checks.cpp gpu_cublaslt_test.cpp
    LABELS gpu
    LIBS moecheck_kernels)
  # The float64 reference with its weight products on the GPU against the CPU's (BUDGETS.md §11).
  moecheck_add_test(gpu_reference_test
    SOURCES gpu_reference_test.cpp gpu_test_support.cpp reference_agreement.cpp
    LABELS gpu
    LIBS moecheck_kernels moecheck_sweep)
  # The budget's extra products on the GPU (ProductExtras) against the CPU's.
  moecheck_add_test(gpu_budget_products_test
    SOURCES gpu_budget_products_test.cpp gpu_test_support.cpp reference_agreement.cpp
    LABELS gpu
    LIBS moecheck_kernels moecheck_sweep)
endif()
foreach(t gpu_kernels_test gpu_reference_test gpu_budget_products_test)
  if(TARGET ${t})
    # Link the shared CUDA runtime that moecheck_kernels uses (CMake would add the static one too).
    set_target_properties(${t} PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
  endif()
endforeach()

# triton_fp8_moe: a Triton FP8 block-scale fused MoE of the SGLang design (tests/triton/fp8_moe.py)
# and its twelve mutants, captured with tools/capture and judged by `moecheck compare` with the
# default engine model (tests/triton/triton_moe_test.py). It needs a python3 with torch and Triton
# and an sm_90 GPU; without them it reports SKIPPED with the reason (exit 77). The python3 is the
# first on PATH (an engine's virtual environment), not the Debian one the other Python tests use.
find_program(MOECHECK_TORCH_PYTHON NAMES python3)
add_test(NAME triton_fp8_moe
         COMMAND ${MOECHECK_TORCH_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/triton/triton_moe_test.py
                 --moecheck $<TARGET_FILE:moecheck>)
set_tests_properties(triton_fp8_moe PROPERTIES LABELS "gpu" TIMEOUT 900 SKIP_RETURN_CODE 77)
