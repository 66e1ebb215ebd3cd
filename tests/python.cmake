# The Python module (python/): tests/python/*.py under pytest (Debian's python3-pytest), with the
# module from the build tree (PYTHONPATH) and the moecheck binary making the cases. The torch test
# is skipped, with its reason, where torch is not installed. Without pytest or the module the test
# fails (tools/install-deps.sh installs both).
find_program(MOECHECK_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(MOECHECK_PYTHON3 NAMES python3)
if(MOECHECK_HAVE_PYTHON)
  add_test(NAME python_module
           COMMAND ${MOECHECK_PYTHON3} -m pytest -q -rs -p no:cacheprovider ${CMAKE_CURRENT_SOURCE_DIR}/python)
  set_tests_properties(python_module PROPERTIES LABELS "python;cli" TIMEOUT 600
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MOECHECK_BIN=$<TARGET_FILE:moecheck>;PYTHONDONTWRITEBYTECODE=1")
else()
  add_test(NAME python_module COMMAND ${CMAKE_COMMAND} -E echo "python_module: pybind11-dev or python3-dev missing (tools/install-deps.sh); the module was not built")
  set_tests_properties(python_module PROPERTIES LABELS "python" WILL_FAIL TRUE)
endif()
