# The molt CLI end to end:
#   cli_real  against a real molt process (tests/runtime's program)
#   cli_fake  against a fake one (tests/protocol's test_control --serve: the
#             real control server with a scripted runtime behind it)
molt_pytest(cli_real ${CMAKE_CURRENT_LIST_DIR}/test_cli_real.py TIMEOUT 300 LABELS cli
  ENV TEST_RUNTIME=$<TARGET_FILE:test_runtime> PATCH_DIR=${CMAKE_CURRENT_BINARY_DIR}/runtime)
molt_pytest(cli_fake ${CMAKE_CURRENT_LIST_DIR}/test_cli_fake.py TIMEOUT 300 LABELS cli
  ENV MOLT_TEST_CONTROL=$<TARGET_FILE:protocol_test_control>)
