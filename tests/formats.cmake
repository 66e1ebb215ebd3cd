# Area "formats": FP8 / UE8M0 / bf16 number formats, FP8 quantization, the counter-based RNG.
moecheck_add_test(fp8_formats_test SOURCES fp8_formats_test.cpp LABELS formats)
moecheck_add_test(fp8_quant_props SOURCES fp8_quant_props.cpp LABELS formats)
moecheck_add_test(counter_rng_test SOURCES counter_rng_test.cpp LABELS formats)

# Every float32 bit pattern through our encoders and the CUDA Toolkit's host-side conversions
# (cuda_fp8.h / cuda_bf16.h compile with the host compiler; no GPU and no CUDA library needed).
if(CUDAToolkit_FOUND)
  moecheck_add_test(fp8_conversion_exhaustive_test SOURCES fp8_conversion_exhaustive_test.cpp
                    LABELS formats exhaustive)
  target_include_directories(fp8_conversion_exhaustive_test SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
else()
  message(STATUS "moecheck: CUDA Toolkit headers not found (find_package(CUDAToolkit)): "
                 "fp8_conversion_exhaustive_test, which compares against cuda_fp8.h, is not built")
endif()
