# The molt CLI against a real molt process (tests/runtime's program).
find_package(Python3 COMPONENTS Interpreter REQUIRED)
add_test(NAME cli_real
  COMMAND ${Python3_EXECUTABLE} -m pytest --noconftest -q -p no:cacheprovider
          ${CMAKE_CURRENT_LIST_DIR}/test_cli_real.py)
set_tests_properties(cli_real PROPERTIES TIMEOUT 300 LABELS "cli"
  ENVIRONMENT "MOLT_CLI=$<TARGET_FILE:molt-cli>;TEST_RUNTIME=$<TARGET_FILE:test_runtime>;PATCH_DIR=${CMAKE_CURRENT_BINARY_DIR}/runtime")
