# `--backend exec:CMD` (tools/judge/exec_backend.hpp): any kernel as an external command. The tests run
# the moecheck binary with tests/exec/numpy_moe_kernel.py (a numpy float32 kernel of the recipe,
# and its mutants) and with shell commands that fail in every way a backend command can (exit
# status, signal, timeout, no / garbage / malformed output file, interruption). The kernel needs
# the Debian python3 with python3-numpy and python3-h5py (tools/install-deps.sh); without them
# the tests that run it report Skipped with the reason, the others still run.
find_program(MOECHECK_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(MOECHECK_PYTHON3 NAMES python3)

moecheck_add_test(exec_backend_cli_test SOURCES exec_backend_cli_test.cpp golden_test_support.cpp LABELS "exec;cli")
target_compile_definitions(exec_backend_cli_test PRIVATE MOECHECK_PYTHON3="${MOECHECK_PYTHON3}")
add_dependencies(exec_backend_cli_test moecheck)
