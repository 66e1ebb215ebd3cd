# Area "checkpoint": Hugging Face FP8 checkpoints and `moecheck dump` (tools/checkpoint/).
#   checkpoint_reader_test       safetensors parser rules, config.json mapping, .npy parser (in process)
#   checkpoint_dump_test         `moecheck dump` on tiny checkpoints of every family, hostile checkpoints
#   checkpoint_fuzz_replay_test  the libFuzzer target over the seed corpus, with g++ (always runs)
#   checkpoint_fuzz              a bounded libFuzzer run with clang++ (Skipped when clang cannot)
set(checkpoint_support checkpoint_test_support.cpp)
moecheck_add_test(checkpoint_reader_test SOURCES checkpoint_reader_test.cpp ${checkpoint_support} LABELS checkpoint
                  LIBS moecheck_checkpoint)
moecheck_add_test(checkpoint_dump_test SOURCES checkpoint_dump_test.cpp ${checkpoint_support} golden_test_support.cpp
                  LABELS checkpoint cli LIBS moecheck_checkpoint)
add_dependencies(checkpoint_dump_test moecheck)
moecheck_add_test(checkpoint_fuzz_replay_test SOURCES checkpoint_fuzz_replay_test.cpp golden_test_support.cpp
                  ${PROJECT_SOURCE_DIR}/tools/checkpoint/fuzz_safetensors_header.cpp LABELS checkpoint LIBS moecheck_checkpoint)

find_program(MOECHECK_CLANGXX NAMES clang++ clang++-14)
add_test(NAME checkpoint_fuzz
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_fuzz.sh "${MOECHECK_CLANGXX}" ${PROJECT_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/checkpoint-fuzz 20)
set_tests_properties(checkpoint_fuzz PROPERTIES LABELS "checkpoint;fuzz" SKIP_RETURN_CODE 77 TIMEOUT 300)
