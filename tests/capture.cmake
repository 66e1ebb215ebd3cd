# tools/capture/ (the Python capture module engines use to write cases): tests/h5py/capture_test.py
# runs a numpy float32 engine on a tiny layer, captures it, and checks the case with the moecheck
# binary (inspect exit 0, compare exit 0 for the correct engine and 1 for broken ones), plus the
# module's input validation and atomic writes. It needs the Debian python3 with python3-numpy and
# python3-h5py (tools/install-deps.sh); without them the tests FAIL (never skip).
find_program(MOECHECK_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(MOECHECK_PYTHON3 NAMES python3)

# capture_<name>: the unittest cases whose name contains <pattern> (unittest -k).
foreach(pair e4m3_codec:E4m3Codec within_budget:within_budget broken_engines:broken_engines bad_inputs:no_file recipe_presets:recipe_presets inputs_changed:InputsChanged)
  string(REPLACE ":" ";" pair ${pair})
  list(GET pair 0 name)
  list(GET pair 1 pattern)
  add_test(NAME capture_${name}
           COMMAND ${MOECHECK_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/h5py/capture_test.py
                   --moecheck $<TARGET_FILE:moecheck> -k ${pattern})
  set_tests_properties(capture_${name} PROPERTIES LABELS "golden;cli" TIMEOUT 600)
endforeach()
